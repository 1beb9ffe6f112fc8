"""A non-finite loss or gradient discards the whole optimizer update (issue 13 item 4) in every
optimizer the learner can run: the plain torch AdamW of fp32 ZeRO-0, DeepSpeed's bf16 wrapper and
ZeRO 1-3. The real DeepSpeed learner (tiny model, a LearnerActor in Ray) takes a step whose batch
holds a NaN advantage: its weights stay bit-identical, and its next good step lands exactly where
a learner that never saw the bad batch lands (no optimizer state, step count or lr schedule moved)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest
import torch
from test_learner_step import _batch

from actors.handles import LearnerGroup
from pipeline.core.config import LearnerConfig

pytestmark = pytest.mark.integration

TIMEOUT = 300


def _steps(ray, model_dir, cfg: LearnerConfig, batches) -> tuple[list[dict], list[dict]]:
    """One fresh rank-0 learner takes one train_step per batch; (metrics, weights) after each."""
    from actors.learner_actor import LearnerActor

    actor = (
        ray.remote(LearnerActor)
        .options(num_cpus=0.5)
        .remote(
            cfg,
            str(model_dir),
            temperature=1.0,
            total_steps=4,
            rank=0,
            world_size=1,
            seed=0,
            master_addr="127.0.0.1",
            threads=1,
        )
    )
    group = LearnerGroup([actor], pad_id=0)
    metrics, weights = [], []
    try:
        ray.get(actor.ping.remote(), timeout=TIMEOUT)
        weights.append(ray.get(actor.weight_packet.remote(0), timeout=TIMEOUT).state_dict)
        for i, b in enumerate(batches):
            metrics.append(asyncio.run(asyncio.wait_for(group.train_step([b]), TIMEOUT)))
            weights.append(ray.get(actor.weight_packet.remote(i + 1), timeout=TIMEOUT).state_dict)
        return metrics, weights
    finally:
        ray.kill(actor)


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


CASES = [(0, "fp32"), (0, "bf16"), (1, "fp32"), (2, "bf16"), (3, "fp32")]


@pytest.mark.parametrize("zero_stage,precision", CASES, ids=[f"zero{z}-{p}" for z, p in CASES])
def test_a_nan_advantage_discards_the_update_and_leaves_no_trace(ray_local, tiny_model_dir, zero_stage, precision):
    good, _ = _batch(tiny_model_dir, [(6, 10), (6, 7), (6, 12)])
    adv = good.advantages.clone()
    adv[1, 8] = float("nan")
    bad = replace(good, advantages=adv)
    # A cosine schedule: a skipped update that advanced it would change the next step's lr.
    cfg = LearnerConfig(
        precision=precision, zero_stage=zero_stage, lr=1e-3, lr_schedule="cosine", micro_batch_tokens=4096
    )
    m_skip, w_skip = _steps(ray_local, tiny_model_dir, cfg, [bad, good])
    m_ref, w_ref = _steps(ray_local, tiny_model_dir, cfg, [good])
    assert m_skip[0]["learner/skipped_updates"] == 1 and m_skip[0]["learner/nonfinite_microbatches"] == 1
    assert "learner/grad_norm" not in m_skip[0]
    assert _same(w_skip[0], w_skip[1]), "the discarded update moved the weights"
    assert m_skip[1]["learner/skipped_updates"] == 0 and math.isfinite(m_skip[1]["learner/grad_norm"])
    assert m_skip[1]["learner/lr"] == m_ref[0]["learner/lr"]
    assert not _same(w_skip[2], w_skip[1]), "the good step after it did not train"
    assert _same(w_skip[2], w_ref[1]), "the discarded update left optimizer state behind"
