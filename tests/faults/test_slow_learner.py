"""A learner made 10x slower than its rollouts (its real process stopped with SIGSTOP for 90% of
the time, as a throttled or swapping node would be) during a real run through the public entry
point: the buffer never holds more groups than its admission bound, the rollout side waits instead
of running ahead, no trained group is older than ``trainer.max_policy_lag``, and the run finishes.
Memory over a long run at this ratio is measured by ``scripts/bench/memory.py --throttle-learner``."""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_actor_restart import _launch, _steps

from lab.faults import Throttle, actor_pid

pytestmark = pytest.mark.integration

STEPS, GROUPS, LAG = 10, 2, 1
ARGS = [
    "model=tiny",
    "env=keyword",
    f"trainer.total_steps={STEPS}",
    f"trainer.groups_per_step={GROUPS}",
    f"trainer.max_policy_lag={LAG}",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.precision=fp32",
    "rollout.precision=fp32",
]


def test_a_learner_10x_slower_than_rollouts_keeps_the_buffer_and_the_lag_bounded(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(ARGS, run_dir)
    throttle = Throttle(lambda: actor_pid(proc.pid, "LearnerActor"), stopped=0.9)
    throttle.start()
    try:
        _, err = proc.communicate(timeout=900)
    finally:
        throttle.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    assert throttle.cycles >= 10, "the learner was hardly throttled: the test measured nothing"
    rows = _steps(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # Admission lets (version + LAG + 1) * GROUPS groups start. A step's row is logged after it
    # consumed (step) * GROUPS groups and before its own weights (version = step) are published,
    # so at that moment at most LAG * GROUPS groups are started and not yet trained.
    ahead = [r["buffer/admitted"] - r["buffer/consumed"] for r in rows]
    assert max(ahead) <= LAG * GROUPS, ahead
    assert max(ahead) == LAG * GROUPS, f"the rollouts never got ahead of the slowed learner: {ahead}"
    assert all(r["rollout/policy_lag_max"] <= LAG for r in rows), [r["rollout/policy_lag_max"] for r in rows]
    # Waiting, not playing: the rollout side idles most of each step while the learner crawls.
    idle = sorted(r["time/rollout_idle_frac"] for r in rows[1:])
    assert idle[len(idle) // 2] > 0.5, idle
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
