"""Auxiliary (distillation) loss terms: pure functions of one typed ``LossInputs``, each one
``LossSpec``.

The conventions are ``pipeline/algorithm/losses.py``'s (shapes, ``token_mean`` over the whole
mini-batch, metrics as ``Stat``s). Each term is one ``LossSpec`` in ``LOSSES``, looked up by
``AuxTerm.kind`` (``aux_loss``): its function (named as the loss), whether it takes SDAR's gate
(``AuxTerm.gate_beta``), whether the learner must fill the student's logits, whether it runs a
teacher forward itself (``full_kl``), whether the scorer gives the teacher on the student's
support (``topk_rkl``); every list of loss names derives from these specs. Nothing here runs a
model, touches Ray, or knows which method asked for a term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.algorithm.losses import denominator, masked_extreme, token_mean
from pipeline.algorithm.metrics import Metrics, Reduce, Stat, mean, minimum
from pipeline.core.types import AuxTerm


@dataclass(frozen=True, slots=True)
class LossInputs:
    """What an auxiliary loss term may read, filled by the learner once per micro-batch."""

    logprobs: Tensor  # [B, T] current policy at the sampled tokens, with grad
    mask: Tensor  # [B, T] float, 1 on response tokens
    n_tokens_total: Tensor | float  # token_mean's denominator (module docstring)
    proximal_logprobs: Tensor  # [B, T] the learner's log-probs before the step's first update, detached
    input_ids: Tensor | None = None  # [B, T] the tokens (full_kl reads the teacher's log-prob of the sampled one)
    teacher_logprobs: Tensor | None = None  # [B, T] the scorer's lpT (sampled estimators)
    distill_mask: Tensor | None = None  # [B, T] the tokens the term touches (None: every response token)
    student_logits: Tensor | None = None  # [N_resp, V] temperature-scaled (LossSpec.needs_logits)
    teacher_logits: Tensor | None = None  # [N_resp, V] the learner-side teacher's, no grad
    topk_ids: Tensor | None = None  # [B, T, k] the student's support at each position (topk_rkl)
    topk_teacher_logprobs: Tensor | None = None  # [B, T, k] the scorer's lpT at those ids

    @property
    def selected(self) -> Tensor:
        """``mask * distill_mask``: the tokens the term touches."""
        return self.mask if self.distill_mask is None else self.mask * self.distill_mask

    def teacher(self) -> Tensor:
        if self.teacher_logprobs is None:
            raise ValueError("this aux loss needs teacher_logprobs (the scorer's log-probs) in the batch")
        return self.teacher_logprobs.detach()


# --------------------------------------------------------------------------------------------
# Auxiliary (distillation) losses: f(x: LossInputs, **params), each one LossSpec in LOSSES
# --------------------------------------------------------------------------------------------


def sdar_gate(teacher_logprobs: Tensor, logprobs: Tensor, beta: float) -> Tensor:
    """SDAR gate ``g = sg(sigmoid(beta * (lpT - lp)))``, ``# [B, T]``. beta = 0 gives 0.5."""
    return torch.sigmoid(beta * (teacher_logprobs - logprobs)).detach()


def _weight(x: LossInputs, teacher: Tensor, beta: float | None) -> Tensor | float:
    """The per-token weight of a sampled estimator: SDAR's gate with ``beta``, else 1."""
    return 1.0 if beta is None else sdar_gate(teacher, x.logprobs, beta)


def _gap_metrics(x: LossInputs, teacher: Tensor, weight) -> Metrics:
    """Teacher-gap diagnostics over the selected tokens: ``alignment = token_mean(lp_prox - lpT)``
    (RetireOPD's K_n when the mini-batch is the whole step), ``teacher_gap_mean`` (lpT - lp),
    ``negative_gap_fraction`` (lpT < lp), and with a gate ``gate_mean`` / ``gate_active_ratio``."""
    with torch.no_grad():
        sel, n = x.selected, x.n_tokens_total
        gap = teacher - x.logprobs.detach()
        out = {
            "alignment": mean(token_mean(x.proximal_logprobs.detach() - teacher, sel, n)),
            "teacher_gap_mean": mean(token_mean(gap, sel, n)),
            "negative_gap_fraction": mean(token_mean((gap < 0).float(), sel, n)),
        }
        if isinstance(weight, Tensor):
            out["gate_mean"] = mean(token_mean(weight, sel, n))
            out["gate_active_ratio"] = mean(token_mean((weight > 0.5).float(), sel, n))
        return out


def sampled_surrogate(x: LossInputs, *, beta: float | None = None) -> tuple[Tensor, Metrics]:
    """SDAR's sampled-token surrogate (also ``opsd`` and ``grpo_opsd``)::

        w = sg(sigmoid(beta * (lpT - lp)))   (1 without beta)
        L = token_mean(w * (lpT - lp) * distill_mask),   grad L = -token_mean(w * distill_mask * grad lp)

    The gate is computed here from the current policy's log-probs, exactly as SDAR's code.
    """
    teacher = x.teacher()
    w = _weight(x, teacher, beta)
    loss = token_mean(w * (teacher - x.logprobs), x.selected, x.n_tokens_total)
    return loss, {"loss": mean(loss), **_gap_metrics(x, teacher, w)}


def k3_is(x: LossInputs, *, beta: float | None = None) -> tuple[Tensor, Metrics]:
    """K3 estimator with an on-policy importance ratio (RetireOPD OPD loss, SDAR repo
    ``skillsd_utils.py``; also ``skill_sd`` and targeted guidance with estimator ``k3_is``)::

        l   = lp - lpT
        k3  = exp(min(-l, 20)) - 1 + l
        rho = exp(min(lp - lp_prox, 10))         (NOT detached: it carries gradient too)
        L   = token_mean(w * rho * k3 * distill_mask),  w = SDAR's gate with beta, else 1

    ``lp_prox`` (``proximal_logprobs``) is the learner's own log-prob of the token before the
    step's first update, what the released code calls old log-probs (recomputed by the actor),
    never the rollout engine's: an engine/learner mismatch (bf16 engines: 0.05 mean, 0.3 max) or a
    policy lag would otherwise enter rho and dominate the gradient. The lag correction stays in
    the policy loss. Metrics: ``loss``, ``k3_mean``, ``rho_mean`` and the gap metrics.
    """
    teacher = x.teacher()
    sel, n = x.selected, x.n_tokens_total
    ell = x.logprobs - teacher
    k3 = torch.exp((-ell).clamp(max=20.0)) - 1.0 + ell
    rho = torch.exp((x.logprobs - x.proximal_logprobs.detach()).clamp(max=10.0))
    w = _weight(x, teacher, beta)
    loss = token_mean(w * rho * k3, sel, n)
    with torch.no_grad():
        metrics = {
            "loss": mean(loss),
            "k3_mean": mean(token_mean(k3.detach(), sel, n)),
            "rho_mean": mean(token_mean(rho.detach(), sel, n)),
            **_gap_metrics(x, teacher, w),
        }
    return loss, metrics


def full_kl(x: LossInputs) -> tuple[Tensor, Metrics]:
    """Exact reverse KL over the vocabulary on the selected tokens (targeted guidance, ``full_kl``)::

        L_TG = (1 / N_all) * sum_{t: distill_mask_t = 1} KL(pi_theta(.|s_t) || sg mu(.|s_t))
             = (1 / N_all) * sum_t distill_mask_t * sum_v p_t(v) (log p_t(v) - log q_t(v))

    with ``p = softmax(student_logits)``, ``q = softmax(teacher_logits)`` (no gradient) and
    ``N_all = n_tokens_total``: every valid response token of the mini-batch, not only the
    selected ones (the seed's normalisation).

    Learner-facing contract. ``student_logits`` and ``teacher_logits`` are ``# [N_resp, V]``: one
    row per response token of ``mask``, in row-major order of ``mask.nonzero()`` (the order of
    ``pipeline.algorithm.logprobs.forward_response(..., with_logits=True)``), row i holding the
    logits that *predict* that token (model output at position t-1), already divided by the
    rollout temperature. Student rows come from the forward on ``input_ids``; teacher rows from
    the forward (same weights, no grad) on ``teacher_input_ids`` at ``teacher_response_mask``,
    which marks the same response tokens of every row in the same order. The loss is a token sum
    over a global count, so the learner may pass micro-batches or chunks and add the losses.

    Metrics: ``loss``; ``kl`` (= loss); ``selected_fraction`` (selected tokens / N_all), so
    ``kl / selected_fraction`` is the mean KL per selected token; ``alignment`` (the
    learner-side teacher's ``token_mean(lp_prox - lpT)`` over the selected tokens, lpT the
    teacher's log-prob of the sampled token).
    """
    student_logits, teacher_logits = x.student_logits, x.teacher_logits
    if student_logits is None or teacher_logits is None:
        raise ValueError("full_kl needs student_logits and teacher_logits, each [N_resp, V]")
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError(
            f"full_kl: student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must both be [N_resp, V]"
        )
    response = x.mask > 0
    weight = x.selected[response]  # [N_resp]; a boolean select, like the forward's
    if weight.shape[0] != student_logits.shape[0]:
        raise ValueError(
            f"full_kl: {student_logits.shape[0]} logits rows for {weight.shape[0]} response tokens in mask"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # bf16 logits: softmax in fp32
    log_p = torch.log_softmax(student_logits.to(dtype), dim=-1)  # [N_resp, V]
    log_q = torch.log_softmax(teacher_logits.detach().to(dtype), dim=-1)
    kl_per_token = (log_p.exp() * (log_p - log_q)).sum(dim=-1)  # [N_resp]
    # where, not a product: unselected rows may hold anything (e.g. -inf logits) without a nan
    loss = torch.where(weight > 0, weight * kl_per_token, 0.0).sum() / denominator(x.n_tokens_total)
    with torch.no_grad():
        denom = denominator(x.n_tokens_total)
        metrics = {"loss": mean(loss), "kl": mean(loss), "selected_fraction": mean(weight.sum() / denom)}
        if x.input_ids is not None:
            rows, cols = response.nonzero(as_tuple=True)
            lpt = torch.zeros_like(x.mask)
            lpt[rows, cols] = log_q.gather(-1, x.input_ids[rows, cols].unsqueeze(-1)).squeeze(-1).to(lpt.dtype)
            metrics["alignment"] = mean(token_mean(x.proximal_logprobs.detach() - lpt, x.selected, x.n_tokens_total))
    return loss, metrics


def topk_rkl(x: LossInputs) -> tuple[Tensor, Metrics]:
    """The reverse KL on the student's support (estimator ``topk_rkl``)::

        L = (1 / N_all) * sum_t distill_mask_t * sum_{v in S_t} p_t(v) (log p_t(v) - lpT_t(v))

    with ``p = softmax(student_logits)`` (gradient through both p and log p), S_t the student's
    top-k token ids at position t when the scorer ran (``topk_ids``), and ``lpT`` the teacher's
    log-probs there (``topk_teacher_logprobs``, from the scorer: no teacher forward here). It is
    ``full_kl``'s sum cut to S_t, not renormalised: with S_t = the vocabulary it is ``full_kl``
    exactly; what it leaves out is the student's mass outside S_t times its log-ratio there
    (``support_mass`` logs the mass kept; the bias is measured by ``scripts/bench/topk_kl.py``).
    Rows and order as ``full_kl``: ``student_logits`` ``[N_resp, V]`` in row-major order of the
    response positions of ``mask``."""
    if x.student_logits is None or x.topk_ids is None or x.topk_teacher_logprobs is None:
        raise ValueError("topk_rkl needs student_logits [N_resp, V], topk_ids and topk_teacher_logprobs [B, T, k]")
    response = x.mask > 0
    weight = x.selected[response]  # [N_resp]
    ids = x.topk_ids[response]  # [N_resp, k] int64
    if ids.shape[0] != x.student_logits.shape[0]:
        raise ValueError(f"topk_rkl: {x.student_logits.shape[0]} logits rows for {ids.shape[0]} response tokens")
    dtype = torch.promote_types(x.student_logits.dtype, torch.float32)  # bf16 logits: softmax in fp32
    lpt = x.topk_teacher_logprobs[response].detach().to(dtype)  # [N_resp, k]
    log_p = torch.log_softmax(x.student_logits.to(dtype), dim=-1).gather(-1, ids)  # [N_resp, k]
    p = log_p.exp()
    kl_per_token = (p * (log_p - lpt)).sum(-1)  # [N_resp]
    denom = denominator(x.n_tokens_total)
    loss = torch.where(weight > 0, weight * kl_per_token, 0.0).sum() / denom
    with torch.no_grad():
        sel = weight > 0
        kept = p.sum(-1)
        metrics = {
            "loss": mean(loss),
            "kl": mean(loss),
            "selected_fraction": mean(weight.sum() / denom),
            # the student's mass on its support at the selected tokens, averaged like the loss
            "support_mass": mean(torch.where(sel, kept, 0.0).sum() / denom),
        }
        if x.teacher_logprobs is not None:  # as full_kl's: the sampled token's teacher log-prob
            metrics["alignment"] = mean(
                token_mean(x.proximal_logprobs.detach() - x.teacher(), x.selected, x.n_tokens_total)
            )
    return loss, metrics


def nll(x: LossInputs) -> tuple[Tensor, Metrics]:
    """Behaviour cloning: ``token_mean(-log pi(y_t))`` over the selected response tokens (the
    warm start's expert rows, ``pipeline/warm_start``). ``loss`` sums over the micro-batches: on
    one rank it is the mini-batch's per-token NLL."""
    sel = x.selected
    loss = token_mean(-x.logprobs, sel, x.n_tokens_total)
    return loss, {
        "loss": Stat(loss.detach(), Reduce.SUM),
        "logprob_min": minimum(masked_extreme(x.logprobs, sel, False)),
    }


@dataclass(frozen=True)
class LossSpec:
    """One auxiliary loss: the learner asks only this of it."""

    fn: Callable[..., tuple[Tensor, Metrics]]  # f(x: LossInputs[, beta=]) -> (loss, metrics)
    gated: bool = False  # takes SDAR's gate sharpness (``AuxTerm.gate_beta``)
    needs_logits: bool = False  # the learner fills ``LossInputs.student_logits``
    teacher_forward: bool = False  # the learner runs the teacher itself (``teacher_logits``; no scorer)
    teacher_support: bool = False  # the scorer gives the teacher at the student's top-k ids (``topk_*``)
    estimator: bool = True  # a teacher signal's estimator (``method.estimator``); nll is not

    @property
    def name(self) -> str:
        return self.fn.__name__


LOSSES: dict[str, LossSpec] = {
    s.name: s
    for s in (
        LossSpec(sampled_surrogate, gated=True),
        LossSpec(k3_is, gated=True),
        LossSpec(full_kl, needs_logits=True, teacher_forward=True),
        LossSpec(topk_rkl, needs_logits=True, teacher_support=True),
        LossSpec(nll, estimator=False),
    )
}
ESTIMATORS = tuple(name for name, spec in LOSSES.items() if spec.estimator)


def loss_spec(kind: str) -> LossSpec:
    if kind not in LOSSES:
        raise ValueError(f"aux loss kind {kind!r} is not one of {list(LOSSES)}")
    return LOSSES[kind]


def aux_loss(x: LossInputs, term: AuxTerm) -> tuple[Tensor, Metrics]:
    """The term's loss component: its spec's function, given the gate where the spec takes one."""
    spec = loss_spec(term.kind)
    if term.gate_beta is not None and not spec.gated:
        raise ValueError(f"aux term {term.name!r}: a {term.kind} term has no gate (gate_beta={term.gate_beta})")
    return spec.fn(x, beta=term.gate_beta) if spec.gated else spec.fn(x)
