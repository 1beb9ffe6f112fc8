"""One real learner step (DeepSpeed on gloo, tiny model, a LearnerActor in Ray): the step's
metrics are token means over all its mini-batches, and the distillation term's importance weight
is against the learner's own log-probs, so the engine's behaviour log-probs cannot move it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from actors.handles import LearnerGroup
from pipeline.core.config import LearnerConfig
from pipeline.core.microbatch import slice_rows
from pipeline.core.types import AuxTerm, Distill, TrainBatch

pytestmark = pytest.mark.integration

TIMEOUT = 300


def _batch(model_dir, lengths: list[tuple[int, int]], seed: int = 0) -> tuple[TrainBatch, torch.Tensor]:
    """Rows of (prompt, response) lengths; behaviour log-probs = the model's own (and returned)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.algorithm.logprobs import forward_response

    g = torch.Generator().manual_seed(seed)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    T = max(p + r for p, r in lengths)
    B = len(lengths)
    ids = torch.zeros(B, T, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    resp = torch.zeros(B, T)
    for b, (p, r) in enumerate(lengths):
        ids[b, : p + r] = torch.randint(0, vocab, (p + r,), generator=g)
        attn[b, : p + r] = 1
        resp[b, p : p + r] = 1.0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = forward_response(model, ids, attn, resp, with_entropy=False).logprobs
    adv = torch.randn(B, 1, generator=g).expand(B, T) * resp
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=lp.clone(),
        advantages=adv.contiguous(),
        entropy_coef=0.0,
        versions=[0] * B,
    )
    return batch, lp


def _train(ray, model_dir, minibatches: list[TrainBatch], cfg: LearnerConfig):
    """A fresh rank-0 learner takes one train_step; returns (metrics, weights)."""
    from actors.learner_actor import LearnerActor

    actor = (
        ray.remote(LearnerActor)
        .options(num_cpus=0.5)
        .remote(
            cfg,
            str(model_dir),
            temperature=1.0,
            total_steps=10,
            rank=0,
            world_size=1,
            seed=0,
            master_addr="127.0.0.1",
            threads=1,
        )
    )
    try:
        ray.get(actor.ping.remote(), timeout=TIMEOUT)
        metrics = asyncio.run(asyncio.wait_for(LearnerGroup([actor], pad_id=0).train_step(minibatches), TIMEOUT))
        return metrics, ray.get(actor.weight_packet.remote(1), timeout=TIMEOUT).state_dict
    finally:
        ray.kill(actor)


def test_step_metrics_weight_each_mini_batch_by_its_tokens(ray_local, tiny_model_dir):
    # Mini-batch 1: long responses, behaviour = the learner's own log-probs (weight 1).
    # Mini-batch 2: short responses, behaviour 1 nat below (decoupled weight exp(1) capped at 2).
    batch, _ = _batch(tiny_model_dir, [(5, 40), (5, 40), (5, 3), (5, 3)])
    first, second = slice_rows(batch, 0, 2), slice_rows(batch, 2, 4)
    second = replace(second, behaviour_logprobs=(second.behaviour_logprobs - 1.0) * second.response_mask)
    cfg = LearnerConfig(
        precision="fp32", lr=1e-6, correction="decoupled", behaviour_cap=2.0, mini_batches=2, micro_batch_tokens=4096
    )
    metrics, _ = _train(ray_local, tiny_model_dir, [first, second], cfg)
    n1, n2 = first.n_tokens, second.n_tokens
    assert metrics["policy/behaviour_weight_mean"] == pytest.approx((n1 * 1.0 + n2 * 2.0) / (n1 + n2), rel=1e-4)
    assert metrics["learner/tokens"] == n1 + n2


def test_the_distillation_weight_ignores_the_engines_behaviour_logprobs(ray_local, tiny_model_dir):
    batch, lp = _batch(tiny_model_dir, [(6, 12), (6, 9), (6, 14)])
    g = torch.Generator().manual_seed(1)
    teacher = (lp + 0.5 * torch.randn(lp.shape, generator=g)) * batch.response_mask
    distill = replace(
        batch,
        distill=Distill(teacher_logprobs=teacher),
        policy_loss_coef=0.0,
        aux_terms=[AuxTerm(name="opd", kind="k3_is", coef=1.0)],
    )
    # A bf16 engine's log-probs: off by up to 0.3 nats from the learner's own.
    noisy = replace(distill, behaviour_logprobs=(lp + 0.3 * torch.randn(lp.shape, generator=g)) * batch.response_mask)
    cfg = LearnerConfig(precision="fp32", lr=1e-3, correction="none", micro_batch_tokens=4096)
    m_exact, w_exact = _train(ray_local, tiny_model_dir, [distill], cfg)
    m_noisy, w_noisy = _train(ray_local, tiny_model_dir, [noisy], cfg)
    assert m_noisy["opd/rho_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy at the first update
    assert m_noisy["opd/alignment"] == pytest.approx(m_exact["opd/alignment"], abs=1e-6)
    assert m_exact["opd/alignment"] == pytest.approx(
        float(((lp - teacher) * batch.response_mask).sum() / batch.response_mask.sum()), abs=1e-4
    )
    worst = max((w_noisy[k] - w_exact[k]).abs().max().item() for k in w_exact)
    assert worst == 0.0, f"the behaviour log-probs moved the distillation update by {worst:.2e}"


def test_rows_left_out_for_a_zero_advantage_change_no_gradient(ray_local, tiny_model_dir):
    # trainer.skip_zero_advantage_rows: the learner sees 2 of 4 rows; token_mean's denominator
    # still counts the other two (extra_loss_tokens), so the loss and the gradient norm are the
    # whole batch's. Without that count both would be 1.6x too large here.
    from pipeline.orchestration.batches import drop_silent_rows

    batch, _ = _batch(tiny_model_dir, [(5, 12), (5, 20), (5, 16), (5, 8)], seed=3)
    batch.advantages[[1, 2]] = 0.0
    kept = drop_silent_rows(batch)
    assert kept.n_rows == 2 and kept.extra_loss_tokens == 36.0
    cfg = LearnerConfig(precision="fp32", lr=1e-6, correction="none", micro_batch_tokens=4096)
    m_full, _ = _train(ray_local, tiny_model_dir, [batch], cfg)
    m_kept, _ = _train(ray_local, tiny_model_dir, [kept], cfg)
    assert m_kept["learner/tokens"] == 20.0
    assert m_kept["policy/loss"] == pytest.approx(m_full["policy/loss"], rel=1e-4, abs=1e-7)
    assert m_kept["learner/grad_norm"] == pytest.approx(m_full["learner/grad_norm"], rel=1e-4)


def test_the_step_says_where_the_learners_memory_goes(ray_local, tiny_model_dir):
    """fp32 AdamW on one rank: the optimizer holds two moments per parameter, the gradients one
    copy; the peak resident size is above both (the model, the step's activations); and the
    forwards carried every real token once, no padding (learner.unpadded)."""
    batch, _ = _batch(tiny_model_dir, [(7, 9), (5, 3), (9, 12)])
    metrics, _ = _train(ray_local, tiny_model_dir, [batch], LearnerConfig(precision="fp32", lr=1e-6))
    params = metrics["learner/memory/parameters_gb"]
    assert params > 0.0
    assert metrics["learner/memory/gradients_gb"] == pytest.approx(params, rel=0.01)
    assert metrics["learner/memory/optimizer_gb"] == pytest.approx(2 * params, rel=0.01)
    assert metrics["learner/memory/rss_peak_gb"] >= metrics["learner/memory/rss_start_gb"] > 3 * params
    # the shared pages it holds (Ray's object store, on Linux) are a part of its resident size
    assert 0.0 <= metrics["learner/memory/rss_shmem_gb"] < metrics["learner/memory/rss_peak_gb"]
    assert metrics["learner/forwarded_tokens"] == 7 + 9 + 5 + 3 + 9 + 12 and metrics["learner/padding_tokens"] == 0


@pytest.mark.extended  # `make test` stays under 45 min; CI runs the extended part after it
@pytest.mark.parametrize("shared_tokens", [0, 1024])
def test_gradient_checkpointing_gives_the_same_update(ray_local, tiny_model_dir, shared_tokens):
    """Recomputing each layer in backward (learner.gradient_checkpointing: HF's with one row per
    micro-batch, the shared-prefix forward's own layer by layer with shared_tokens) changes only
    when activations exist, not the update: fp32, same loss and weights to 1e-6."""
    batch, _ = _batch(tiny_model_dir, [(7, 9), (5, 3), (9, 12)], seed=4)
    base = LearnerConfig(precision="fp32", lr=1e-3, correction="none", shared_tokens=shared_tokens)
    m_plain, w_plain = _train(ray_local, tiny_model_dir, [batch], base)
    m_ckpt, w_ckpt = _train(ray_local, tiny_model_dir, [batch], replace(base, gradient_checkpointing=True))
    assert m_ckpt["policy/loss"] == pytest.approx(m_plain["policy/loss"], rel=1e-6, abs=1e-9)
    assert m_ckpt["learner/grad_norm"] == pytest.approx(m_plain["learner/grad_norm"], rel=1e-5)
    worst = max((w_ckpt[k] - w_plain[k]).abs().max().item() for k in w_plain)
    assert worst < 1e-6, f"gradient checkpointing moved the update by {worst:.2e}"


@pytest.mark.extended
def test_the_head_in_chunks_gives_the_same_update(ray_local, tiny_model_dir):
    """learner.head_chunk_tokens: the LM head over a few response tokens at a time, recomputed in
    backward, reaches the learner's forward (shared and checkpointed): the same update, fp32."""
    batch, _ = _batch(tiny_model_dir, [(7, 9), (5, 3), (9, 12)], seed=5)
    base = LearnerConfig(precision="fp32", lr=1e-3, correction="none", shared_tokens=1024, gradient_checkpointing=True)
    m_whole, w_whole = _train(ray_local, tiny_model_dir, [batch], base)
    m_chunk, w_chunk = _train(ray_local, tiny_model_dir, [batch], replace(base, head_chunk_tokens=4))
    assert m_chunk["policy/loss"] == pytest.approx(m_whole["policy/loss"], rel=1e-6, abs=1e-9)
    worst = max((w_chunk[k] - w_whole[k]).abs().max().item() for k in w_whole)
    assert worst < 1e-6, f"the chunked head moved the update by {worst:.2e}"


def test_the_bf16_update_in_chunks_is_the_same_update(ray_local, tiny_model_dir):
    """learner.optimizer_chunk_mb: DeepSpeed's bf16 step converts every gradient to fp32 at once;
    in chunks, each chunk's gradients are converted, stepped and dropped before the next. AdamW is
    per element, so two optimizer steps (two mini-batches) give the same bits."""
    batch, _ = _batch(tiny_model_dir, [(7, 9), (5, 3), (9, 12), (6, 8)], seed=6)
    minibatches = [slice_rows(batch, 0, 2), slice_rows(batch, 2, 4)]
    base = LearnerConfig(precision="bf16", lr=1e-3, correction="none", mini_batches=2, grad_clip=0.05)
    m_whole, w_whole = _train(ray_local, tiny_model_dir, minibatches, base)
    m_chunk, w_chunk = _train(ray_local, tiny_model_dir, minibatches, replace(base, optimizer_chunk_mb=0.5))
    assert m_chunk["learner/grad_norm"] == m_whole["learner/grad_norm"] > 0.05  # clipped, the same way
    assert m_chunk["learner/chunked_optimizer_steps"] == 2 and "learner/chunked_optimizer_steps" not in m_whole
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).state_dict()
    assert max((w_whole[k].float() - start[k].float()).abs().max().item() for k in w_whole) > 0
    for k in w_whole:
        assert torch.equal(w_chunk[k], w_whole[k]), k
