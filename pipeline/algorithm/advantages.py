"""Credit assignment before the learner: GRPO and GiGPO advantages (no Ray, no model).

Input form. A batch is a flat list of ``RowInput``, one per assistant turn, in any order; rows
name their episode group (the G episodes of one task under one seed: the unit of statistics),
their episode and their turn index. ``rows_from_groups`` builds it from ``EpisodeGroup`` records
(row order = ``group.rows()`` concatenated). Outputs follow the input row order: one scalar
advantage per row (broadcast to the row's tokens by the batch builder). Statistics run in float64; outputs are float32.

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

ADRS's per-token advantages build on these: ``pipeline/algorithm/adrs.py``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.core.types import EpisodeGroup

EPS_STD = 1e-6  # GRPO / GiGPO denominator epsilon and the "zero std" threshold
F64 = torch.float64


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


def dense_ids(keys: Sequence[Hashable]) -> tuple[Tensor, int]:
    index: dict[Hashable, int] = {}
    ids = [index.setdefault(k, len(index)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), len(index)


def segment_stats(x: Tensor, ids: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment count, mean and unbiased std (std = 0 where count < 2)."""
    count = torch.zeros(n, dtype=F64).index_add_(0, ids, torch.ones_like(x))
    mean = torch.zeros(n, dtype=F64).index_add_(0, ids, x) / count.clamp(min=1)
    sq = torch.zeros(n, dtype=F64).index_add_(0, ids, (x - mean[ids]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return count, mean, std


def _normalise(values: Tensor, ids: Tensor, count: Tensor, mean: Tensor, std: Tensor, norm_std: bool) -> Tensor:
    """``(v - mean_g) / (std_g + eps)`` with the degenerate-group rules of the module docstring."""
    denom = torch.where(std < EPS_STD, torch.ones_like(std), std + EPS_STD) if norm_std else torch.ones_like(std)
    out = (values - mean[ids]) / denom[ids]
    return torch.where(count[ids] >= 2, out, torch.zeros_like(out))


def row_scores(rows: Sequence[RowInput], invalid_penalty: float) -> Tensor:
    """``R_row = episode_reward - invalid_penalty * (not action_valid)``, ``# [B]`` float64."""
    return torch.tensor([r.episode_reward - invalid_penalty * (not r.action_valid) for r in rows], dtype=F64)


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
    gids, n_groups = dense_ids([r.group for r in rows])
    if mean_std_across_rows:
        count, mean, std = segment_stats(scores, gids, n_groups)
    else:
        episodes: dict[tuple[Hashable, Hashable], tuple[int, float]] = {}
        for gid, r in zip(gids.tolist(), rows):
            episodes.setdefault((r.group, r.episode), (gid, r.episode_reward))
        ep_gids = torch.tensor([g for g, _ in episodes.values()], dtype=torch.long)
        ep_rewards = torch.tensor([v for _, v in episodes.values()], dtype=F64)
        count, mean, std = segment_stats(ep_rewards, ep_gids, n_groups)
    adv = _normalise(scores, gids, count, mean, std, norm_std)
    group_rows = torch.zeros(n_groups, dtype=torch.long).index_add_(0, gids, torch.ones_like(gids))
    return RowAdvantages(advantages=adv.float(), strength=std[gids].float(), group_rows=group_rows[gids])


def discounted_returns(rows: Sequence[RowInput], *, gamma: float, invalid_penalty: float = 0.0) -> Tensor:
    """``R_t = r_t + gamma * R_{t+1}`` over the env step rewards along each episode's turns (sorted
    by ``turn``), then ``- invalid_penalty`` on invalid rows only, ``# [B]`` float64."""
    r = torch.tensor([row.step_reward for row in rows], dtype=F64)
    by_episode: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i, row in enumerate(rows):
        by_episode.setdefault((row.group, row.episode), []).append(i)
    out = torch.zeros(len(rows), dtype=F64)
    for members in by_episode.values():
        running = 0.0
        for i in sorted(members, key=lambda j: rows[j].turn, reverse=True):
            running = float(r[i]) + gamma * running
            out[i] = running
    invalid = torch.tensor([not row.action_valid for row in rows], dtype=torch.bool)
    return out - invalid_penalty * invalid.to(F64)


def anchor_groups(rows: Sequence[RowInput], *, similarity_threshold: float | None = None) -> Tensor:
    """Anchor-group id per row ``# [B]`` (ids unique across the batch; never across episode groups)."""
    if similarity_threshold is None:
        return dense_ids([(r.group, r.anchor) for r in rows])[0]
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
    count, mean, std = segment_stats(returns, aids, n_anchor)
    step = _normalise(returns, aids, count, mean, std, norm_std)
    adv = episode.advantages.double() + step_weight * step

    gids, n_groups = dense_ids([r.group for r in rows])
    strength = torch.zeros(n_groups, dtype=F64).scatter_reduce_(0, gids, adv.abs(), "amax", include_self=False)
    return RowAdvantages(
        advantages=adv.float(),
        strength=strength[gids].float(),
        group_rows=episode.group_rows,
        metrics={
            "gigpo/anchor_group_size_mean": float(count.mean()) if n_anchor else 0.0,
            "gigpo/singleton_anchor_fraction": float((count[aids] < 2).double().mean()) if len(rows) else 0.0,
        },
    )
