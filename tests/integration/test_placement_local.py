"""A real placement group on the local Ray (CPU bundles): tiny runs through ``run_training``.

Fractional CPUs make every bundle fit the 2-CPU test Ray. The runs check that the plan's group is
created with the right strategy and bundles, that every actor is scheduled into its bundle, that
training goes through it (two learner ranks meeting at rank 0's node IP, not 127.0.0.1), and that
the group is removed when the run ends, so a following run (or sweep point) gets the CPUs back.
"""

from __future__ import annotations

import time

import pytest
import torch

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = pytest.mark.integration

BASE = [
    "model=tiny",
    "env=keyword",
    "rollout.max_new_tokens=8",
    "rollout.group_size=2",
    "trainer.groups_per_step=2",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.lr=1e-4",
    "cluster.threads_per_actor=1",
]


def _capture_reserve(monkeypatch) -> list:
    """Record the Placement that build_actors reserves (and the options it hands out)."""
    import pipeline.distributed.placement as placement

    seen = []
    real = placement.reserve

    def spy(plan, timeout_s):
        p = real(plan, timeout_s)
        seen.append(
            {
                "placement": p,
                "pg_id": p.pg.id.hex() if p.pg else None,
                "learners": [p.learner(r) for r in range(len(plan.learners))],
                "rollouts": [p.rollout(i) for i in range(len(plan.rollouts))],
            }
        )
        return p

    monkeypatch.setattr(placement, "reserve", spy)
    return seen


def _wait_cpus_free(ray, total: float, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= total - 1e-6 or time.monotonic() > deadline:
            return free
        time.sleep(0.5)


@pytest.mark.parametrize(
    "overrides, strategy, bundles",
    [
        # Two learner ranks + one engine in PACK bundles of half a CPU each.
        (
            [
                "cluster.placement=pack",
                "learner.num_learners=2",
                "learner.num_cpus=0.5",
                "rollout.num_cpus=0.5",
                "learner.zero_stage=2",
            ],
            "PACK",
            [{"CPU": 0.5}] * 3,
        ),
        # One colocated learner + engine pair in one STRICT_PACK bundle.
        (
            ["cluster.placement=pack", "cluster.colocate=true", "learner.num_cpus=0.5", "rollout.num_cpus=0.5"],
            "STRICT_PACK",
            [{"CPU": 1.0}],
        ),
    ],
    ids=["pack_2_learners", "colocated"],
)
def test_tiny_run_trains_inside_a_placement_group(ray_local, tmp_path, monkeypatch, overrides, strategy, bundles):
    ray = ray_local
    from ray.util.placement_group import placement_group_table

    seen = _capture_reserve(monkeypatch)
    cfg = compose(BASE + ["trainer.total_steps=2", *overrides])
    history = run_training(cfg, tmp_path)
    assert len(history) == 2
    assert all(torch.isfinite(torch.tensor(h["learner/loss"])) for h in history)

    assert len(seen) == 1 and seen[0]["pg_id"] is not None
    info = placement_group_table()[seen[0]["pg_id"]]
    assert info["strategy"] == strategy
    assert [dict(b) for b in info["bundles"].values()] == bundles
    plan = seen[0]["placement"].plan
    used = [o["scheduling_strategy"].placement_group_bundle_index for o in seen[0]["learners"] + seen[0]["rollouts"]]
    assert used == [a.bundle for a in plan.learners + plan.rollouts]
    assert all(
        o["scheduling_strategy"].placement_group.id.hex() == seen[0]["pg_id"]
        for o in seen[0]["learners"] + seen[0]["rollouts"]
    )

    # The run removed its group: the CPUs are free for whatever runs next.
    assert placement_group_table()[seen[0]["pg_id"]]["state"] == "REMOVED"
    total = ray.cluster_resources()["CPU"]
    assert _wait_cpus_free(ray, total) >= total - 1e-6


def test_a_group_that_cannot_be_placed_fails_with_asked_and_had(ray_local):
    from pipeline.distributed.placement import PlacementError, PlacementPlan, reserve

    plan = PlacementPlan(strategy="STRICT_PACK", bundles=[{"CPU": 2.0}, {"CPU": 2.0}])
    with pytest.raises(PlacementError) as e:
        reserve(plan, timeout_s=3)
    msg = str(e.value)
    assert "could not be placed within 3 s" in msg and "{CPU: 2} x 2" in msg
    assert "the cluster has {CPU: 2" in msg
    # The refused group was removed, not left pending for later runs to trip over.
    from ray.util.placement_group import placement_group_table

    assert all(v["state"] != "PENDING" for v in placement_group_table().values())


def test_asking_for_gpus_on_the_local_ray_without_any_fails_at_launch(ray_local, tmp_path):
    from pipeline.distributed.placement import PlacementError

    if ray_local.cluster_resources().get("GPU"):
        pytest.skip("this Ray has GPUs")
    cfg = compose(BASE + ["trainer.total_steps=1", "learner.num_gpus=1", "cluster.placement=pack"])
    with pytest.raises(PlacementError, match="asks for 1 GPUs .* but the local Ray has 0"):
        run_training(cfg, tmp_path)
