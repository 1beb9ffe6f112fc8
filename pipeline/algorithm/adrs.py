"""ADRS: per-token advantages shaped by a teacher's centred scores and the TVA gate, and the
schedule that turns the shaping on (no Ray, no model). Inputs are the rows of
``pipeline/algorithm/advantages.py`` and their base (GRPO or GiGPO) advantages; outputs one
``# [n_response]`` tensor per row, in the input row order.

ADRS (``gitrxh/ADRS-arxiv``, ``adrs_utils.py`` and the additive branch of
``compute_grpo_outcome_advantage``): see ``adrs_advantages``. Deviations from the code there:
the unit centring for the alignment ``alpha`` is the mean of the unit (row) means at both levels
(the code's L3 uses the token-weighted batch mean); the reward scale ``eta_r`` is not a parameter
because it cancels in the group whitening (``r_T = eta_r * m * qhat`` added to centred rows is a
no-op for the row advantage, as docs/methods.md says); rows without tokens are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from torch import Tensor

from pipeline.algorithm.advantages import (
    EPS_STD,
    F64,
    RowAdvantages,
    RowInput,
    anchor_groups,
    dense_ids,
    discounted_returns,
    row_scores,
    segment_stats,
)


@dataclass(frozen=True, slots=True)
class AdrsSchedule:
    eta_s: float  # shaping coefficient for this step
    entropy_coef: float


def adrs_schedule(
    step: int,
    *,
    eta: float = 0.02,
    warmup_steps: int = 20,
    active_steps: int | None = 50,
    entropy_coef_active: float = 0.01,
    entropy_coef_idle: float = 0.001,
) -> AdrsSchedule:
    """Shaping is on for ``warmup_steps < step <= warmup_steps + active_steps`` (steps 21-70 by
    default; ``active_steps=None``: no end), with the larger entropy coefficient while on."""
    on = step > warmup_steps and (active_steps is None or step <= warmup_steps + active_steps)
    return AdrsSchedule(eta_s=eta if on else 0.0, entropy_coef=entropy_coef_active if on else entropy_coef_idle)


def _flatten(teacher_logprobs: Sequence[Tensor | Sequence[float]]) -> tuple[Tensor, Tensor, Tensor]:
    """Ragged rows -> (values ``# [N]``, row id of each token ``# [N]``, row lengths ``# [B]``)."""
    lp = [torch.as_tensor(t, dtype=F64).detach().flatten() for t in teacher_logprobs]
    lengths = torch.tensor([t.numel() for t in lp], dtype=torch.long)
    if bool((lengths == 0).any()):
        raise ValueError("adrs: every row needs at least one teacher log-prob")
    values = torch.cat(lp) if lp else torch.zeros(0, dtype=F64)
    return values, torch.repeat_interleave(torch.arange(len(lp)), lengths), lengths


def _row_means(values: Tensor, tok_row: Tensor, lengths: Tensor) -> Tensor:
    return torch.zeros(len(lengths), dtype=F64).index_add_(0, tok_row, values) / lengths.to(F64)


def adrs_centred_scores(
    teacher_logprobs: Sequence[Tensor | Sequence[float]], *, std_mode: Literal["per_seq", "global"] = "per_seq"
) -> list[Tensor]:
    """``qhat = (lpT - mean_t lpT) / (std + 1e-8)`` per row; std is the row's population std
    (``per_seq``) or the unbiased std of the centred values over all tokens (``global``; 1 for
    a single token). Returns one float64 ``# [n_response]`` tensor per row."""
    lpt, tok_row, lengths = _flatten(teacher_logprobs)
    q = lpt - _row_means(lpt, tok_row, lengths)[tok_row]
    if std_mode == "per_seq":
        row_std = _row_means(q * q, tok_row, lengths).sqrt()
        qhat = q / (row_std[tok_row] + 1e-8)
    elif std_mode == "global":
        qhat = q / (q.std() + 1e-8) if q.numel() > 1 else q
    else:
        raise ValueError(f"unknown std_mode {std_mode!r}: use 'per_seq' or 'global'")
    return list(torch.split(qhat, lengths.tolist()))


def tva_per_row(
    rows: Sequence[RowInput],
    teacher_logprobs: Sequence[Tensor | Sequence[float]],
    *,
    level: Literal["L2", "L3"] = "L2",
    temperature: float = 1.0,
    invalid_penalty: float = 0.0,
    gamma: float = 0.95,
    similarity_threshold: float | None = None,
) -> Tensor:
    """Teacher value advantage of each row's TVA group, ``# [B]`` float64 (see ``adrs_advantages``)."""
    lpt, tok_row, lengths = _flatten(teacher_logprobs)
    if len(lengths) != len(rows):
        raise ValueError(f"adrs: {len(lengths)} teacher rows for {len(rows)} rows")
    lbar = _row_means(lpt, tok_row, lengths)
    alpha = torch.sigmoid((lbar - lbar.mean()) / temperature)
    if level == "L2":
        reward = row_scores(rows, invalid_penalty)
        ids, n = dense_ids([r.group for r in rows])
    elif level == "L3":
        reward = discounted_returns(rows, gamma=gamma, invalid_penalty=invalid_penalty)
        ids = anchor_groups(rows, similarity_threshold=similarity_threshold)
        n = int(ids.max()) + 1
    else:
        raise ValueError(f"unknown level {level!r}: use 'L2' or 'L3'")

    def seg_sum(x: Tensor) -> Tensor:
        return torch.zeros(n, dtype=F64).index_add_(0, ids, x)

    aligned = seg_sum(alpha * reward) / (seg_sum(alpha) + 1e-8)
    divergent = seg_sum((1 - alpha) * reward) / (seg_sum(1 - alpha) + 1e-8)
    tva = torch.where(seg_sum(torch.ones_like(alpha)) >= 2, aligned - divergent, torch.zeros_like(aligned))
    return tva[ids]


def adrs_advantages(
    rows: Sequence[RowInput],
    teacher_logprobs: Sequence[Tensor | Sequence[float]],  # per row [n_response]
    base: RowAdvantages,
    *,
    eta_s: float,
    level: Literal["L2", "L3"] = "L2",
    tva_apply: Literal["paper", "after_whitening"] = "paper",
    std_mode: Literal["per_seq", "global"] = "per_seq",
    temperature: float = 1.0,
    tau: float = 2.0,
    clip: float | None = 0.2,
    adaptive_clip: bool = True,
    invalid_penalty: float = 0.0,
    gamma: float = 0.95,
    similarity_threshold: float | None = None,
) -> tuple[list[Tensor], dict[str, float]]:
    """ADRS per-token advantages ``A_t = A_row + clip(eta_s * Z_t, -c_g, c_g)``, one tensor per row.

    1. Centring (``adrs_centred_scores``): ``q = lpT - mean_t lpT`` per row,
       ``qhat = q / (std + 1e-8)``, std per row (``per_seq``) or over the batch (``global``).
    2. TVA (``tva_per_row``) over units u = rows: ``alpha_u = sigmoid((lbar_u - mean_u' lbar_u') /
       temperature)``, ``lbar_u`` = row-mean lpT. L2: R_u = row score, groups = episode groups.
       L3: R_u = discounted step return, groups = anchor groups. In groups of >= 2 units
       ``TVA_g = sum(a R)/(sum a + 1e-8) - sum((1-a) R)/(sum(1-a) + 1e-8)``, else 0; gate
       ``m_u = sigmoid(tau * TVA_g)``.
    3. Whitening per episode group g with >= 2 rows and ``base.strength >= 1e-6`` (other groups
       get ``A_t = A_row``), over all its tokens, unbiased variance (verl ``masked_var``),
       ``whiten_g(x) = (x - mean_g) / sqrt(var_g + 1e-8)``:
       ``paper``: ``Z = whiten_g(m * qhat)`` (the teacher reward ``r_T`` up to the scale that
       cancels). At L2 m is constant in g, so it cancels too: the gate has no effect.
       ``after_whitening``: ``Z = m * whiten_g(qhat)``, where the gate really scales the shaping
       (a neutral gate, m = 0.5, halves it relative to ``paper``: same eta_s, half the push).
    4. Clip ``c_g = clip * min(strength_g / (median + 1e-6), 1)`` with ``adaptive_clip`` (median
       over every group with ``strength >= 1e-6``, a single-row group counting as 1, verl's std of
       one score, as the reference; the lower middle for an even count, as ``torch.median``), else ``clip``;
       ``clip=None`` disables clipping. ``strength`` is the base's std_g (GRPO) or max|A| (GiGPO).

    Metrics: ``adrs/tva_mean`` (over rows), ``adrs/gate_mean`` (over tokens),
    ``adrs/gate_active_ratio`` (tokens whose gate m > 0.5, as SDAR's), ``adrs/shaping_abs_mean``
    (|shaping| over all tokens, 0 in unshaped groups), ``adrs/shaping_share`` (mean |shaping| /
    mean |A_t| over all tokens: how much of the advantage the teacher's term is),
    ``adrs/clip_fraction`` (shaped tokens where the clip bit), ``adrs/shaped_group_fraction``.
    """
    if tva_apply not in ("paper", "after_whitening"):
        raise ValueError(f"unknown tva_apply {tva_apply!r}: use 'paper' or 'after_whitening'")
    if len(rows) == 0:
        return [], {}
    if base.advantages.shape[0] != len(rows):
        raise ValueError(f"adrs: base has {base.advantages.shape[0]} advantages for {len(rows)} rows")
    tva = tva_per_row(
        rows,
        teacher_logprobs,
        level=level,
        temperature=temperature,
        invalid_penalty=invalid_penalty,
        gamma=gamma,
        similarity_threshold=similarity_threshold,
    )
    gate = torch.sigmoid(tau * tva)  # [B]
    qhat = torch.cat(adrs_centred_scores(teacher_logprobs, std_mode=std_mode))  # [N]
    _, tok_row, lengths = _flatten(teacher_logprobs)

    # whitening within episode groups that carry an env signal
    gids, n_groups = dense_ids([r.group for r in rows])
    strength, n_in_group, shaped = _groups(gids, n_groups, base.strength)
    tok_group = gids[tok_row]  # [N]
    tok_gate = gate[tok_row]
    z, token_shaped = _whitened(qhat, tok_gate, tok_group, n_groups, shaped, tva_apply)

    limit = _clip_limits(strength, n_in_group, shaped, clip, adaptive_clip)
    raw = eta_s * z
    tok_limit = limit[tok_group]
    shaping = torch.maximum(torch.minimum(raw, tok_limit), -tok_limit)
    clipped = token_shaped & (raw.abs() > tok_limit)

    adv = base.advantages.to(F64)[tok_row] + shaping
    metrics = _shaping_metrics(tva, tok_gate, shaping, adv, clipped, token_shaped, shaped)
    return [t.float() for t in torch.split(adv, lengths.tolist())], metrics


def _groups(gids, n_groups: int, row_strength):
    """Per episode group: its env-signal strength (equal over its rows), its row count, and
    whether it is shaped (>= 2 rows and an env signal)."""
    strength = torch.zeros(n_groups, dtype=F64).index_copy_(0, gids, row_strength.to(F64))
    n_in_group = torch.zeros(n_groups, dtype=F64).index_add_(0, gids, torch.ones(gids.shape[0], dtype=F64))
    return strength, n_in_group, (n_in_group >= 2) & (strength >= EPS_STD)


def _whitened(qhat, tok_gate, tok_group, n_groups: int, shaped, tva_apply: str):
    """``Z`` of step 3 of ``adrs_advantages`` (0 outside the shaped groups) and the tokens shaped."""
    signal = tok_gate * qhat if tva_apply == "paper" else qhat
    g_count, g_mean, g_std = segment_stats(signal, tok_group, n_groups)
    z = (signal - g_mean[tok_group]) / (g_std[tok_group] ** 2 + 1e-8).sqrt()
    if tva_apply == "after_whitening":
        z = tok_gate * z
    token_shaped = shaped[tok_group] & (g_count[tok_group] >= 2)
    return torch.where(token_shaped, z, torch.zeros_like(z)), token_shaped


def _clip_limits(strength, n_in_group, shaped, clip: float | None, adaptive_clip: bool) -> torch.Tensor:
    """Each group's clip ``c_g`` (step 4 of ``adrs_advantages``). The adaptive clip's median runs
    over every group with an env signal, a single-row group counting as std 1 (verl's std of one
    score), as the reference does."""
    n_groups = strength.shape[0]
    median_strength = torch.where(n_in_group < 2, torch.ones_like(strength), strength)
    with_signal = median_strength >= EPS_STD
    if clip is None or clip <= 0:
        return torch.full((n_groups,), float("inf"), dtype=F64)
    if adaptive_clip and bool(shaped.any()):
        return clip * torch.clamp(strength / (median_strength[with_signal].median() + EPS_STD), max=1.0)
    return torch.full((n_groups,), float(clip), dtype=F64)


def _shaping_metrics(tva, tok_gate, shaping, adv, clipped, token_shaped, shaped) -> dict[str, float]:
    n_shaped_tokens = int(token_shaped.sum())
    return {
        "adrs/tva_mean": float(tva.mean()),
        "adrs/gate_mean": float(tok_gate.mean()),
        "adrs/gate_active_ratio": float((tok_gate > 0.5).double().mean()),
        "adrs/shaping_abs_mean": float(shaping.abs().mean()),
        "adrs/shaping_share": float(shaping.abs().mean() / adv.abs().mean()) if bool(adv.abs().sum() > 0) else 0.0,
        "adrs/clip_fraction": float(clipped.sum()) / n_shaped_tokens if n_shaped_tokens else 0.0,
        "adrs/shaped_group_fraction": float(shaped.double().mean()),
    }
