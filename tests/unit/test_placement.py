"""Placement planning (pipeline/distributed/placement.py) and the GPU cluster configs (conf/cluster/gpu_*.yaml).

The plan is pure: bundles and per-actor resources from the config, or a ConfigError naming what to
change. Nothing here starts Ray (the integration test test_placement_local.py does).
"""

from __future__ import annotations

import pytest

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.distributed.placement import (
    ActorPlacement,
    PlacementError,
    Reservation,
    check_gpus,
    check_launch_gpus,
    plan_placement,
)
from pipeline.tools.cli import compose


def _cfg(
    placement="pack", colocate=False, m=2, n=2, lc=1.0, lg=0.0, rc=1.0, rg=0.0, scorer_gpus=0.0, engine="hf", tp=1
) -> PrivyConfig:
    cfg = PrivyConfig()
    cfg.cluster.placement, cfg.cluster.colocate, cfg.scorer.num_gpus = placement, colocate, scorer_gpus
    cfg.learner.num_learners, cfg.learner.num_cpus, cfg.learner.num_gpus = m, lc, lg
    cfg.rollout.num_workers, cfg.rollout.num_cpus, cfg.rollout.num_gpus = n, rc, rg
    cfg.rollout.engine, cfg.rollout.vllm.tensor_parallel_size = engine, tp
    return cfg


# ----- bundles -------------------------------------------------------------------------------------
def test_disaggregated_pack_has_a_bundle_per_actor_learners_first():
    plan = plan_placement(_cfg(m=2, n=3, lc=1, lg=1, rc=2, rg=1, engine="vllm"), with_scorer=False)
    assert plan.strategy == "PACK"
    assert plan.bundles == [{"CPU": 1, "GPU": 1}] * 2 + [{"CPU": 2, "GPU": 1}] * 3
    assert [a.bundle for a in plan.learners] == [0, 1]
    assert [a.bundle for a in plan.rollouts] == [2, 3, 4]
    assert plan.learners[0] == ActorPlacement(1, 1, 0)
    assert plan.scorer is None
    assert plan.gpus == 5


def test_spread_strategy_and_zero_resources_are_left_out_of_bundles():
    plan = plan_placement(_cfg(placement="spread", lc=0.5, rc=0.25), with_scorer=False)
    assert plan.strategy == "SPREAD"
    assert plan.bundles == [{"CPU": 0.5}] * 2 + [{"CPU": 0.25}] * 2  # no "GPU: 0" entries
    assert plan.gpus == 0


def test_colocated_pairs_share_a_bundle_that_reserves_a_whole_gpu():
    plan = plan_placement(_cfg(colocate=True, m=3, n=3, lc=1, lg=0.5, rc=2, rg=0.5), with_scorer=False)
    assert plan.strategy == "STRICT_PACK"
    assert plan.bundles == [{"CPU": 3, "GPU": 1}] * 3
    assert [a.bundle for a in plan.learners] == [a.bundle for a in plan.rollouts] == [0, 1, 2]
    assert plan.learners[0].num_gpus == 0.5 and plan.rollouts[0].num_gpus == 0.5
    # Fractions below one still reserve the whole GPU: two pairs never share one.
    small = plan_placement(_cfg(colocate=True, lg=0.25, rg=0.25), with_scorer=False)
    assert small.bundles == [{"CPU": 2, "GPU": 1}] * 2
    spread = plan_placement(_cfg(placement="spread", colocate=True, lg=0.5, rg=0.5), with_scorer=False)
    assert spread.strategy == "SPREAD"


def test_colocated_on_cpus_only_shares_cpu_bundles():
    plan = plan_placement(_cfg(colocate=True, lc=0.5, rc=0.5), with_scorer=False)
    assert plan.bundles == [{"CPU": 1.0}] * 2


def test_scorer_gets_a_bundle_only_when_it_asks_for_gpus():
    with_gpu = plan_placement(_cfg(lg=1, rg=1, engine="vllm", scorer_gpus=1), with_scorer=True)
    assert with_gpu.bundles[-1] == {"GPU": 1}
    assert with_gpu.scorer == ActorPlacement(0.0, 1, 4)
    assert with_gpu.gpus == 5
    without = plan_placement(_cfg(), with_scorer=True)
    assert len(without.bundles) == 4 and without.scorer == ActorPlacement(0.0, 0.0, None)
    colocated = plan_placement(_cfg(colocate=True, lg=0.5, rg=0.5, scorer_gpus=1), with_scorer=True)
    assert colocated.bundles == [{"CPU": 2, "GPU": 1}] * 2 + [{"GPU": 1}]
    assert colocated.scorer.bundle == 2


def test_placement_none_makes_no_group_and_keeps_the_actors_own_requests():
    plan = plan_placement(_cfg(placement="none", m=1, n=2, lg=1, rg=1, engine="vllm", scorer_gpus=1), with_scorer=True)
    assert plan.strategy is None and plan.bundles == []
    assert all(a.bundle is None for a in [*plan.learners, *plan.rollouts, plan.scorer])
    assert plan.gpus == 4
    opts = Reservation(plan).learner(0)
    assert opts == {"num_cpus": 1, "num_gpus": 1}  # no scheduling_strategy: Ray's default
    assert Reservation(plan_placement(_cfg(placement="none"), with_scorer=False)).rollout(0) == {"num_cpus": 1}


# ----- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(colocate=True, m=2, n=3), "learner.num_learners = rollout.num_workers"),
        (dict(colocate=True, lg=0.75, rg=0.5), "learner.num_gpus + rollout.num_gpus = 0.75 + 0.5 > 1"),
        (dict(colocate=True, lg=0.5, rg=0.5, engine="vllm", tp=2), "tensor_parallel_size=2"),
        (dict(lg=2), "learner.num_gpus=2: a learner rank drives one GPU"),
        (dict(lg=0.5, m=2), "Duplicate GPU detected"),
        (dict(engine="vllm", rg=1, tp=2), "rollout.num_gpus=1 but rollout.vllm.tensor_parallel_size=2"),
        (dict(engine="vllm", rg=0.5, tp=2), "needs 2 whole GPUs per engine"),
        (dict(lc=0, lg=0), "a learner rank asks for no CPU and no GPU"),
        (dict(rc=0, rg=0), "a rollout engine asks for no CPU and no GPU"),
        (dict(colocate=True, lc=0, rc=0), "a colocated learner + rollout pair asks for no CPU"),
    ],
)
def test_impossible_combinations_fail_with_what_to_change(kw, needle):
    with pytest.raises(ConfigError) as e:
        plan_placement(_cfg(**kw), with_scorer=False)
    assert needle in str(e.value)


def test_one_learner_may_take_a_fraction_of_a_gpu():
    plan = plan_placement(_cfg(m=1, lg=0.5), with_scorer=False)
    assert plan.bundles[0] == {"CPU": 1, "GPU": 0.5}


def test_asking_more_gpus_than_exist_says_what_was_asked_and_had():
    plan = plan_placement(_cfg(lg=1, rg=1, engine="vllm"), with_scorer=False)
    check_gpus(plan, 4, "the cluster")  # exactly enough
    with pytest.raises(PlacementError) as e:
        check_gpus(plan, 3, "the cluster")
    assert "asks for 4 GPUs" in str(e.value) and "the cluster has 3" in str(e.value)
    with pytest.raises(PlacementError) as e:
        check_gpus(plan, 0, "the local Ray")
    assert "learner.num_gpus=0 rollout.num_gpus=0" in str(e.value)
    assert isinstance(e.value, ConfigError)  # the CLI prints it as a one-line config error


def test_local_launch_without_gpus_fails_when_gpus_are_asked():
    import ray
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    cfg = _cfg(placement="none", lg=1)
    # Before ray.init the machine's CUDA devices count; after it (an earlier test's local Ray)
    # the Ray's own resources: neither has a GPU here.
    with pytest.raises(PlacementError, match="but the local Ray.* has 0"):
        check_launch_gpus(cfg, plan_placement(cfg, with_scorer=False))
    if not ray.is_initialized():
        # Joining a cluster this process is not connected to yet: checked later, once Ray is up.
        cfg.cluster.address = "auto"
        check_launch_gpus(cfg, plan_placement(cfg, with_scorer=False))


# ----- the conf/cluster/gpu_* configs ------------------------------------------------------------
def test_gpu_1x8_config_is_four_learners_three_engines_and_the_scorer_on_eight_gpus():
    cfg = compose(["cluster=gpu_1x8"])
    assert cfg.cluster.address == "auto" and cfg.rollout.engine == "vllm"
    plan = plan_placement(cfg, with_scorer=True)
    assert plan.strategy == "PACK" and plan.gpus == 8
    assert len(plan.learners) == 4 and len(plan.rollouts) == 3 and plan.scorer.num_gpus == 1
    assert cfg.learner.zero_stage == 2 and cfg.learner.num_gpus == 1
    assert plan_placement(cfg, with_scorer=False).gpus == 7


@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_multinode", "gpu_colocated"])
def test_gpu_configs_run_the_teacher_scorer_on_a_gpu_in_bf16(cluster):
    from pipeline.core.hardware import choose_precision

    cfg = compose([f"cluster={cluster}", "method=sdar"])
    assert cfg.scorer.num_gpus == 1 and plan_placement(cfg, with_scorer=True).scorer.num_gpus == 1
    assert choose_precision(cfg.scorer.precision, "cuda", cuda_bf16=True).dtype == "bf16"


def test_gpu_multinode_config_spreads_sixteen_gpus():
    cfg = compose(["cluster=gpu_multinode"])
    plan = plan_placement(cfg, with_scorer=True)
    assert plan.strategy == "SPREAD" and plan.gpus == 16


def test_gpu_colocated_config_shares_each_gpu_and_sleeps_vllm():
    cfg = compose(["cluster=gpu_colocated"])
    assert cfg.cluster.colocate and cfg.rollout.vllm.enable_sleep_mode
    plan = plan_placement(cfg, with_scorer=True)
    assert plan.strategy == "STRICT_PACK" and plan.gpus == 8 and len(plan.bundles) == 8


def test_gpu_configs_combine_with_the_paper_experiment_and_submit_sh_order():
    # submit.sh puts cluster=existing first; a later cluster= choice wins.
    cfg = compose(["cluster=existing", "cluster=gpu_1x8", "+experiment=alfworld_paper", "method=sdar"])
    plan = plan_placement(cfg, with_scorer=True)
    assert plan.gpus == 8 and cfg.cluster.placement == "pack" and cfg.learner.lr == 1e-6


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["cluster=gpu_colocated", "rollout.num_workers=4"], "learner.num_learners = rollout.num_workers"),
        (["cluster=gpu_colocated", "learner.num_gpus=0.75"], "> 1"),
        (
            ["cluster=gpu_colocated", "rollout.vllm.tensor_parallel_size=2", "rollout.vllm.in_process=false"],
            "tensor_parallel_size=2",
        ),
        (
            ["cluster=gpu_1x8", "rollout.vllm.tensor_parallel_size=2", "rollout.vllm.in_process=false"],
            "rollout.num_gpus=1 but rollout.vllm.tensor_parallel_size=2",
        ),
        (["cluster=gpu_1x8", "learner.num_gpus=0.5"], "Duplicate GPU detected"),
        (["cluster=gpu_multinode", "learner.num_gpus=2"], "a learner rank drives one GPU"),
    ],
)
def test_bad_gpu_config_overrides_are_config_errors(overrides, needle):
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as e:
        plan_placement(cfg, with_scorer=False)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["cluster=gpu_1x8", "cluster.placement=none", "cluster.colocate=true"], "cluster.colocate=true needs"),
        (["cluster.placement=tight"], "cluster.placement='tight'"),
        (["cluster.placement_timeout_s=0"], "placement_timeout_s must be > 0"),
    ],
)
def test_invalid_cluster_values_fail_validation(overrides, needle):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert needle in str(e.value)


def test_check_launch_refuses_gpus_on_a_local_ray_without_them():
    import ray
    import torch

    from pipeline.orchestration.launch import check_launch

    if torch.cuda.is_available() or (ray.is_initialized() and ray.cluster_resources().get("GPU")):
        pytest.skip("needs a machine without CUDA")
    cfg = compose(["model=tiny", "env=keyword", "learner.num_gpus=1"])
    with pytest.raises(PlacementError, match="asks for 1 GPUs"):
        check_launch(cfg)
