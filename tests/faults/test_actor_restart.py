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

from lab.faults import actor_pid

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
ARGS = [
    "model=tiny",
    "env=keyword",
    "method=sdar",
    f"trainer.total_steps={STEPS}",
    "trainer.groups_per_step=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.precision=fp32",
    "rollout.precision=fp32",
    "scorer.precision=fp32",
]


def _launch(args: list[str], run_dir: Path) -> subprocess.Popen:
    """The public entry point in a session of its own (killable as a group), stderr captured."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args, f"trainer.run_dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _steps(metrics: Path) -> list[dict]:
    return [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []


def _kill_when(proc, metrics: Path, cls: str, after_step: int, timeout: float = 600) -> int:
    t0 = time.time()
    while True:
        assert proc.poll() is None, f"the run ended before {cls} was killed:\n{proc.communicate()[1][-3000:]}"
        assert time.time() - t0 < timeout, f"step {after_step} never came"
        if len(_steps(metrics)) >= after_step:
            pid = actor_pid(proc.pid, cls)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return pid
        time.sleep(0.1)


@pytest.mark.extended
def test_killed_rollout_worker_and_scorer_are_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(ARGS, run_dir)
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


def _stop_when(proc, metrics: Path, cls: str, after_step: int, timeout: float = 600) -> int:
    t0 = time.time()
    while len(_steps(metrics)) < after_step or (pid := actor_pid(proc.pid, cls)) is None:
        assert proc.poll() is None, f"the run ended before {cls} was stopped:\n{proc.communicate()[1][-3000:]}"
        assert time.time() - t0 < timeout, f"step {after_step} never came"
        time.sleep(0.1)
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_a_hung_rollout_worker_and_a_hung_scorer_are_killed_restarted_and_their_work_done_again(tmp_path):
    """An actor that hangs (here its process stopped with SIGSTOP: it answers nothing, it does not
    die) is killed after its timeout and restarted by Ray, and its work is done again: the
    worker's group replayed, the scorer's groups scored again. The run finishes every step
    instead of waiting forever."""
    run_dir = tmp_path / "run"
    args = [*ARGS, "rollout.group_timeout_s=15", "scorer.timeout_s=15"]
    proc = _launch(args, run_dir)
    try:
        metrics = run_dir / "metrics.jsonl"
        _stop_when(proc, metrics, "RolloutWorker", after_step=2)
        _stop_when(proc, metrics, "TeacherScorerWorker", after_step=5)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    assert [r["step"] for r in _steps(metrics)] == list(range(1, STEPS + 1))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    restarts = [(e["actor"], e["cause"]) for e in events if e["event"] == "restart"]
    assert [a for a, _ in restarts] == ["rollout worker 0", "teacher scorer"], events
    assert "rollout.group_timeout_s=15" in restarts[0][1] and "scorer.timeout_s=15" in restarts[1][1], events
    # The hung worker's group was played again; the scorer's groups were scored again, not replayed.
    assert [e["actor"] for e in events if e["event"] == "replay"] == ["rollout worker 0"], events


@pytest.mark.extended  # `make test` keeps test_sync_receiver's killed receiver on the collective route
def test_with_the_collective_weight_sync_a_dead_worker_rejoins_a_new_weight_group(tmp_path):
    """A torch.distributed group cannot take a restarted process back: the controller forms a new
    group with the new process in it (learner rank 0 and every consumer), broadcasts the current
    weights, replays the lost group, and the run finishes every step (a death inside the broadcast
    itself: tests/faults/test_sync_receiver.py)."""
    run_dir = tmp_path / "run"
    args = [a for a in ARGS if not a.startswith("method=")] + [
        "method=sdar",
        "cluster.weight_sync=collective",
        "cluster.sync_timeout_s=60",
    ]
    proc = _launch(args, run_dir)
    try:
        _kill_when(proc, run_dir / "metrics.jsonl", "RolloutWorker", after_step=3)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    rows = _steps(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["sync/version"] == STEPS and rows[-1]["faults/restarts"] == 1
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [(e["event"], e.get("actor")) for e in events if e["event"] in ("restart", "weight_group_reformed")]
    assert kinds == [("restart", "rollout worker 0"), ("weight_group_reformed", "rollout worker 0")], events


def test_a_worker_killed_with_no_restarts_left_stops_the_run_with_a_checkpoint_of_the_last_step(tmp_path):
    """``cluster.max_restarts=0``: the real worker's process SIGKILLed after step 2; Ray will not
    restart it, so the run stops naming it, after checkpointing the last completed step (the
    learner is fine), and says how to resume."""
    run_dir = tmp_path / "run"
    args = [a for a in ARGS if not a.startswith(("method=", "trainer.total_steps="))]
    proc = _launch([*args, "method=grpo", "cluster.max_restarts=0", "trainer.total_steps=50"], run_dir)
    try:
        _kill_when(proc, run_dir / "metrics.jsonl", "RolloutWorker", after_step=2)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-4000:]
    steps = [r["step"] for r in _steps(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]:06d}"
    assert "rollout worker 0 died and Ray will not restart it (cluster.max_restarts used up)" in err, err[-3000:]
    assert f"checkpoint at step {steps[-1]}: resume with trainer.resume={run_dir}" in err
