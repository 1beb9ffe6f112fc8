"""Hydra multirun with the joblib launcher (``hydra/launcher=parallel``) on a running Ray cluster.

A separately started head node (2 CPUs, no dashboard, free ports, its own temp dir) stands in for
the cluster. The 2-point sweep runs its points as two processes of the driver; each joins the
cluster (``cluster=existing``-style address) and asks for 1 CPU, so Ray runs both at once on the
2-CPU cluster. The test checks both points trained, the sweep summary was written, and the points
overlapped (each started before the other finished: an ordering of events, not a duration).
The test stops only the process tree it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from local_ray import cluster_env, ray_head

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
SWEEP_TIMEOUT = 600


@pytest.fixture(scope="module")
def ray_head_address():
    """A 2-CPU head node without dashboard; yields its GCS address."""
    with ray_head(num_cpus=2) as head:
        yield head.address


def test_joblib_sweep_runs_its_points_at_once_on_the_shared_cluster(ray_head_address, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "hydra/launcher=parallel",
        "hydra.launcher.n_jobs=2",
        "cluster=existing",
        f"cluster.address={ray_head_address}",
        "model=tiny",
        "env=keyword",
        "trainer.total_steps=1",
        "trainer.val_every=0",
        "trainer.ckpt_every=0",
        "rollout.max_new_tokens=8",
        "rollout.group_size=2",
        "trainer.groups_per_step=1",
        "logger.progress=false",
        "rollout.num_cpus=0.5",
        "learner.num_cpus=0.5",  # 1 CPU per point: both fit at once
        "trainer.seed=0,1",
        f"hydra.sweep.dir={sweep}",
    ]
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=tmp_path,
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=SWEEP_TIMEOUT,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "Joblib.Parallel(n_jobs=2" in out  # the joblib launcher ran the sweep
    points = [sweep / "0_seed=0", sweep / "1_seed=1"]  # named in each joblib worker like in the driver
    for p in points:
        assert (p / "summary.json").exists(), out[-6000:]
        assert json.loads((p / "sweep_point.json").read_text())["status"] == "done"
        assert (p / "metrics.jsonl").read_text().count("\n") == 1
    assert "| seed |" in (sweep / "sweep_summary.md").read_text()
    # config.yaml is written when a point starts, summary.json when it ends: each point started
    # before the other ended, so they ran side by side on the cluster.
    start = [(p / "config.yaml").stat().st_mtime for p in points]
    end = [(p / "summary.json").stat().st_mtime for p in points]
    assert start[0] < end[1] and start[1] < end[0], (start, end)
