"""Memory under a slow learner: does anything grow with the number of steps?

    python scripts/bench/memory.py [--steps 50] [--lag 1] [--throttle-learner 0.9] [extra hydra overrides...]

A real run (tiny model, keyword task) whose learner is made several times slower than its
rollouts: micro-batches of 64 tokens and a k3 KL to a reference model (a second forward). Rollouts
are one short turn. ``--throttle-learner F`` also keeps the learner's process stopped (SIGSTOP) a
fraction F of the time (``scripts/lab/faults.py``), 1 / (1 - F) times slower again. A sampler
thread reads the resident memory of the driver and of every process
it started (the Ray actors), once a second. Prints one JSON object:

* the learner/rollout time ratio actually reached;
* per process kind (driver, learner, rollout worker, Ray itself), the unique memory (USS) at the
  first and last tenth of the run and the least-squares slope in MB per step over the second half;
* the largest number of groups admitted but not yet trained (the buffer's bound is
  ``(max_policy_lag + 1) * groups_per_step``) and the largest policy lag of a trained group.

Run it alone on the machine (other load changes the ratio, not the memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from lab.bench import Bench, add_out
from lab.faults import Throttle, actor_pid
from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose


def kind(cmdline: list[str]) -> str:
    title = " ".join(cmdline)
    for cls, name in (("LearnerActor", "learner"), ("RolloutWorker", "rollout"), ("TeacherScorer", "scorer")):
        if title.startswith(f"ray::{cls}"):
            return name
    return "ray"


class Sampler(threading.Thread):
    def __init__(self, metrics: Path):
        super().__init__(daemon=True)
        self.metrics, self.rows, self.stop = metrics, [], threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self.stop.wait(1.0):
            step = len(self.metrics.read_text().splitlines()) if self.metrics.exists() else 0
            # USS: memory only this process holds. RSS would also count the pages of Ray's shared
            # object store a consumer maps when it reads a weight packet, which grow until the
            # store evicts them and say nothing about a leak.
            rss = {"driver": me.memory_full_info().uss}
            for p in me.children(recursive=True):
                try:
                    k = kind(p.cmdline())
                    rss[k] = rss.get(k, 0) + p.memory_full_info().uss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.rows.append((step, rss))


def slope(points: list[tuple[int, float]]) -> float:
    if len(points) < 2 or len({s for s, _ in points}) < 2:
        return 0.0
    mx, my = statistics.fmean(s for s, _ in points), statistics.fmean(v for _, v in points)
    return sum((s - mx) * (v - my) for s, v in points) / sum((s - mx) ** 2 for s, _ in points)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lag", type=int, default=1)
    ap.add_argument(
        "--throttle-learner",
        type=float,
        default=0.0,
        metavar="F",
        help="keep the learner stopped this fraction of the time (0 = never)",
    )
    add_out(ap)
    args, extra = ap.parse_known_args()
    bench = Bench.start(args.out)  # the code measured, read before it runs
    with tempfile.TemporaryDirectory(prefix="privy-bench-memory-") as d:
        report = {"command": bench.command, **measure(Path(d), args, extra)}
    print(json.dumps(report, indent=1))
    rows = [
        {
            "process": kind,
            "USS MB, first tenth": f"{m['first_tenth']:.0f}",
            "USS MB, last tenth": f"{m['last_tenth']:.0f}",
            "MB / step, second half": f"{m['mb_per_step_second_half']:.3f}",
            "steps": report["steps"],
            "learner / rollout time": f"{report['learner_over_rollout_s']:.1f}x",
            "groups in flight, max (bound)": f"{report['groups_in_flight_max']} ({report['in_flight_bound']})",
            "policy lag, max": report["policy_lag_max"],
        }
        for kind, m in report["uss_mb"].items()
    ]
    bench.store(
        report, rows, [f"steps={args.steps}", f"lag={args.lag}", f"throttle_learner={args.throttle_learner}", *extra]
    )


def measure(run_dir: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    cfg = compose(
        [
            "model=tiny",
            "env=keyword",
            f"trainer.total_steps={args.steps}",
            "trainer.groups_per_step=2",
            f"trainer.max_policy_lag={args.lag}",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "trainer.val_every=0",
            "trainer.ckpt_every=0",
            "logger.progress=false",
            "learner.micro_batch_tokens=64",
            "learner.kl_coef=0.05",
            "learner.precision=fp32",
            "rollout.precision=fp32",
            *extra,
        ]
    )
    sampler = Sampler(run_dir / "metrics.jsonl")
    sampler.start()
    throttle = Throttle(lambda: actor_pid(os.getpid(), "LearnerActor"), stopped=args.throttle_learner)
    if args.throttle_learner > 0:
        throttle.start()
    t0 = time.time()
    try:
        run_training(cfg, run_dir)
    finally:
        if throttle.is_alive():
            throttle.stop()
    sampler.stop.set()
    sampler.join()
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    learner_s = statistics.fmean(h["time/train_s"] for h in history[1:])
    rollout_s = statistics.fmean(h["rollout/group_seconds"] for h in history[1:])
    kinds = sorted({k for _, rss in sampler.rows for k in rss})
    n = len(sampler.rows)
    out = {
        "steps": len(history),
        "seconds": time.time() - t0,
        "samples": n,
        "throttle_learner": args.throttle_learner,
        "throttle_cycles": throttle.cycles,
        "learner_over_rollout_s": learner_s / max(rollout_s, 1e-9),
        "groups_in_flight_max": max(h["buffer/admitted"] - h["buffer/consumed"] for h in history),
        "in_flight_bound": (args.lag + 1) * cfg.trainer.groups_per_step,
        "policy_lag_max": max(h["rollout/policy_lag_max"] for h in history),
        "uss_mb": {},
    }
    for k in kinds:
        pts = [(s, rss.get(k, 0) / 2**20) for s, rss in sampler.rows]
        tenth = max(1, n // 10)
        out["uss_mb"][k] = {
            "first_tenth": statistics.fmean(v for _, v in pts[:tenth]),
            "last_tenth": statistics.fmean(v for _, v in pts[-tenth:]),
            "mb_per_step_second_half": slope([p for p in pts if p[0] >= args.steps // 2]),
        }
    return out


if __name__ == "__main__":
    main()
