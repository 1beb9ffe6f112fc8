"""Loss components: pure functions over tensors, each returning ``(loss, metrics)``.

Shape convention (the project's, see ``pipeline/core/types.py``): ``# [B, T]`` comments name tensor
shapes; B = rows (one assistant turn each), T = padded positions, V = vocabulary size. A value
at position t describes the response token at t. ``mask`` is the float response-token mask
``# [B, T]`` (1 on sampled response tokens, 0 on prompt and padding).

Aggregation: ``token_mean(x, mask, n_tokens_total) = sum(x * mask) / n_tokens_total`` where
``n_tokens_total`` is the response-token count of the WHOLE mini-batch (one optimiser step), not
of the micro-batch at hand. So the micro-batch losses of a mini-batch sum to the full-batch token
mean, and their gradients accumulate to the full-batch gradient; a mean of per-micro-batch means
would weight short micro-batches up. ``n_tokens_total <= 0`` is treated as 1 (the sum is 0 then).

Metrics follow the same contract: each is a ``pipeline.algorithm.metrics.Stat`` carrying its
reduction (a token mean is a masked sum over ``n_tokens_total``; extrema are micro-batch max / min,
-inf / +inf when a micro-batch has no token), detached, never ``.item()`` (no host sync). Keys
carry no prefix: the learner adds ``policy/`` or the ``AuxTerm.name`` (``sdar/``, ``opd/``, ``tg/``).

Aux losses take one typed record, ``LossInputs`` (the sampled ones also SDAR's gate sharpness,
``AuxTerm.gate_beta``), and are looked up by ``AuxTerm.kind`` in ``AUX_LOSSES`` (``aux_loss``);
the kinds in ``AUX_NEEDS_LOGITS`` need the learner to fill the student's logits, those in
``AUX_NEEDS_TEACHER_FORWARD`` also the teacher's (see ``full_kl``, ``topk_rkl``). Nothing here runs a
model, touches Ray, or knows which method asked for a term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import Tensor

from pipeline.algorithm.metrics import Metrics, Reduce, Stat, maximum, mean, minimum
from pipeline.core.types import GATED_AUX_KINDS, AuxTerm

# Aux kinds whose learner must supply the student's logits, and those that also need the
# teacher's (its forward runs in the learner).
AUX_NEEDS_LOGITS = frozenset({"full_kl", "topk_rkl"})
AUX_NEEDS_TEACHER_FORWARD = frozenset({"full_kl"})


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
    student_logits: Tensor | None = None  # [N_resp, V] temperature-scaled (AUX_NEEDS_LOGITS)
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


_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps a stale token's ratio finite in float32


def _denominator(n_tokens_total: int | float | Tensor) -> Tensor | float:
    if isinstance(n_tokens_total, Tensor):
        return n_tokens_total.detach().clamp(min=1)
    return max(float(n_tokens_total), 1.0)


def token_mean(x: Tensor, mask: Tensor, n_tokens_total: int | float | Tensor) -> Tensor:
    """``sum_{b,t} mask[b,t] * x[b,t] / n_tokens_total`` (see the module docstring).

    Masked positions contribute exactly 0 to value and gradient, even when ``x`` holds inf/nan
    there (padding), because they are selected out rather than multiplied by 0.
    """
    return torch.where(mask > 0, x * mask, torch.zeros_like(x)).sum() / _denominator(n_tokens_total)


def _masked_extreme(x: Tensor, mask: Tensor, largest: bool) -> Tensor:
    fill = float("-inf") if largest else float("inf")
    picked = torch.where(mask > 0, x, torch.full_like(x, fill)).detach()
    return picked.max() if largest else picked.min()


# --------------------------------------------------------------------------------------------
# Policy loss
# --------------------------------------------------------------------------------------------


def policy_loss(
    logprobs: Tensor,  # [B, T] current policy, with grad
    old_logprobs: Tensor,  # [B, T] behaviour log-probs (the engine that sampled)
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    n_tokens_total: int | float | Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    correction: Literal["none", "decoupled", "tis"] = "none",
    proximal_logprobs: Tensor | None = None,  # [B, T] learner recompute at step start
    behaviour_cap: float = 5.0,
) -> tuple[Tensor, Metrics]:
    """PPO clip with dual clip for negative advantages (verl semantics), token-mean.

    With ``r = exp(lp - lp_anchor)`` (log-ratio clamped to [-20, 20]) and ``A`` the advantage::

        l_clip = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        l      = min(l_clip, -A c)   if A < 0 and dual_clip c is set   (Ye et al. 2020, dual clip)
               = l_clip              otherwise
        L      = token_mean(w * l)

    Off-policy correction (docs/methods.md, "Shared backbone"):

    - ``none``: anchor = ``lp_old``, ``w = 1``.
    - ``decoupled`` (AReaL, Fu et al. 2025): anchor = ``lp_prox`` (``proximal_logprobs``), and the
      behaviour weight ``w = sg(min(exp(lp_prox - lp_old), cap))``. AReaL drops tokens whose weight
      exceeds the cap; docs/methods.md truncates them to the cap instead, and so do we.
    - ``tis``: anchor = ``lp_old`` (no proximal forward needed) and the importance ratio itself is
      truncated, ``r <- min(r, cap)`` (value clamp, so no gradient beyond the cap), ``w = 1``.
      With the dual clip on and ``cap >= max(c, 1 + clip_high)`` the truncation cannot change
      the loss (both clips already bound it); it matters when ``cap < c`` or without dual clip.

    With ``proximal == old`` (lag 0) ``decoupled`` has ``w = 1`` and the same anchor, i.e. plain
    PPO; so has ``tis`` whenever the ratio stays below the cap.

    Metrics: ``loss``; ``clip_fraction`` (tokens where the clipped branch is the larger loss);
    ``dual_clip_fraction`` (A < 0 tokens bounded by ``-A c``); ``approx_kl_k1`` = token_mean(-log r)
    and ``approx_kl_k3`` = token_mean(r - 1 - log r), KL(anchor || current) estimated on the
    anchor's samples; ``ratio_mean``/``ratio_max``/``ratio_min`` of the untruncated ratio;
    ``behaviour_weight_mean``/``behaviour_weight_max`` of ``w``; ``truncated_fraction`` (tokens
    where the cap bit: ``w`` for decoupled, ``r`` for tis).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    if behaviour_cap < 1.0:
        raise ValueError(f"behaviour_cap must be >= 1 so that lag 0 is plain PPO, got {behaviour_cap}")

    ones = torch.ones_like(logprobs).detach()
    truncated = torch.zeros_like(logprobs, dtype=torch.bool)
    if correction == "none":
        anchor, weight = old_logprobs, ones
    elif correction == "decoupled":
        if proximal_logprobs is None:
            raise ValueError("correction='decoupled' needs proximal_logprobs (recomputed at step start)")
        anchor = proximal_logprobs
        raw_weight = torch.exp((proximal_logprobs - old_logprobs).detach().clamp(max=_LOG_RATIO_LIMIT))
        truncated = raw_weight > behaviour_cap
        weight = raw_weight.clamp(max=behaviour_cap)
    elif correction == "tis":
        anchor, weight = old_logprobs, ones
    else:
        raise ValueError(f"unknown correction {correction!r}: use 'none', 'decoupled' or 'tis'")

    log_ratio = (logprobs - anchor.detach()).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)  # [B, T]
    raw_ratio = torch.exp(log_ratio)
    ratio = raw_ratio
    if correction == "tis":
        truncated = raw_ratio.detach() > behaviour_cap
        ratio = raw_ratio.clamp(max=behaviour_cap)

    adv = advantages.detach()
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    dual_active = torch.zeros_like(truncated)
    if dual_clip is not None:
        loss_dual = -adv * dual_clip
        dual_active = (adv < 0) & (per_token > loss_dual)
        per_token = torch.where(adv < 0, torch.minimum(per_token, loss_dual), per_token)
    per_token = weight * per_token
    loss = token_mean(per_token, mask, n_tokens_total)

    with torch.no_grad():
        lr = log_ratio.detach()
        rr = raw_ratio.detach()
        metrics: Metrics = {
            "loss": mean(loss),
            "clip_fraction": mean(token_mean((loss_clipped > loss_unclipped).float(), mask, n_tokens_total)),
            "dual_clip_fraction": mean(token_mean(dual_active.float(), mask, n_tokens_total)),
            "approx_kl_k1": mean(token_mean(-lr, mask, n_tokens_total)),
            "approx_kl_k3": mean(token_mean(rr - 1.0 - lr, mask, n_tokens_total)),
            "ratio_mean": mean(token_mean(rr, mask, n_tokens_total)),
            "ratio_max": maximum(_masked_extreme(rr, mask, largest=True)),
            "ratio_min": minimum(_masked_extreme(rr, mask, largest=False)),
            "behaviour_weight_mean": mean(token_mean(weight, mask, n_tokens_total)),
            "behaviour_weight_max": maximum(_masked_extreme(weight, mask, largest=True)),
            "truncated_fraction": mean(token_mean(truncated.float(), mask, n_tokens_total)),
        }
    return loss, metrics


# --------------------------------------------------------------------------------------------
# Entropy bonus and KL to a frozen reference
# --------------------------------------------------------------------------------------------


def entropy_bonus(entropy: Tensor, mask: Tensor, n_tokens_total: int | float | Tensor) -> tuple[Tensor, Metrics]:
    """Mean per-token entropy ``token_mean(H_t)``; ``entropy`` is ``# [B, T]``.

    Returned as the value to *maximise*: the learner adds ``-coef * value`` to the loss.
    """
    value = token_mean(entropy, mask, n_tokens_total)
    return value, {"entropy": mean(value)}


def kl_to_reference(
    logprobs: Tensor,  # [B, T] current policy, with grad
    ref_logprobs: Tensor,  # [B, T] frozen reference
    mask: Tensor,
    n_tokens_total: int | float | Tensor,
) -> tuple[Tensor, Metrics]:
    """k3 ("low_var_kl", Schulman 2020, as in verl): ``d = lp_ref - lp``,
    ``kl_t = clamp(exp(d) - d - 1, -10, 10)``, ``L = token_mean(kl_t)``.
    """
    d = ref_logprobs.detach() - logprobs
    kl = (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    loss = token_mean(kl, mask, n_tokens_total)
    return loss, {"kl_ref": mean(loss)}


# --------------------------------------------------------------------------------------------
# Auxiliary (distillation) losses: f(x: LossInputs, **params), registered in AUX_LOSSES
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


def gated_surrogate(x: LossInputs, *, beta: float | None = None) -> tuple[Tensor, Metrics]:
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
    loss = torch.where(weight > 0, weight * kl_per_token, 0.0).sum() / _denominator(x.n_tokens_total)
    with torch.no_grad():
        denom = _denominator(x.n_tokens_total)
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
    ids = x.topk_ids[response].long()  # [N_resp, k]
    if ids.shape[0] != x.student_logits.shape[0]:
        raise ValueError(f"topk_rkl: {x.student_logits.shape[0]} logits rows for {ids.shape[0]} response tokens")
    dtype = torch.promote_types(x.student_logits.dtype, torch.float32)  # bf16 logits: softmax in fp32
    lpt = x.topk_teacher_logprobs[response].detach().to(dtype)  # [N_resp, k]
    log_p = torch.log_softmax(x.student_logits.to(dtype), dim=-1).gather(-1, ids)  # [N_resp, k]
    p = log_p.exp()
    kl_per_token = (p * (log_p - lpt)).sum(-1)  # [N_resp]
    denom = _denominator(x.n_tokens_total)
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
        "logprob_min": minimum(_masked_extreme(x.logprobs, sel, False)),
    }


AuxLoss = Callable[..., tuple[Tensor, Metrics]]

AUX_LOSSES: dict[str, AuxLoss] = {
    "sampled_surrogate": gated_surrogate,
    "k3_is": k3_is,
    "full_kl": full_kl,
    "topk_rkl": topk_rkl,
    "nll": nll,
}


def aux_loss(x: LossInputs, term: AuxTerm) -> tuple[Tensor, Metrics]:
    """The term's loss component: its kind's function, given the gate where the term has one."""
    fn = AUX_LOSSES[term.kind]
    return fn(x) if term.kind not in GATED_AUX_KINDS else fn(x, beta=term.gate_beta)
