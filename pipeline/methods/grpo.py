"""``grpo``: GRPO as in verl-agent.

One row per assistant turn; row score = episode reward minus the invalid-action penalty on invalid
turns; ``A_row = (R_row - mean_g) / (std_g + 1e-6)`` over all turn rows of the group (or over its
episodes), broadcast to the row's tokens; PPO clip + dual clip in the learner. No auxiliary term,
no teacher. See ``pipeline/algorithm/advantages.py`` for the degenerate-group rules.
"""
from __future__ import annotations

import dataclasses

from pipeline.algorithm.advantages import grpo_advantages, rows_from_groups
from pipeline.orchestration.batches import Credit
from pipeline.methods.base import Method, register_method
from pipeline.core.types import EpisodeGroup


def broadcast(groups: list[EpisodeGroup], per_row: list[float]) -> list[list[float]]:
    """One scalar per row -> that value on every response token of the row."""
    rows = [t for g in groups for t in g.rows()]
    return [[float(a)] * r.n_response for a, r in zip(per_row, rows)]


@register_method
class GRPO(Method):
    name = "grpo"

    @dataclasses.dataclass
    class Options:
        name: str = "grpo"
        mean_std_across_rows: bool = True  # statistics over all turn rows (verl-agent) or episodes
        norm_std: bool = True  # False = Dr.GRPO (no division by the std)

    def row_advantages(self, groups: list[EpisodeGroup]):
        return grpo_advantages(rows_from_groups(groups), invalid_penalty=self.invalid_action_penalty,
                               mean_std_across_rows=self.opts.mean_std_across_rows,
                               norm_std=self.opts.norm_std)

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        adv = self.row_advantages(groups)
        a = adv.advantages
        metrics = {"adv/mean": float(a.mean()), "adv/abs_mean": float(a.abs().mean()),
                   "adv/zero_frac": float((a == 0).float().mean())}
        return Credit(advantages=broadcast(groups, a.tolist()), metrics=metrics)
