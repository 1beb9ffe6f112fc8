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

Metrics follow the same contract so the learner can add them up over micro-batches: every value
is a detached 0-d tensor (never ``.item()``: metrics force no host sync), and every mean or fraction is a
masked sum divided by ``n_tokens_total``. The exceptions are the extrema named in
``MAX_METRICS`` / ``MIN_METRICS`` (micro-batch max / min, -inf / +inf when the micro-batch has no
token); ``reduce_micro_batch_metrics`` applies those rules. Keys carry no prefix: the learner
adds ``policy/`` or the ``AuxTerm.name`` (``sdar/``, ``opd/``, ``tg/``).

Aux losses share one signature and are looked up by ``AuxTerm.kind`` in ``AUX_LOSSES``; the kinds
in ``AUX_NEEDS_LOGITS`` need the learner to pass student and teacher logits (see ``full_kl``).
Nothing here runs a model, touches Ray, or knows which method asked for a term.
"""
from __future__ import annotations

from typing import Callable, Literal

import torch
from torch import Tensor

Metrics = dict[str, Tensor]

MAX_METRICS = frozenset({"ratio_max", "behaviour_weight_max"})
MIN_METRICS = frozenset({"ratio_min"})
# Aux kinds whose learner must supply student and teacher logits (the teacher forward runs there).
AUX_NEEDS_LOGITS = frozenset({"full_kl"})

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


def reduce_micro_batch_metrics(per_micro_batch: list[Metrics]) -> Metrics:
    """Combine the metrics of a mini-batch's micro-batches: extrema by max/min, the rest by sum."""
    out: Metrics = {}
    for metrics in per_micro_batch:
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
            elif key in MAX_METRICS:
                out[key] = torch.maximum(out[key], value)
            elif key in MIN_METRICS:
                out[key] = torch.minimum(out[key], value)
            else:
                out[key] = out[key] + value
    return out


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

    Off-policy correction (METHODS.md, "Shared backbone"):

    - ``none``: anchor = ``lp_old``, ``w = 1``.
    - ``decoupled`` (AReaL, Fu et al. 2025): anchor = ``lp_prox`` (``proximal_logprobs``), and the
      behaviour weight ``w = sg(min(exp(lp_prox - lp_old), cap))``. AReaL drops tokens whose weight
      exceeds the cap; METHODS.md truncates them to the cap instead, and so do we.
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
            "loss": loss.detach(),
            "clip_fraction": token_mean((loss_clipped > loss_unclipped).float(), mask, n_tokens_total),
            "dual_clip_fraction": token_mean(dual_active.float(), mask, n_tokens_total),
            "approx_kl_k1": token_mean(-lr, mask, n_tokens_total),
            "approx_kl_k3": token_mean(rr - 1.0 - lr, mask, n_tokens_total),
            "ratio_mean": token_mean(rr, mask, n_tokens_total),
            "ratio_max": _masked_extreme(rr, mask, largest=True),
            "ratio_min": _masked_extreme(rr, mask, largest=False),
            "behaviour_weight_mean": token_mean(weight, mask, n_tokens_total),
            "behaviour_weight_max": _masked_extreme(weight, mask, largest=True),
            "truncated_fraction": token_mean(truncated.float(), mask, n_tokens_total),
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
    return value, {"entropy": value.detach()}


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
    return loss, {"kl_ref": loss.detach()}


# --------------------------------------------------------------------------------------------
# Auxiliary (distillation) losses: one uniform signature, registered in AUX_LOSSES
# --------------------------------------------------------------------------------------------


def _distill_mask(mask: Tensor, aux: dict[str, Tensor]) -> Tensor:
    extra = aux.get("distill_mask")
    return mask if extra is None else mask * extra


def sdar_gate(teacher_logprobs: Tensor, logprobs: Tensor, beta: float) -> Tensor:
    """SDAR gate ``g = sg(sigmoid(beta * (lpT - lp)))``, ``# [B, T]``. beta = 0 gives 0.5."""
    return torch.sigmoid(beta * (teacher_logprobs - logprobs)).detach()


def sdar_metrics(
    teacher_logprobs: Tensor, logprobs: Tensor, gate: Tensor, mask: Tensor, n_tokens_total: int | float | Tensor
) -> Metrics:
    """``gate_mean``, ``gate_active_ratio`` (g > 0.5), ``teacher_gap_mean`` (lpT - lp) and
    ``negative_gap_fraction`` (lpT < lp), each a masked sum over ``n_tokens_total``."""
    with torch.no_grad():
        gap = (teacher_logprobs - logprobs).detach()
        return {
            "gate_mean": token_mean(gate.detach(), mask, n_tokens_total),
            "gate_active_ratio": token_mean((gate > 0.5).float(), mask, n_tokens_total),
            "teacher_gap_mean": token_mean(gap, mask, n_tokens_total),
            "negative_gap_fraction": token_mean((gap < 0).float(), mask, n_tokens_total),
        }


def gated_surrogate(
    logprobs: Tensor,
    mask: Tensor,
    aux: dict[str, Tensor],
    n_tokens_total: int | float | Tensor,
    *,
    proximal_logprobs: Tensor,
    student_logits: Tensor | None = None,
    teacher_logits: Tensor | None = None,
    beta: float | None = None,
) -> tuple[Tensor, Metrics]:
    """SDAR gated sampled-token surrogate (SDAR paper; also ``opsd`` and ``grpo_opsd``)::

        g = sg(sigmoid(beta * (lpT - lp)))
        L = token_mean(g * (lpT - lp) * distill_mask),   grad L = -token_mean(g * distill_mask * grad lp)

    ``aux["teacher_logprobs"]`` is lpT ``# [B, T]``; ``aux["distill_mask"]`` is optional. With
    ``beta`` (an ``AuxTerm`` parameter) the gate is computed here from the current policy's
    log-probs, exactly as SDAR's code; without it, ``aux["distill_weight"]`` supplies a
    precomputed gate (a fixed weight, e.g. for ablations).
    """
    teacher = aux["teacher_logprobs"].detach()
    gate = sdar_gate(teacher, logprobs, beta) if beta is not None else aux["distill_weight"].detach()
    sel = _distill_mask(mask, aux)
    loss = token_mean(gate * (teacher - logprobs), sel, n_tokens_total)
    metrics = {"loss": loss.detach(), **sdar_metrics(teacher, logprobs, gate, sel, n_tokens_total)}
    return loss, metrics


def k3_is(
    logprobs: Tensor,
    mask: Tensor,
    aux: dict[str, Tensor],
    n_tokens_total: int | float | Tensor,
    *,
    proximal_logprobs: Tensor,
    student_logits: Tensor | None = None,
    teacher_logits: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """K3 estimator with an on-policy importance ratio (RetireOPD OPD loss, SDAR repo
    ``skillsd_utils.py``; also ``skill_sd`` and targeted guidance ``sampled``)::

        l   = lp - lpT
        k3  = exp(min(-l, 20)) - 1 + l
        rho = exp(min(lp - lp_prox, 10))         (NOT detached: it carries gradient too)
        L   = token_mean(rho * k3 * distill_mask)

    ``lp_prox`` (``proximal_logprobs``) is the learner's own log-prob of the token before the
    step's first update, what the released code calls old log-probs (recomputed by the actor),
    never the rollout engine's: an engine/learner mismatch (bf16 engines: 0.05 mean, 0.3 max) or a
    policy lag would otherwise enter rho and dominate the gradient. The lag correction stays in
    the policy loss. Uses ``aux["teacher_logprobs"]`` and the optional ``aux["distill_mask"]``.

    Metrics: ``loss``, ``k3_mean``, ``rho_mean``, and ``alignment`` = ``token_mean(lp_prox - lpT)``
    over the distilled tokens: RetireOPD's ``K_n`` when the mini-batch is the whole step.
    """
    teacher = aux["teacher_logprobs"].detach()
    sel = _distill_mask(mask, aux)
    ell = logprobs - teacher
    k3 = torch.exp((-ell).clamp(max=20.0)) - 1.0 + ell
    prox = proximal_logprobs.detach()
    rho = torch.exp((logprobs - prox).clamp(max=10.0))
    loss = token_mean(rho * k3, sel, n_tokens_total)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "k3_mean": token_mean(k3.detach(), sel, n_tokens_total),
            "rho_mean": token_mean(rho.detach(), sel, n_tokens_total),
            "alignment": token_mean(prox - teacher, sel, n_tokens_total),
        }
    return loss, metrics


def full_kl(
    logprobs: Tensor,
    mask: Tensor,
    aux: dict[str, Tensor],
    n_tokens_total: int | float | Tensor,
    *,
    proximal_logprobs: Tensor,
    student_logits: Tensor | None = None,
    teacher_logits: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Exact reverse KL over the vocabulary on failed-turn tokens (targeted guidance, ``full``)::

        L_TG = (1 / N_all) * sum_{t: distill_mask_t = 1} KL(pi_theta(.|s_t) || sg mu(.|s_t))
             = (1 / N_all) * sum_t distill_mask_t * sum_v p_t(v) (log p_t(v) - log q_t(v))

    with ``p = softmax(student_logits)``, ``q = softmax(teacher_logits)`` (no gradient) and
    ``N_all = n_tokens_total``: every valid response token of the mini-batch, not only the
    failed-turn ones (the seed's normalisation).

    Learner-facing contract. ``student_logits`` and ``teacher_logits`` are ``# [N_resp, V]``: one
    row per response token of ``mask``, in row-major order of ``mask.nonzero()`` (the order of
    ``pipeline.algorithm.logprobs.forward_response(..., with_logits=True)``), row i holding the logits that
    *predict* that token (model output at position t-1), already divided by the rollout
    temperature. Student rows come from the forward on ``input_ids``; teacher rows from the
    forward (same weights, no grad) on ``teacher_input_ids`` at ``teacher_response_mask``, which
    marks the same response tokens of every row in the same order. ``aux["distill_mask"]``
    ``# [B, T]`` selects the failed-turn tokens (absent: all tokens). The loss is a token sum over
    a global count, so the learner may pass micro-batches or chunks and add the losses.
    ``logprobs`` and ``proximal_logprobs`` are unused.

    Metrics: ``loss``; ``kl`` (= loss); ``selected_fraction`` (selected tokens / N_all), so
    ``kl / selected_fraction`` is the mean KL per selected token.
    """
    if student_logits is None or teacher_logits is None:
        raise ValueError("full_kl needs student_logits and teacher_logits, each [N_resp, V]")
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError(
            f"full_kl: student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must both be [N_resp, V]"
        )
    weight = _distill_mask(mask, aux)[mask > 0]  # [N_resp]; a boolean select, like the forward's
    if weight.shape[0] != student_logits.shape[0]:
        raise ValueError(
            f"full_kl: {student_logits.shape[0]} logits rows for {weight.shape[0]} response tokens in mask"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # bf16 logits: softmax in fp32
    log_p = torch.log_softmax(student_logits.to(dtype), dim=-1)  # [N_resp, V]
    log_q = torch.log_softmax(teacher_logits.detach().to(dtype), dim=-1)
    kl_per_token = (log_p.exp() * (log_p - log_q)).sum(dim=-1)  # [N_resp]
    # where, not a product: unselected rows may hold anything (e.g. -inf logits) without a nan
    loss = torch.where(weight > 0, weight * kl_per_token, 0.0).sum() / _denominator(n_tokens_total)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "kl": loss.detach(),
            "selected_fraction": weight.sum() / _denominator(n_tokens_total),
        }
    return loss, metrics


AuxLoss = Callable[..., tuple[Tensor, Metrics]]

AUX_LOSSES: dict[str, AuxLoss] = {
    "gated_surrogate": gated_surrogate,
    "k3_is": k3_is,
    "full_kl": full_kl,
}
