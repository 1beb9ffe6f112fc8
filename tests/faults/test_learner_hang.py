"""The learner's real process is stopped (SIGSTOP: it answers nothing and does not die, as a
wedged collective or a hung node would) during a real run through the public entry point: after
``learner.call_timeout_s`` the run stops with an error naming the learner rank that did not
answer and how to resume, instead of hanging, and the checkpoint it had made survives."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_actor_restart import _launch, _steps

from lab.faults import actor_pid

pytestmark = pytest.mark.integration

TIMEOUT_S = 20
ARGS = [
    "model=tiny",
    "env=keyword",
    "trainer.total_steps=50",
    "trainer.groups_per_step=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "trainer.val_every=0",
    "trainer.ckpt_every=2",
    "logger.progress=false",
    "learner.precision=fp32",
    "rollout.precision=fp32",
    f"learner.call_timeout_s={TIMEOUT_S}",
]


def test_a_learner_that_stops_answering_ends_the_run_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(ARGS, run_dir)
    pid = None
    try:
        t0 = time.time()
        while len(_steps(run_dir / "metrics.jsonl")) < 2 or (pid := actor_pid(proc.pid, "LearnerActor")) is None:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() - t0 < 600, "step 2 never came"
            time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.time()
        _, err = proc.communicate(timeout=TIMEOUT_S + 240)
        waited = time.time() - stopped_at
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "LearnerHung" in err, err[-4000:]
    assert f"learner.call_timeout_s={TIMEOUT_S} s" in err and "trainer.resume=RUN_DIR" in err, err[-4000:]
    assert "no answer from learner rank 0" in err or "learner rank 0 made no weight packet" in err, err[-4000:]
    assert waited >= TIMEOUT_S  # it waited the timeout, then stopped (the run had 50 steps to go)
    assert len(_steps(run_dir / "metrics.jsonl")) < 50
    assert (run_dir / "checkpoints" / "step_000002" / "controller.pt").exists()
