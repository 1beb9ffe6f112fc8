"""Sync vs async pipeline benchmark: the same workload at max_policy_lag=0 and =1.

    python scripts/bench/sync_async.py [--model tiny|smollm2_135m] [--env keyword|alfworld]
                                       [--steps 6] [--warmup 1] [--out DIR] [extra hydra overrides...]

Prints one JSON object: per mode, mean seconds per step, rollout seconds per step (the groups'
generation time), learner seconds per step, rollout and learner tokens/s; and the ratios
``async_over_sync`` (step time) and ``async_over_bound`` = async step time / max(rollout time,
learner time) per step (1.0 = perfect overlap; the target is <= 1.15). Steps before ``--warmup``
are excluded (JIT, first generate). Timings on a shared 2-core machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from lab.bench import Bench, add_out
from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose


def summarise(history: list[dict], warmup: int, groups_per_step: int, workers: int) -> dict:
    rows = history[warmup:] or history
    mean = lambda k: statistics.fmean(h.get(k, 0.0) for h in rows)  # noqa: E731
    rollout_s = mean("rollout/group_seconds") * groups_per_step / workers
    return {
        "step_s": mean("time/step_s"),
        "rollout_s_per_step": rollout_s,
        "learner_s_per_step": mean("time/train_s"),
        "rollout_tokens_per_s": mean("rollout/tokens_per_s"),
        "learner_tokens_per_s": mean("learner/tokens_per_s"),
        "learner_idle_frac": mean("time/learner_idle_frac"),
        "policy_lag_mean": mean("lag/mean"),
    }


def table(out: dict) -> list[dict]:
    rows = []
    for lag in (0, 1):
        r = out[f"lag{lag}"]
        bound = max(r["rollout_s_per_step"], r["learner_s_per_step"])
        rows.append(
            {
                "max_policy_lag": lag,
                "s / step": f"{r['step_s']:.2f}",
                "rollout s / step": f"{r['rollout_s_per_step']:.2f}",
                "learner s / step": f"{r['learner_s_per_step']:.2f}",
                "rollout tokens / s": f"{r['rollout_tokens_per_s']:.1f}",
                "learner tokens / s": f"{r['learner_tokens_per_s']:.1f}",
                "learner idle fraction": f"{r['learner_idle_frac']:.2f}",
                "mean policy lag": f"{r['policy_lag_mean']:.2f}",
                "vs lag 0": f"{r['step_s'] / out['lag0']['step_s']:.2f}x",
                "step / max(rollout, learner)": f"{r['step_s'] / bound:.2f}",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--env", default="keyword")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    add_out(ap)
    args, extra = ap.parse_known_args()
    bench = Bench.start(args.out)  # the code the runs use, read before they start
    base = [
        f"model={args.model}",
        f"env={args.env}",
        f"trainer.total_steps={args.steps}",
        "trainer.val_every=0",
        "trainer.ckpt_every=0",
        "logger.progress=false",
        *extra,
    ]
    out = {"command": bench.command, "model": args.model, "env": args.env, "steps": args.steps, "overrides": extra}
    for lag in (0, 1):
        cfg = compose(base + [f"trainer.max_policy_lag={lag}"])
        with tempfile.TemporaryDirectory() as d:
            hist = run_training(cfg, d)
        out[f"lag{lag}"] = summarise(hist, args.warmup, cfg.trainer.groups_per_step, cfg.rollout.num_workers)
    s, a = out["lag0"], out["lag1"]
    out["async_over_sync"] = a["step_s"] / s["step_s"]
    out["async_over_bound"] = a["step_s"] / max(a["rollout_s_per_step"], a["learner_s_per_step"])
    print(json.dumps(out, indent=1))
    bench.store(out, table(out), base)


if __name__ == "__main__":
    main()
