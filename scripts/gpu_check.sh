#!/usr/bin/env bash
# The whole pipeline on one GPU machine in one prepared run (or on CPU with the tiny model: --cpu,
# what CI runs so that this check cannot rot between GPU runs).
#
#   scripts/gpu_check.sh [--cpu] [--budget SECONDS] [--stage DIR] [--phases train,bench]
#   OUT=DIR scripts/gpu_check.sh ...     # results (default ./gpu_check_out)
#
# Here only the environment: the interpreter (--cpu: the checkout's venv; else the machine's
# python3, whose torch is the GPU's; PYTHON=... overrides either), the caches, and the checkout on
# PYTHONPATH (the GPU machine gets a copy of the tree, nothing installed). The phases, the report
# (OUT/report.txt, OUT/gpu_check.tar.gz) and the exit status (0, 1, 3 for an incomplete payload)
# are scripts/gpu_check.py's `run`: its docstring says what each phase checks.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CPU=0
for arg in "$@"; do [[ $arg == --cpu ]] && CPU=1; done
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)  # scratch: the caches below, the random model; removed at the end

if [[ $CPU == 1 ]]; then
  PY=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3)}
  export PRIVY_CACHE=${PRIVY_CACHE:-$ROOT/.cache/privy-rl}
else
  PY=${PYTHON:-$(command -v python3)}
  export PRIVY_CACHE=${PRIVY_CACHE:-$WORK/cache}
  export DS_ACCELERATOR=cuda
fi
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled \
  RAY_USAGE_STATS_ENABLED=0 VLLM_USE_FLASHINFER_SAMPLER=0
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$WORK/torch_extensions}
# The checkout's packages and its lab (scripts/lab, imported as `lab`), uninstalled.
export PYTHONPATH="$ROOT:$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"

exec "$PY" scripts/gpu_check.py run --work "$WORK" "$@"
