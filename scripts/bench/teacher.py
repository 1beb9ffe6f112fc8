"""Where the self-teacher's forward runs: a scorer actor vs the rollout engine, measured side by side.

    python scripts/bench/teacher.py [--steps 6] [--out DIR] [extra hydra overrides...]
    # e.g. --out docs/results/teacher_placement

The same seeded run twice, one after the other in this process (Ray shut down between them), with
``scorer.placement=actor`` (a ``TeacherScorerWorker`` holding its own copy of the policy, sent the
weights every step) and ``scorer.placement=engine`` (the rollout worker's HF engine scores on the
weights it samples with). Default workload: SDAR with hints (``method=sdar_hints``) on the keyword
task, SmolLM2-135M at the CPU's native precision, 2 groups x 4 episodes per step, lag 0. Per side,
over the steps after the first (which pays for JIT and caches):

- seconds per step (median), the learner's wait for the teacher (``time/wait_teacher_s``: scoring
  that did not overlap the learner) and the teacher's own seconds per step (``teacher/seconds``);
- the unique memory (USS, MB) of each kind of process at its peak (driver, learner, rollout
  worker, scorer, Ray's own), sampled once a second, and the peak of the actors' sum (learner,
  rollout workers, scorer; Ray's own processes vary from one start to the next);
- the weight consumers per step (rollout workers, plus the scorer on the actor route) and the
  bytes of one weight packet (``sync/bytes``);
- the teacher's signal and noise floor (``teacher/gap_abs_mean``, ``noise/gap_abs_mean``); with
  bf16 the two runs' samples may part after the first update, so per-token log-probs are not
  compared here (``tests/integration/test_methods_tiny.py`` compares them on fp32 runs).

Run it alone on the machine: another load changes the seconds, not the memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab.bench import Bench, add_out
from pipeline.core.runtime_env import set_process_env

set_process_env()

# scripts/bench/memory.py, beside this script; it imports Ray, hence after the environment is set
from memory import Sampler  # noqa: E402

WORKLOAD = [
    "model=smollm2_135m",
    "env=keyword",
    "method=sdar_hints",
    "trainer.groups_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=32",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "trainer.val_at_start=false",
    "trainer.final_val_splits=[]",
    "logger.progress=false",
]
KINDS = ("driver", "learner", "rollout", "scorer", "ray")
ACTORS = ("learner", "rollout", "scorer")


def run_side(placement: str, steps: int, extra: list[str], run_dir: Path) -> dict:
    import ray

    from pipeline.orchestration.run import run_training
    from pipeline.tools.cli import compose

    cfg = compose([*WORKLOAD, f"trainer.total_steps={steps}", f"scorer.placement={placement}", *extra])
    sampler = Sampler(run_dir / "metrics.jsonl")
    sampler.start()
    t0 = time.time()
    try:
        history = run_training(cfg, run_dir)
    finally:
        sampler.stop.set()
        sampler.join()
        ray.shutdown()
    timed = history[1:] or history
    peak = {k: max((rss.get(k, 0) for _, rss in sampler.rows), default=0) / 2**20 for k in KINDS}
    median = statistics.median
    return {
        "placement": placement,
        "steps": len(history),
        "seconds": time.time() - t0,
        "step_s": median(h["time/step_s"] for h in timed),
        "wait_teacher_s": median(h["time/wait_teacher_s"] for h in timed),
        "teacher_s": median(h.get("teacher/seconds", 0.0) for h in timed),
        "peak_uss_mb": peak,
        # the actors only: Ray's own processes (idle workers, agents) vary from one start to the next
        "peak_uss_actors_mb": max((sum(rss.get(k, 0) for k in ACTORS) for _, rss in sampler.rows), default=0) / 2**20,
        "weight_consumers": cfg.rollout.num_workers + (1 if placement == "actor" else 0),
        "packet_bytes": timed[-1].get("sync/bytes"),
        "signal": statistics.fmean(h["teacher/gap_abs_mean"] for h in history),
        "noise_floor": statistics.fmean(h["noise/gap_abs_mean"] for h in history),
        "rows_scored_frac": min(h["teacher/rows_scored_frac"] for h in history),
    }


def table(sides: list[dict]) -> list[dict]:
    base = sides[0]
    rows = []
    for s in sides:
        m = s["peak_uss_mb"]
        rows.append(
            {
                "scorer.placement": s["placement"],
                "s / step (median)": f"{s['step_s']:.2f}",
                "learner waits for teacher, s / step": f"{s['wait_teacher_s']:.2f}",
                "teacher s / step": f"{s['teacher_s']:.2f}",
                "peak USS MB: rollout / scorer / learner": " / ".join(
                    f"{m[k]:.0f}" for k in ("rollout", "scorer", "learner")
                ),
                "peak USS MB, the actors together": f"{s['peak_uss_actors_mb']:.0f}",
                "vs actor route": f"{s['peak_uss_actors_mb'] / max(base['peak_uss_actors_mb'], 1e-9):.2f}x",
                "weight copies sent / step": str(s["weight_consumers"]),
                "signal / noise floor (mean abs gap)": f"{s['signal']:.4f} / {s['noise_floor']:.4f}",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    add_out(ap)
    args, extra = ap.parse_known_args()
    bench = Bench.start(args.out)  # the code the runs use, read before they start
    sides = []
    with tempfile.TemporaryDirectory(prefix="privy-bench-teacher-") as d:
        for placement in ("actor", "engine"):
            print(f"teacher: scorer.placement={placement} ...", file=sys.stderr, flush=True)
            sides.append(run_side(placement, args.steps, extra, Path(d) / placement))
    report = {
        "command": bench.command,
        "workload": [*WORKLOAD, f"trainer.total_steps={args.steps}", *extra],
        "sides": sides,
    }
    print(json.dumps(report, indent=1))
    bench.store(report, table(sides), report["workload"])


if __name__ == "__main__":
    main()
