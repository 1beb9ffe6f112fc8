"""Credit assignment before the learner: GRPO, GiGPO and ADRS advantages (no Ray, no model).

Input form. A batch is a flat list of ``RowInput``, one per assistant turn, in any order; rows
name their episode group (the G episodes of one task under one seed: the unit of statistics),
their episode and their turn index. ``rows_from_groups`` builds it from ``EpisodeGroup`` records
(row order = ``group.rows()`` concatenated). Outputs follow the input row order: one scalar
advantage per row (broadcast to the row's tokens by the batch builder), and for ADRS one
``# [n_response]`` tensor per row. Statistics run in float64; outputs are float32.

GRPO as in verl-agent (``compute_grpo_outcome_advantage``): row score
``R_row = episode_reward - invalid_penalty * (not action_valid)``;
``A_row = (R_row - mean_g) / (std_g + 1e-6)``, mean and std over all turn rows of group g
(``mean_std_across_rows=True``) or over its episodes. ``std`` is the unbiased (n - 1) standard
deviation, as verl's ``torch.std``. ``norm_std=False`` (Dr.GRPO) gives ``R_row - mean_g``.
Over episodes, the statistics use each episode's reward once (without penalties) and every row
still subtracts the group mean from its own ``R_row``, so the invalid penalty keeps acting on the
row that earned it (verl-agent takes each episode's first-row score, penalty included, for the
statistics). Degenerate groups, chosen so that nothing explodes:

- fewer than 2 values in the statistics (one row, or one episode): advantage 0. verl uses mean 0,
  std 1 there, i.e. ``A = R``: a baseline-free signal we do not want inside a GRPO batch.
- ``std_g < 1e-6``: the denominator is 1 instead of ``std_g + 1e-6``. Over rows the numerators
  are then 0 anyway (verl's result); over episodes this keeps an invalid row at ``-penalty``
  rather than ``-penalty / 1e-6``.

GiGPO (verl-agent ``gigpo/core_gigpo.py``): ``A = A_E + w * A_S``; ``A_E`` is GRPO above;
``R_t = sum_k gamma^(k-t) r_k`` over the episode's later turns, from the env step rewards ``r_k``
only, then ``R_t -= invalid_penalty`` on an invalid row (verl-agent subtracts the penalty after
discounting, so it never leaks into earlier turns); anchor groups = rows of one episode group with identical anchor
observation (or, with ``similarity_threshold``, greedy clusters against each cluster's first
member with difflib ratio >= threshold, as verl-agent); ``A_S = (R_t - mean) / (std + 1e-6)``
within an anchor group, 0 for singletons, same std rules as GRPO.

ADRS (``gitrxh/ADRS-arxiv``, ``adrs_utils.py`` and the additive branch of
``compute_grpo_outcome_advantage``): see ``adrs_advantages``. Deviations from the code there:
the unit centring for the alignment ``alpha`` is the mean of the unit (row) means at both levels
(the code's L3 uses the token-weighted batch mean); the reward scale ``eta_r`` is not a parameter
because it cancels in the group whitening (``r_T = eta_r * m * qhat`` added to centred rows is a
no-op for the row advantage, as docs/methods.md says); rows without tokens are rejected.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Literal, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.core.types import EpisodeGroup

EPS_STD = 1e-6  # GRPO / GiGPO denominator epsilon and the "zero std" threshold
_F64 = torch.float64


@dataclass(frozen=True, slots=True)
class RowInput:
    """What credit assignment needs from one turn row."""

    group: Hashable  # episode-group key (statistics unit)
    episode: Hashable  # episode key, unique within its group
    turn: int  # turn index within the episode (orders the discounted return)
    episode_reward: float
    step_reward: float = 0.0  # env reward of this step, before the invalid-action penalty
    action_valid: bool = True
    anchor: str = ""  # GiGPO anchor key: the current observation text


@dataclass(slots=True)
class RowAdvantages:
    """Per-row advantages plus what ADRS needs from them."""

    advantages: Tensor  # [B] float32
    strength: Tensor  # [B] env-signal strength of the row's episode group (GRPO std_g, GiGPO max|A|)
    group_rows: Tensor  # [B] long, number of rows in the row's episode group
    metrics: dict[str, float] = field(default_factory=dict)


def rows_from_groups(groups: Sequence["EpisodeGroup"]) -> list[RowInput]:
    """Flatten records; the group key is the position in ``groups``, the episode key its index."""
    return [
        RowInput(
            group=g,
            episode=e,
            turn=turn.turn_index,
            episode_reward=episode.reward,
            step_reward=turn.step_reward,
            action_valid=turn.action_valid,
            anchor=turn.anchor_obs,
        )
        for g, group in enumerate(groups)
        for e, episode in enumerate(group.episodes)
        for turn in episode.turns
    ]


# --------------------------------------------------------------------------------------------
# Segment helpers: keys -> dense ids, then per-segment statistics by index_add
# --------------------------------------------------------------------------------------------


def _dense_ids(keys: Sequence[Hashable]) -> tuple[Tensor, int]:
    index: dict[Hashable, int] = {}
    ids = [index.setdefault(k, len(index)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), len(index)


def _segment_stats(x: Tensor, ids: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment count, mean and unbiased std (std = 0 where count < 2)."""
    count = torch.zeros(n, dtype=_F64).index_add_(0, ids, torch.ones_like(x))
    mean = torch.zeros(n, dtype=_F64).index_add_(0, ids, x) / count.clamp(min=1)
    sq = torch.zeros(n, dtype=_F64).index_add_(0, ids, (x - mean[ids]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return count, mean, std


def _normalise(values: Tensor, ids: Tensor, count: Tensor, mean: Tensor, std: Tensor, norm_std: bool) -> Tensor:
    """``(v - mean_g) / (std_g + eps)`` with the degenerate-group rules of the module docstring."""
    denom = torch.where(std < EPS_STD, torch.ones_like(std), std + EPS_STD) if norm_std else torch.ones_like(std)
    out = (values - mean[ids]) / denom[ids]
    return torch.where(count[ids] >= 2, out, torch.zeros_like(out))


def row_scores(rows: Sequence[RowInput], invalid_penalty: float) -> Tensor:
    """``R_row = episode_reward - invalid_penalty * (not action_valid)``, ``# [B]`` float64."""
    return torch.tensor([r.episode_reward - invalid_penalty * (not r.action_valid) for r in rows], dtype=_F64)


# --------------------------------------------------------------------------------------------
# GRPO and GiGPO
# --------------------------------------------------------------------------------------------


def grpo_advantages(
    rows: Sequence[RowInput],
    *,
    invalid_penalty: float = 0.0,
    mean_std_across_rows: bool = True,
    norm_std: bool = True,
) -> RowAdvantages:
    """GRPO row advantages (module docstring); ``strength`` = the group's std used above."""
    scores = row_scores(rows, invalid_penalty)
    gids, n_groups = _dense_ids([r.group for r in rows])
    if mean_std_across_rows:
        count, mean, std = _segment_stats(scores, gids, n_groups)
    else:
        episodes: dict[tuple[Hashable, Hashable], tuple[int, float]] = {}
        for gid, r in zip(gids.tolist(), rows):
            episodes.setdefault((r.group, r.episode), (gid, r.episode_reward))
        ep_gids = torch.tensor([g for g, _ in episodes.values()], dtype=torch.long)
        ep_rewards = torch.tensor([v for _, v in episodes.values()], dtype=_F64)
        count, mean, std = _segment_stats(ep_rewards, ep_gids, n_groups)
    adv = _normalise(scores, gids, count, mean, std, norm_std)
    group_rows = torch.zeros(n_groups, dtype=torch.long).index_add_(0, gids, torch.ones_like(gids))
    return RowAdvantages(advantages=adv.float(), strength=std[gids].float(), group_rows=group_rows[gids])


def discounted_returns(rows: Sequence[RowInput], *, gamma: float, invalid_penalty: float = 0.0) -> Tensor:
    """``R_t = r_t + gamma * R_{t+1}`` over the env step rewards along each episode's turns (sorted
    by ``turn``), then ``- invalid_penalty`` on invalid rows only, ``# [B]`` float64."""
    r = torch.tensor([row.step_reward for row in rows], dtype=_F64)
    by_episode: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i, row in enumerate(rows):
        by_episode.setdefault((row.group, row.episode), []).append(i)
    out = torch.zeros(len(rows), dtype=_F64)
    for members in by_episode.values():
        running = 0.0
        for i in sorted(members, key=lambda j: rows[j].turn, reverse=True):
            running = float(r[i]) + gamma * running
            out[i] = running
    invalid = torch.tensor([not row.action_valid for row in rows], dtype=torch.bool)
    return out - invalid_penalty * invalid.to(_F64)


def anchor_groups(rows: Sequence[RowInput], *, similarity_threshold: float | None = None) -> Tensor:
    """Anchor-group id per row ``# [B]`` (ids unique across the batch; never across episode groups)."""
    if similarity_threshold is None:
        return _dense_ids([(r.group, r.anchor) for r in rows])[0]
    if not 0.0 < similarity_threshold < 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1) or None, got {similarity_threshold}")
    representatives: dict[Hashable, list[tuple[str, int]]] = {}  # group -> [(first member's text, id)]
    ids, next_id = [], 0
    for r in rows:
        clusters = representatives.setdefault(r.group, [])
        for text, cid in clusters:
            if text == r.anchor or difflib.SequenceMatcher(None, r.anchor, text).ratio() >= similarity_threshold:
                ids.append(cid)
                break
        else:
            clusters.append((r.anchor, next_id))
            ids.append(next_id)
            next_id += 1
    return torch.tensor(ids, dtype=torch.long)


def gigpo_advantages(
    rows: Sequence[RowInput],
    *,
    invalid_penalty: float = 0.0,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    similarity_threshold: float | None = None,
    mean_std_across_rows: bool = True,
    norm_std: bool = True,
) -> RowAdvantages:
    """``A = A_E + step_weight * A_S`` (module docstring); ``strength`` = max|A| of the episode group."""
    episode = grpo_advantages(
        rows, invalid_penalty=invalid_penalty, mean_std_across_rows=mean_std_across_rows, norm_std=norm_std
    )
    returns = discounted_returns(rows, gamma=gamma, invalid_penalty=invalid_penalty)
    aids = anchor_groups(rows, similarity_threshold=similarity_threshold)
    n_anchor = int(aids.max()) + 1 if len(rows) else 0
    count, mean, std = _segment_stats(returns, aids, n_anchor)
    step = _normalise(returns, aids, count, mean, std, norm_std)
    adv = episode.advantages.double() + step_weight * step

    gids, n_groups = _dense_ids([r.group for r in rows])
    strength = torch.zeros(n_groups, dtype=_F64).scatter_reduce_(0, gids, adv.abs(), "amax", include_self=False)
    return RowAdvantages(
        advantages=adv.float(),
        strength=strength[gids].float(),
        group_rows=episode.group_rows,
        metrics={
            "gigpo/anchor_group_size_mean": float(count.mean()) if n_anchor else 0.0,
            "gigpo/singleton_anchor_fraction": float((count[aids] < 2).double().mean()) if len(rows) else 0.0,
        },
    )


# --------------------------------------------------------------------------------------------
# ADRS
# --------------------------------------------------------------------------------------------


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
    lp = [torch.as_tensor(t, dtype=_F64).detach().flatten() for t in teacher_logprobs]
    lengths = torch.tensor([t.numel() for t in lp], dtype=torch.long)
    if bool((lengths == 0).any()):
        raise ValueError("adrs: every row needs at least one teacher log-prob")
    values = torch.cat(lp) if lp else torch.zeros(0, dtype=_F64)
    return values, torch.repeat_interleave(torch.arange(len(lp)), lengths), lengths


def _row_means(values: Tensor, tok_row: Tensor, lengths: Tensor) -> Tensor:
    return torch.zeros(len(lengths), dtype=_F64).index_add_(0, tok_row, values) / lengths.to(_F64)


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
        ids, n = _dense_ids([r.group for r in rows])
    elif level == "L3":
        reward = discounted_returns(rows, gamma=gamma, invalid_penalty=invalid_penalty)
        ids = anchor_groups(rows, similarity_threshold=similarity_threshold)
        n = int(ids.max()) + 1
    else:
        raise ValueError(f"unknown level {level!r}: use 'L2' or 'L3'")

    def seg_sum(x: Tensor) -> Tensor:
        return torch.zeros(n, dtype=_F64).index_add_(0, ids, x)

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
    ``adrs/shaping_abs_mean`` (|shaping| over all tokens, 0 in unshaped groups),
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
    gids, n_groups = _dense_ids([r.group for r in rows])
    strength = torch.zeros(n_groups, dtype=_F64).index_copy_(0, gids, base.strength.to(_F64))  # equal within g
    n_in_group = torch.zeros(n_groups, dtype=_F64).index_add_(0, gids, torch.ones(len(rows), dtype=_F64))
    shaped = (n_in_group >= 2) & (strength >= EPS_STD)  # [G]
    tok_group = gids[tok_row]  # [N]
    tok_gate = gate[tok_row]
    signal = tok_gate * qhat if tva_apply == "paper" else qhat
    g_count, g_mean, g_std = _segment_stats(signal, tok_group, n_groups)
    z = (signal - g_mean[tok_group]) / (g_std[tok_group] ** 2 + 1e-8).sqrt()
    if tva_apply == "after_whitening":
        z = tok_gate * z
    token_shaped = shaped[tok_group] & (g_count[tok_group] >= 2)
    z = torch.where(token_shaped, z, torch.zeros_like(z))

    # adaptive clip; the median runs over every group with an env signal, a single-row group
    # counting as std 1 (verl's std of one score), as the reference does
    median_strength = torch.where(n_in_group < 2, torch.ones_like(strength), strength)
    with_signal = median_strength >= EPS_STD
    if clip is None or clip <= 0:
        limit = torch.full((n_groups,), float("inf"), dtype=_F64)
    elif adaptive_clip and bool(shaped.any()):
        limit = clip * torch.clamp(strength / (median_strength[with_signal].median() + EPS_STD), max=1.0)
    else:
        limit = torch.full((n_groups,), float(clip), dtype=_F64)
    raw = eta_s * z
    tok_limit = limit[tok_group]
    shaping = torch.maximum(torch.minimum(raw, tok_limit), -tok_limit)
    clipped = token_shaped & (raw.abs() > tok_limit)

    adv = base.advantages.to(_F64)[tok_row] + shaping
    n_shaped_tokens = int(token_shaped.sum())
    metrics = {
        "adrs/tva_mean": float(tva.mean()),
        "adrs/gate_mean": float(tok_gate.mean()),
        "adrs/shaping_abs_mean": float(shaping.abs().mean()),
        "adrs/clip_fraction": float(clipped.sum()) / n_shaped_tokens if n_shaped_tokens else 0.0,
        "adrs/shaped_group_fraction": float(shaped.double().mean()),
    }
    return [t.float() for t in torch.split(adv, lengths.tolist())], metrics
