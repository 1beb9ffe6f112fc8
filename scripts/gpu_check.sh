#!/usr/bin/env bash
# GPU smoke check on one CUDA machine that already has torch (CUDA build) installed.
#
#   scripts/gpu_check.sh            # report to ./gpu_report.txt
#   OUT=/some/dir scripts/gpu_check.sh
#
# 1. Installs the wheels shipped in the tree under .whl/ (if any) with
#    `pip install --no-index --no-deps .whl/*.whl` (no network needed); scripts/gpu_wheels.sh
#    fills .whl/ on a machine that reaches PyPI (docs/gpu.md: the run of 2026-12-04).
# 2. Runs `pytest -m gpu tests/gpu -x` with the project on PYTHONPATH (the project itself is not
#    pip-installed: that would let pip re-resolve torch).
# 3. Writes ${OUT:-.}/gpu_report.txt: nvidia-smi line, torch / CUDA / NCCL / DeepSpeed /
#    transformers versions, missing modules, the test summary; the full pytest log is beside it
#    (gpu_pytest.log). Everything is bounded to finish within 10 minutes.
# Exit status: pytest's (0 = all passed or skipped), 3 if no CUDA device is visible to torch
# (GPU_CHECK_FORCE=1 runs the tests anyway: they skip, which checks this script itself).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/gpu_report.txt"
LOG="$OUT_DIR/gpu_pytest.log"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
PYTEST_TIMEOUT="${GPU_CHECK_PYTEST_TIMEOUT:-480}"   # seconds; the rest of the 10 minutes is setup
T0=$(date +%s)

export DS_ACCELERATOR=cuda           # tests/conftest.py only defaults it (to cpu)
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PRIVY_CACHE="${PRIVY_CACHE:-$ROOT/.cache/privy-rl}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"

{
  echo "privy-rl gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
} > "$REPORT"

# 1. Wheels shipped in the tree.
shopt -s nullglob
WHEELS=(.whl/*.whl)
shopt -u nullglob
if [[ ${#WHEELS[@]} -gt 0 ]]; then
  if timeout 120 "$PY" -m pip install -q --no-index --no-deps "${WHEELS[@]}" > "$OUT_DIR/gpu_pip.log" 2>&1; then
    echo "wheels: installed ${#WHEELS[@]} from .whl/" >> "$REPORT"
  else
    echo "wheels: pip install of .whl/*.whl FAILED (see gpu_pip.log): $(tail -n 1 "$OUT_DIR/gpu_pip.log")" >> "$REPORT"
  fi
else
  echo "wheels: none in .whl/" >> "$REPORT"
fi

# 2. The machine and the stack.
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "nvidia-smi: $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 4 | paste -sd ';')" >> "$REPORT"
else
  echo "nvidia-smi: not found" >> "$REPORT"
fi
timeout 120 "$PY" - >> "$REPORT" 2>&1 <<'EOF'
import importlib, sys
print(f"python: {sys.version.split()[0]} ({sys.executable})")
try:
    import torch
    print(f"torch: {torch.__version__}, cuda {torch.version.cuda}, available {torch.cuda.is_available()}, "
          f"devices {torch.cuda.device_count()}")
    if torch.cuda.is_available():
        print(f"device 0: {torch.cuda.get_device_name(0)}, capability {torch.cuda.get_device_capability(0)}, "
              f"bf16 {torch.cuda.is_bf16_supported()}")
        print(f"nccl: {'.'.join(map(str, torch.cuda.nccl.version()))}")
except Exception as e:  # noqa: BLE001
    print(f"torch: import failed: {e!r}")
missing = []
for mod, needed in (("deepspeed", 1), ("transformers", 1), ("safetensors", 1), ("pytest", 1),
                    ("ray", 0), ("hydra", 0), ("vllm", 0)):
    try:
        m = importlib.import_module(mod)
        print(f"{mod}: {getattr(m, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        missing.append(f"{mod}{'' if needed else ' (optional here)'} ({type(e).__name__}: {e})"[:160])
print("missing: " + ("; ".join(missing) if missing else "none"))
EOF

if [[ "${GPU_CHECK_FORCE:-0}" != 1 ]] &&
   ! timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "result: NO CUDA DEVICE visible to torch; tests not run" >> "$REPORT"
  cat "$REPORT"
  exit 3
fi

# 3. The GPU tests.
timeout -k 10 "$PYTEST_TIMEOUT" "$PY" -m pytest -m gpu tests/gpu -x -q -rA -p no:cacheprovider \
  > "$LOG" 2>&1
RC=$?
{
  if [[ $RC -eq 124 || $RC -eq 137 ]]; then echo "pytest: TIMED OUT after ${PYTEST_TIMEOUT} s"; fi
  echo "pytest exit: $RC"
  echo "tests:"
  grep -E '^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)' "$LOG" | sed 's/^/  /'
  echo "summary: $(grep -E '(passed|failed|skipped|error)' "$LOG" | tail -n 1)"
  if [[ $RC -ne 0 ]]; then
    echo "first error lines:"
    grep -E '^E ' "$LOG" | head -n 15 | sed 's/^/  /'
  fi
  echo "seconds: $(( $(date +%s) - T0 ))"
} >> "$REPORT"
cat "$REPORT"
exit $RC
