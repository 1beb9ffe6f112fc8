"""A run that diverges (learner.lr=1e30: after one update the weights are ~1e30 and every
gradient is non-finite) through the public entry point: each non-finite update is discarded and
recorded, and ``trainer.max_skipped_steps`` of them in a row stop the run with a checkpoint and a
one-line cause; resuming from that checkpoint continues the step counter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "model=tiny",
    "env=keyword",
    "trainer.total_steps=12",
    "trainer.groups_per_step=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.precision=fp32",
    "rollout.precision=fp32",
    "learner.lr=1e30",
]


def _train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *ARGS, f"trainer.run_dir={run_dir}", *extra],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_non_finite_updates_are_skipped_then_the_run_stops_with_a_resumable_checkpoint(tmp_path):
    run = tmp_path / "run"
    r = _train(run)
    assert r.returncode != 0
    assert "stopping the run: 3 training steps in a row (up to step 4) had non-finite" in r.stderr, r.stderr[-3000:]
    rows = _rows(run / "metrics.jsonl")
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    assert [m["learner/skipped_updates"] for m in rows] == [0, 1, 1, 1]
    assert rows[-1]["faults/skipped_steps"] == 3
    skips = [e for e in _rows(run / "events.jsonl") if e["event"] == "skip"]
    assert [(e["step"], e["in_a_row"]) for e in skips] == [(2, 1), (3, 2), (4, 3)]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000004"

    # The checkpoint resumes (same step counter); the weights are still diverged, so the resumed
    # run, with a fresh allowance of 3, stops again three steps later.
    again = _train(run, f"trainer.resume={run}", "trainer.max_skipped_steps=3")
    assert again.returncode != 0 and "(up to step 7)" in again.stderr, again.stderr[-3000:]
    assert [m["step"] for m in _rows(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6, 7]
    assert _rows(run / "metrics.jsonl")[-1]["faults/skipped_steps"] == 6
