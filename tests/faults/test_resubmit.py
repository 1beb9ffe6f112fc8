"""A job a scheduler starts again: the same command with ``trainer.resume=auto`` and a fixed run dir,
its driver and every Ray process of it killed with SIGKILL twice (a lost node, an OOM kill), ends
with every step trained once and the same metrics and weights as a run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "model=tiny",
    "env=keyword",
    "rollout.max_new_tokens=12",
    "rollout.group_size=4",
    "trainer.groups_per_step=2",
    "trainer.val_every=0",
    "logger.progress=false",
    "learner.lr=1e-4",
    "trainer.total_steps=5",
    "trainer.ckpt_every=2",
    "trainer.keep_checkpoints=5",
    "trainer.resume=auto",
]
COMPARED = ("rollout/reward", "rollout/response_tokens", "learner/loss", "policy/entropy", "learner/grad_norm")


def _cmd(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *ARGS,
        f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={run_dir}/hydra",
    ]


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _kill_tree_after(run_dir: Path, step: int) -> str:
    """Start the job, SIGKILL it with every process it started once ``step`` is in metrics.jsonl."""
    proc = subprocess.Popen(
        _cmd(run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    t0 = time.time()
    while not any(r["step"] >= step for r in _steps(run_dir)):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before step {step}:\n{proc.stdout.read()[-3000:]}")
        assert time.time() - t0 < 600, f"no step {step} within 600 s"
        time.sleep(0.1)
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = proc.communicate(timeout=60)[0]
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    hf = run_dir / "checkpoints" / "step_000005" / "hf"
    return load_file(str(next(hf.glob("*.safetensors"))))


def test_a_run_killed_twice_and_started_again_with_resume_auto_equals_an_uninterrupted_run(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = subprocess.run(_cmd(ref_dir), capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert "trainer.resume=auto: no checkpoint" in ref.stderr

    _kill_tree_after(run_dir, 3)  # checkpoint at 2; step 3 trained and logged, never saved
    assert [r["step"] for r in _steps(run_dir)][-1] >= 3
    _kill_tree_after(run_dir, 4)  # continues from 2, trains 3 and 4 (saved), killed
    last = subprocess.run(_cmd(run_dir), capture_output=True, text=True, timeout=900)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "trainer.resume=auto: continuing from" in last.stderr

    got, want = _steps(run_dir), _steps(ref_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4, 5]
    for a, b in zip(got, want):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    superseded = [json.loads(x)["step"] for x in (run_dir / "metrics.superseded.jsonl").read_text().splitlines()]
    assert 3 in superseded  # the step trained after the first kill's checkpoint, kept aside
    wa, wb = _weights(run_dir), _weights(ref_dir)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the final weights differ from the uninterrupted run's"
