"""A receiver killed in the middle of a real collective weight broadcast (SIGKILL of the rollout
worker's process while the learner is inside ``broadcast_weights``): the broadcast fails on the
learner, Ray restarts the worker, a new weight group is formed around it, the same version is
broadcast again, and the run finishes every step (issue 13 item 3)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.tools.faults import Throttle, actor_pid
from test_actor_restart import ARGS, STEPS, _steps

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _title(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return ""


def test_a_receiver_killed_mid_broadcast_rejoins_and_the_broadcast_is_repeated(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in ARGS if not a.startswith("method=")] + ["method=grpo", "cluster.weight_sync=collective",
                                                              "cluster.sync_timeout_s=60"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *args, f"trainer.run_dir={run_dir}"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    throttle = None
    try:
        metrics = run_dir / "metrics.jsonl"
        t0 = time.time()
        while len(_steps(metrics)) < 1:
            assert proc.poll() is None and time.time() - t0 < 600, "step 1 never came"
            time.sleep(0.1)
        learner, worker = actor_pid(proc.pid, "LearnerActor"), actor_pid(proc.pid, "RolloutWorker")
        # A receiver stopped most of the time keeps the learner inside its broadcast for long
        # enough to be seen there (a tiny model's broadcast takes milliseconds otherwise).
        throttle = Throttle(lambda: worker, stopped=0.9, period=0.5)
        throttle.start()
        while not _title(learner).startswith("ray::LearnerActor.broadcast_weights"):
            assert proc.poll() is None and time.time() - t0 < 600, "no broadcast was seen"
            time.sleep(0.002)
        os.kill(worker, signal.SIGKILL)
        throttle.stop()
        _, err = proc.communicate(timeout=900)
    finally:
        if throttle is not None:
            throttle.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    rows = _steps(metrics)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and rows[-1]["sync/version"] == STEPS
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    # The death surfaced in the broadcast: it was retried on a re-formed group, nothing replayed.
    assert kinds.count("sync_retry") == 1 and kinds.count("restart") == 1, events
    assert kinds.index("sync_retry") < kinds.index("restart") < kinds.index("weight_group_reformed"), events
