"""What a run's actors are given: torch threads each, a rollout worker's concurrency, and the
line (and ``hardware.json``) that says which precision and threads each one got."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline.core.config import PrivyConfig


def actor_threads(cfg: PrivyConfig) -> int:
    """Torch threads per actor. At lag 0 rollout, scorer and learner take turns (each waits for the
    other), so each gets every core; at lag > 0 rollout workers and learner ranks run at the same
    time and split the cores, so that together they never oversubscribe them."""
    if cfg.cluster.threads_per_actor:
        return cfg.cluster.threads_per_actor
    cores = cfg.cluster.num_cpus or os.cpu_count() or 1
    if cfg.trainer.max_policy_lag == 0:
        return cores
    return max(1, cores // (cfg.rollout.num_workers + cfg.learner.num_learners))


def rollout_concurrency(cfg: PrivyConfig) -> int:
    """Actor threads per rollout worker: one per group it may have in flight (its training loops
    and, at lag > 0 at the same time, its validation tasks), plus a few so that weight calls never
    queue behind groups."""
    w = cfg.rollout.num_workers
    train = -(-(cfg.trainer.max_policy_lag + 1) * cfg.trainer.groups_per_step // w)
    val = -(-cfg.trainer.val_tasks // w)
    return train + val + 4


def report_hardware(run_dir: Path, infos: dict[str, dict]) -> str:
    """One line naming each actor's precision and threads, with the reason; written to
    ``hardware.json`` in the run dir. Warnings (explicit bf16 without native support) follow."""
    (run_dir / "hardware.json").write_text(json.dumps(infos, indent=1))
    parts = [f"{who} {i['precision']} x{i['threads']} threads" for who, i in infos.items()]
    reasons = sorted({i["reason"] for i in infos.values()})
    line = "privy-rl: precision: " + ", ".join(parts) + " (" + "; ".join(reasons) + ")"
    print(line, file=sys.stderr, flush=True)
    for warning in sorted({i["warning"] for i in infos.values() if i.get("warning")}):
        print(f"privy-rl: warning: {warning}", file=sys.stderr, flush=True)
    return line
