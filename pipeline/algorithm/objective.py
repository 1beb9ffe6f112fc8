"""The learner's objective on one micro-batch: one forward, then every term the batch carries.

    loss = policy_loss_coef * L_policy - entropy_coef * H + kl_coef * KL_ref + sum_k coef_k * L_k

``L_policy``, ``H`` and ``KL_ref`` are token means over the policy's tokens of the whole
mini-batch (``Denominators.policy``), the aux terms ``L_k`` over all its response tokens
(``Denominators.total``): the losses of a mini-batch's micro-batches add up to the full-batch
objective, however the rows are cut (``pipeline/algorithm/losses.py``). This module is what the
learner runs between ``forward`` and ``backward``; it never knows which method built the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipeline.algorithm.aux_losses import LossInputs, aux_loss, loss_spec
from pipeline.algorithm.logprobs import ResponseForward, forward_response
from pipeline.algorithm.losses import entropy_bonus, kl_to_reference, policy_loss
from pipeline.algorithm.metrics import Metrics, Stat, mean
from pipeline.core.schema import LearnerConfig
from pipeline.core.types import TrainBatch


@dataclass(frozen=True)
class Denominators:
    """token_mean's denominators for one mini-batch (over all data-parallel ranks, divided by the
    world size because DeepSpeed averages gradients across ranks)."""

    total: Tensor  # every response token (with the rows left out for a zero loss)
    policy: Tensor  # the policy's tokens (demonstration rows are no policy's samples)
    kept: Tensor  # the policy's tokens in the batch over all of them (the entropy metric's share)


def denominators(batch: TrainBatch, all_reduce: Callable[[Tensor], Tensor], world_size: int) -> Denominators:
    """``all_reduce`` sums over the ranks (the identity on one)."""
    mask_sum = batch.response_mask.sum()
    policy = batch.distill.policy_mask
    policy_sum = (batch.response_mask * policy).sum() if policy is not None else mask_sum
    extra = mask_sum.new_tensor(batch.extra_loss_tokens)
    counts = all_reduce(torch.stack([mask_sum, extra, policy_sum]))
    return Denominators(
        total=(counts[0] + counts[1]) / world_size,
        policy=(counts[2] + counts[1]) / world_size,
        kept=(counts[2] / (counts[2] + counts[1])).clamp_min(1e-12),
    )


def micro_batch_objective(
    model: nn.Module,
    mb: TrainBatch,
    den: Denominators,
    cfg: LearnerConfig,
    *,
    temperature: float,
    proximal: Tensor | None = None,
    ref_model: nn.Module | None = None,
    teacher_logits: Callable[[TrainBatch], Tensor] | None = None,
    forward: Callable[..., ResponseForward] = forward_response,
) -> tuple[Tensor, dict[str, Metrics]]:
    """The micro-batch's loss (with grad) and its metrics by prefix (``policy``, each aux term's
    name, ``learner``). ``proximal``: the learner's log-probs before the step's first update
    (None: this forward's own, detached); ``teacher_logits``: the learner-side teacher forward of
    a loss spec with ``teacher_forward`` (targeted guidance's full KL); ``forward``: how the rows
    are forwarded (``forward_response``, or ``forward_shared`` through their common prefixes: the
    same numbers)."""
    needs_logits = any(loss_spec(t.kind).needs_logits for t in mb.aux_terms)
    fw = forward(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.response_mask,
        temperature=temperature,
        with_entropy=True,
        with_logits=needs_logits,
    )
    lp, mask, d = fw.logprobs, mb.response_mask, mb.distill
    pmask = mask * d.policy_mask if d.policy_mask is not None else mask
    proximal = lp.detach() if proximal is None else proximal
    pg, m = policy_loss(
        lp,
        mb.behaviour_logprobs,
        mb.advantages,
        pmask,
        den.policy,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
        correction=cfg.correction,
        proximal_logprobs=proximal,
        behaviour_cap=cfg.behaviour_cap,
    )
    loss = mb.policy_loss_coef * pg
    ent, em = entropy_bonus(fw.entropy, pmask, den.policy)
    m.update({k: Stat(v.value / den.kept, v.reduce) for k, v in em.items()})
    loss = loss - mb.entropy_coef * ent
    if ref_model is not None:
        with torch.no_grad():
            ref = forward(
                ref_model, mb.input_ids, mb.attention_mask, mask, temperature=temperature, with_entropy=False
            ).logprobs
        kl, km = kl_to_reference(lp, ref, pmask, den.policy)
        loss = loss + cfg.kl_coef * kl
        m.update({f"ref_{k}": v for k, v in km.items()})
    parts: dict[str, Metrics] = {"policy": m}
    needs_teacher = any(loss_spec(t.kind).teacher_forward for t in mb.aux_terms)
    inputs = LossInputs(
        logprobs=lp,
        mask=mask,
        n_tokens_total=den.total,
        proximal_logprobs=proximal,
        input_ids=mb.input_ids,
        teacher_logprobs=d.teacher_logprobs,
        distill_mask=d.distill_mask,
        student_logits=fw.logits,
        teacher_logits=teacher_logits(mb) if needs_teacher else None,
        topk_ids=d.topk_ids,
        topk_teacher_logprobs=d.topk_teacher_logprobs,
    )
    for term in mb.aux_terms:
        term_loss, am = aux_loss(inputs, term)
        loss = loss + term.coef * term_loss
        parts[term.name] = am
    parts["learner"] = {"loss": mean(loss)}
    return loss, parts
