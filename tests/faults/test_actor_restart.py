"""A rollout worker and the teacher scorer are killed (SIGKILL of their processes) during a real
run started through the public entry point: Ray restarts each, the controller gives it the
current weights, the lost group is replayed from its task seed, the scorer scores what waited
for it, and the run finishes every step. ``events.jsonl`` records each restart and replay."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
ARGS = ["model=tiny", "env=keyword", "method=sdar", f"trainer.total_steps={STEPS}", "trainer.groups_per_step=1",
        "rollout.group_size=2", "rollout.max_new_tokens=16", "trainer.val_every=0", "trainer.ckpt_every=0",
        "logger.progress=false", "learner.precision=fp32", "rollout.precision=fp32", "scorer.precision=fp32"]


def _steps(metrics: Path) -> list[dict]:
    return [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []


def _actor_pid(driver: int, cls: str) -> int | None:
    """The live process of the Ray actor of class ``cls`` among the driver's descendants (Ray
    titles an actor's process ``ray::<Class>`` or ``ray::<Class>.<method>``)."""
    import psutil

    for p in psutil.Process(driver).children(recursive=True):
        try:
            title = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if title.startswith(f"ray::{cls}") and p.status() != psutil.STATUS_ZOMBIE:
            return p.pid
    return None


def _kill_when(proc, metrics: Path, cls: str, after_step: int, timeout: float = 600) -> int:
    t0 = time.time()
    while True:
        assert proc.poll() is None, f"the run ended before {cls} was killed:\n{proc.communicate()[1][-3000:]}"
        assert time.time() - t0 < timeout, f"step {after_step} never came"
        if len(_steps(metrics)) >= after_step:
            pid = _actor_pid(proc.pid, cls)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return pid
        time.sleep(0.1)


def test_killed_rollout_worker_and_scorer_are_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *ARGS, f"trainer.run_dir={run_dir}"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        metrics = run_dir / "metrics.jsonl"
        rollout_pid = _kill_when(proc, metrics, "RolloutWorker", after_step=1)
        scorer_pid = _kill_when(proc, metrics, "TeacherScorerWorker", after_step=4)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    rows = _steps(metrics)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert sorted(e["actor"] for e in restarts) == ["rollout worker 0", "teacher scorer"], events
    # The rollout worker's lost group (in flight, or its next one on the fresh process) was
    # played again from its seed; nothing else was.
    replays = [e for e in events if e["event"] == "replay"]
    assert [e["actor"] for e in replays] == ["rollout worker 0"], events
    assert rows[-1]["faults/restarts"] == 2 and rows[-1]["faults/replayed_groups"] == 1
    # Every step after the kills trained on complete, teacher-scored groups with fresh weights.
    for r in rows:
        assert r["teacher/rows_scored_frac"] == 1.0, r["step"]
        assert r["rollout/policy_lag_max"] <= 1, r["step"]
    assert "restart: step=" in err and rollout_pid != scorer_pid


def test_with_the_collective_weight_sync_a_dead_worker_stops_the_run_with_its_cause(tmp_path):
    """A restarted process cannot rejoin the torch.distributed weight group: the run stops, never
    hangs, with one line naming the worker and how to resume (docs/reliability.md)."""
    run_dir = tmp_path / "run"
    args = [a for a in ARGS if not a.startswith("method=")] + ["method=grpo", "cluster.weight_sync=collective",
                                                              "cluster.sync_timeout_s=60"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *args, f"trainer.run_dir={run_dir}"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _kill_when(proc, run_dir / "metrics.jsonl", "RolloutWorker", after_step=1)
        t0 = time.time()
        _, err = proc.communicate(timeout=300)
        stopped_in = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    last = [x for x in err.splitlines() if x.startswith("privy-rl: ")][-1]
    assert "rollout worker 0" in last and "resume" in last, err[-3000:]
    assert stopped_in < 120, f"the run took {stopped_in:.0f} s to stop"
