"""RetireOPD's two-phase command dies in phase 1 (the whole process group killed with SIGKILL
after phase 1's first checkpoint); ``trainer.resume=RUN_DIR`` continues phase 1 from that
checkpoint, then trains phase 2, through the public entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "model=tiny",
    "env=keyword",
    "method=retire_opd",
    "method.phase1_steps=4",
    "method.window=1",
    "trainer.val_every=1",
    "trainer.val_tasks=2",
    "rollout.val_temperatures=[0.4]",
    "trainer.ckpt_every=2",
    "trainer.total_steps=2",
    "rollout.max_new_tokens=8",
    "rollout.group_size=2",
    "trainer.groups_per_step=1",
    "logger.progress=false",
]


def _steps(metrics: Path) -> list[int]:
    return [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.exists() else []


def test_a_run_killed_in_phase_one_resumes_phase_one_then_trains_phase_two(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *ARGS, f"trainer.run_dir={first}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    latest = first / "phase1_teacher" / "checkpoints" / "latest"
    t0 = time.time()
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < 600, "phase 1 wrote no checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
    proc.wait(timeout=60)
    assert latest.read_text().strip() == "step_000002"
    assert not (first / "checkpoints").exists()  # phase 2 never started

    # Pointing at the first phase itself (the KeyError) resumes the parent run.
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            *ARGS,
            f"trainer.run_dir={second}",
            f"trainer.resume={first / 'phase1_teacher'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(second / "phase1_teacher" / "metrics.jsonl") == [3, 4]  # phase 1 continued at step 3
    teacher = json.loads(
        (second / "phase1_teacher" / "checkpoints" / "step_000004" / "hf" / "teacher.json").read_text()
    )
    assert 0.0 <= teacher["success_rate"] <= 1.0
    assert _steps(second / "metrics.jsonl") == [1, 2]  # then phase 2 trained from the start
    # Phase 2 dying before its first checkpoint: the finished phase 1 is adopted as it is.
    import shutil

    shutil.rmtree(second / "checkpoints")
    third = tmp_path / "third"
    again = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            *ARGS,
            f"trainer.run_dir={third}",
            f"trainer.resume={second}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (third / "phase1_teacher").exists()  # not trained again
    assert _steps(third / "metrics.jsonl") == [1, 2]
