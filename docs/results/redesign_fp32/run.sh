#!/bin/bash
# A fixed-seed fp32 run of each method at one commit: $1 = that commit's checkout, $2 = out dir.
# PY: the interpreter (the repo's .venv; the run's code is the checkout's: scripts/train.py at
# 153028b puts its checkout first on sys.path, and PYTHONPATH=$1 keeps the actors on it too).
set -e
PY=${PY:-python}
cd "$1"
for m in grpo sdar targeted_guidance; do
  PYTHONPATH="$1" nice -n 5 "$PY" scripts/train.py model=tiny env=keyword method=$m \
    rollout.max_new_tokens=10 rollout.group_size=3 trainer.groups_per_step=2 trainer.val_every=0 \
    trainer.ckpt_every=0 logger.progress=false learner.lr=1e-4 trainer.total_steps=4 trainer.seed=0 \
    rollout.precision=fp32 scorer.precision=fp32 learner.precision=fp32 \
    trainer.run_dir="$2/$m" > "$2/$m.log" 2>&1 || echo "FAILED $m"
done
