"""The learner's real process SIGKILLed during a real run (an OOM kill, ``kill -9``) while its node
stays up: the run stops within a bounded time, never hangs, with one line naming the learner rank
and the checkpoint to resume from; the next start (``trainer.resume=auto``) continues from it.

Both weight-sync routes: the object store (a rollout worker waiting for the dead learner's weight
packet is failed by Ray with the learner's death, which must not be taken for its own:
tests/unit/test_learner_loss.py) and the collective broadcast (the dead learner's broadcast
fails; its receivers would wait for ``cluster.sync_timeout_s``, 600 s here)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_actor_restart import _kill_when, _launch, _steps
from test_learner_hang import ARGS
from test_stop_signals import train

pytestmark = pytest.mark.integration

BOUND_S = 120  # the learner's node is waited for 30 s (is it lost too?), then the run stops


@pytest.mark.parametrize("sync", ["object_store", pytest.param("collective", marks=pytest.mark.extended)])
def test_a_killed_learner_stops_the_run_naming_the_checkpoint_and_the_next_start_continues(tmp_path, sync):
    run_dir = tmp_path / "run"
    args = [*ARGS, "trainer.resume=auto", f"cluster.weight_sync={sync}", "cluster.sync_timeout_s=600"]
    proc = _launch(args, run_dir)
    metrics = run_dir / "metrics.jsonl"
    try:
        _kill_when(proc, metrics, "LearnerActor", after_step=3)
        killed_at = time.time()
        _, err = proc.communicate(timeout=BOUND_S + 240)
        took = time.time() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-4000:]
    assert took < BOUND_S, f"{took:.0f} s to stop"
    last = [x for x in err.splitlines() if x.startswith("privy-rl: ")][-1]
    assert last.startswith("privy-rl: LearnerLost: learner rank 0 died"), err[-4000:]
    assert "the process ended" in last, last
    saved = 2 * (len(_steps(metrics)) // 2)  # trainer.ckpt_every=2
    assert f"resume from the last checkpoint (step {saved}): trainer.resume={run_dir}" in last, last
    again = train(
        [*[a for a in args if "total_steps" not in a], f"trainer.total_steps={saved + 1}"]
        + [f"trainer.run_dir={run_dir}"],
        tmp_path,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert [r["step"] for r in _steps(metrics)] == list(range(1, saved + 2))
