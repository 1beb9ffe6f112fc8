"""A sweep as a researcher runs it: SDAR beta x lam x seed (2 x 2 x 2) with the tiny model and a
command line of 19 overrides, then the same command again.

The first run trains the 8 points (their directories named after the swept values only), writes
the summary with beta / lam / seed columns, the aggregate over seeds (4 rows of n = 2) and the plot.
Rerunning the command skips all 8 points. Then one point is set back to after its first step (its
step-2 checkpoint and metrics row removed, its record "running", as if the sweep had died there)
and the rerun resumes it from its step-1 checkpoint and trains step 2 again.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [
    "-m",
    "model=tiny",
    "env=keyword",
    "method=sdar",
    "method.beta=1,10",
    "method.lam=0.01,0.1",
    "trainer.seed=0,1",
    "trainer.total_steps=2",
    "trainer.groups_per_step=1",
    "rollout.group_size=2",
    "trainer.val_every=2",
    "trainer.val_tasks=1",
    "trainer.ckpt_every=1",
    "rollout.max_new_tokens=8",
    "learner.precision=fp32",
    "rollout.precision=fp32",
    "scorer.precision=fp32",
    "logger.progress=false",
    "rollout.val_temperatures=[0.0]",
    "sweep.name=sdar_grid",
]
POINTS = [
    f"{n}_beta={b}_lam={lam}_seed={s}"
    for n, (b, lam, s) in enumerate((b, lam, s) for b in ("1", "10") for lam in ("0.01", "0.1") for s in ("0", "1"))
]


def sweep(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *COMMAND],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("grid")
    t0 = time.time()
    r = sweep(cwd)
    print(f"\n8-point sweep: {time.time() - t0:.1f} s")
    assert r.returncode == 0, r.stderr[-6000:]
    return cwd, cwd / "multirun" / "sdar_grid"


def _steps(point: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (point / "metrics.jsonl").read_text().splitlines()]


def test_the_sweep_summarises_by_swept_values_and_a_rerun_skips_every_point(grid):
    cwd, d = grid
    assert len([o for o in COMMAND if "=" in o]) >= 15
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == sorted(POINTS)
    for name in POINTS:
        assert _steps(d / name) == [1, 2]
    with open(d / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {"beta", "lam", "seed", "val/success", "gate_mean", "privilege_gap"} <= set(rows[0])
    assert {(r["beta"], r["lam"], r["seed"]) for r in rows} == {
        (b, lam, s) for b in ("1", "10") for lam in ("0.01", "0.1") for s in ("0", "1")
    }
    assert all(r["status"] == "done" and r["val/success"] != "" for r in rows)
    with open(d / "sweep_summary_aggregate.csv") as f:
        agg = list(csv.DictReader(f))
    assert len(agg) == 4 and all(r["n"] == "2" for r in agg)
    assert "| best | beta | lam | n |" in (d / "sweep_summary.md").read_text()
    assert (d / "sweep_summary.png").stat().st_size > 1000

    before = {n: (d / n / "metrics.jsonl").stat().st_mtime for n in POINTS}
    t0 = time.time()
    again = sweep(cwd)
    print(f"rerun skipping 8 points: {time.time() - t0:.1f} s")
    assert again.returncode == 0, again.stderr[-6000:]
    assert again.stderr.count("finished in an earlier run: skipped") == 8, again.stderr[-6000:]
    assert {n: (d / n / "metrics.jsonl").stat().st_mtime for n in POINTS} == before


def test_a_rerun_resumes_a_point_from_its_checkpoint(grid):
    cwd, d = grid
    point = d / POINTS[5]
    ckpts = point / "checkpoints"
    shutil.rmtree(ckpts / "step_000002")
    (ckpts / "latest").write_text("step_000001")
    metrics = point / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    record = json.loads((point / "sweep_point.json").read_text())
    (point / "sweep_point.json").write_text(json.dumps(dict(record, status="running")))

    t0 = time.time()
    r = sweep(cwd)
    print(f"rerun resuming 1 point: {time.time() - t0:.1f} s")
    assert r.returncode == 0, r.stderr[-6000:]
    assert f"sweep point {POINTS[5]}: resuming from its checkpoint" in r.stderr
    assert r.stderr.count("finished in an earlier run: skipped") == 7
    assert _steps(point) == [1, 2]
    assert (ckpts / "latest").read_text() == "step_000002"
    state = json.loads((point / "sweep_point.json").read_text())
    assert state["status"] == "done" and state["attempts"] == 2
