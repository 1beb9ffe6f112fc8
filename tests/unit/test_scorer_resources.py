"""The teacher scorer's own resources (``scorer.num_cpus`` beside ``scorer.num_gpus``): planned
into its bundle or its actor options, counted at launch, and none by default (it shares a node)."""

from __future__ import annotations

import pytest

from pipeline.core.config import ConfigError, PrivyConfig, validate
from pipeline.distributed.placement import ActorPlacement, Reservation, plan_placement


def _cfg(placement: str, cpus: float, gpus: float = 0.0) -> PrivyConfig:
    cfg = PrivyConfig()
    cfg.cluster.placement, cfg.scorer.num_cpus, cfg.scorer.num_gpus = placement, cpus, gpus
    return cfg


def test_scorer_cpus_reserve_a_bundle_of_their_own():
    plan = plan_placement(_cfg("pack", 2.0), with_scorer=True)
    assert plan.bundles[-1] == {"CPU": 2.0} and plan.scorer == ActorPlacement(2.0, 0.0, len(plan.bundles) - 1)
    assert "1 scorer x {CPU: 2, GPU: 0}" in plan.describe()
    both = plan_placement(_cfg("spread", 1.0, 1.0), with_scorer=True)
    assert both.bundles[-1] == {"CPU": 1.0, "GPU": 1.0} and both.scorer.num_cpus == 1.0


def test_without_a_placement_group_the_scorer_asks_ray_for_its_cpus():
    plan = plan_placement(_cfg("none", 1.5), with_scorer=True)
    assert Reservation(plan).scorer() == {"num_cpus": 1.5}


def test_by_default_the_scorer_reserves_nothing():
    plan = plan_placement(_cfg("pack", 0.0), with_scorer=True)
    assert plan.scorer == ActorPlacement(0.0, 0.0, None) and len(plan.bundles) == 2
    assert Reservation(plan).scorer() == {"num_cpus": 0.0}


def test_a_negative_scorer_cpu_count_is_refused_naming_it():
    with pytest.raises(ConfigError, match="scorer.num_cpus=-1"):
        validate(_cfg("none", -1.0))


def test_the_launch_check_counts_the_scorers_cpus():
    from pipeline.orchestration.launch import check_launch
    from pipeline.tools.cli import compose

    cfg = compose(["model=tiny", "env=keyword", "method=sdar", "cluster.num_cpus=2", "scorer.num_cpus=1.5"])
    with pytest.raises(ConfigError, match="scorer.num_cpus"):
        check_launch(cfg)  # 1 learner + 1 rollout worker + 1.5 for the scorer > 2
    cfg.scorer.placement = "engine"  # no scorer actor: nothing asked for it
    check_launch(cfg)
