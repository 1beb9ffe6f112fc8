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

Here: the policy loss, the entropy bonus and the KL to a frozen reference; the auxiliary
(distillation) terms, each one ``LossSpec``, are in ``pipeline/algorithm/aux_losses.py``. Nothing
here runs a model, touches Ray, or knows which method asked for a term.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from pipeline.algorithm.metrics import Metrics, maximum, mean, minimum

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps a stale token's ratio finite in float32


def denominator(n_tokens_total: int | float | Tensor) -> Tensor | float:
    if isinstance(n_tokens_total, Tensor):
        return n_tokens_total.detach().clamp(min=1)
    return max(float(n_tokens_total), 1.0)


def token_mean(x: Tensor, mask: Tensor, n_tokens_total: int | float | Tensor) -> Tensor:
    """``sum_{b,t} mask[b,t] * x[b,t] / n_tokens_total`` (see the module docstring).

    Masked positions contribute exactly 0 to value and gradient, even when ``x`` holds inf/nan
    there (padding), because they are selected out rather than multiplied by 0.
    """
    return torch.where(mask > 0, x * mask, torch.zeros_like(x)).sum() / denominator(n_tokens_total)


def masked_extreme(x: Tensor, mask: Tensor, largest: bool) -> Tensor:
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

    anchor, weight, truncated = _anchor_and_weight(logprobs, old_logprobs, proximal_logprobs, correction, behaviour_cap)
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
        lr, rr, n = log_ratio.detach(), raw_ratio.detach(), n_tokens_total
        metrics: Metrics = {
            "loss": mean(loss),
            "clip_fraction": mean(token_mean((loss_clipped > loss_unclipped).float(), mask, n)),
            "dual_clip_fraction": mean(token_mean(dual_active.float(), mask, n)),
            **_ratio_metrics(lr, rr, weight, truncated, mask, n),
        }
    return loss, metrics


def _anchor_and_weight(logprobs, old_logprobs, proximal_logprobs, correction: str, behaviour_cap: float):
    """The log-probs the ratio is taken against, the behaviour weight ``w``, and where the
    decoupled weight was truncated (``policy_loss``'s off-policy correction)."""
    ones = torch.ones_like(logprobs).detach()
    truncated = torch.zeros_like(logprobs, dtype=torch.bool)
    if correction in ("none", "tis"):  # tis truncates the ratio itself, in policy_loss
        return old_logprobs, ones, truncated
    if correction != "decoupled":
        raise ValueError(f"unknown correction {correction!r}: use 'none', 'decoupled' or 'tis'")
    if proximal_logprobs is None:
        raise ValueError("correction='decoupled' needs proximal_logprobs (recomputed at step start)")
    raw_weight = torch.exp((proximal_logprobs - old_logprobs).detach().clamp(max=_LOG_RATIO_LIMIT))
    return proximal_logprobs, raw_weight.clamp(max=behaviour_cap), raw_weight > behaviour_cap


def _ratio_metrics(lr: Tensor, rr: Tensor, weight: Tensor, truncated: Tensor, mask: Tensor, n) -> Metrics:
    """KL estimates of the anchor against the current policy, the ratio's and the weight's spread."""
    return {
        "approx_kl_k1": mean(token_mean(-lr, mask, n)),
        "approx_kl_k3": mean(token_mean(rr - 1.0 - lr, mask, n)),
        "ratio_mean": mean(token_mean(rr, mask, n)),
        "ratio_max": maximum(masked_extreme(rr, mask, largest=True)),
        "ratio_min": minimum(masked_extreme(rr, mask, largest=False)),
        "behaviour_weight_mean": mean(token_mean(weight, mask, n)),
        "behaviour_weight_max": maximum(masked_extreme(weight, mask, largest=True)),
        "truncated_fraction": mean(token_mean(truncated.float(), mask, n)),
    }


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
