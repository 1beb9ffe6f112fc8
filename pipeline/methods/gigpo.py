"""``gigpo``: GRPO plus anchor-state step advantages (verl-agent ``gigpo/core_gigpo.py``).

``A = A_E + w * A_S`` per row, broadcast to the row's tokens. ``A_E`` is the GRPO row advantage
(``pipeline.algorithm.advantages.grpo_advantages``, "mean_std_norm"; ``norm_std: false`` gives verl-agent's
"mean_norm"). ``A_S``: within each episode group, rows whose current observation is identical
(or, with ``similarity_threshold``, difflib ratio >= threshold against a cluster's first member)
form an anchor group; ``R_t = sum_k gamma^(k-t) r_k`` over the env rewards, minus the
invalid-action penalty on the invalid row only (after discounting, as verl-agent); ``A_S = (R_t - mean) / (std + 1e-6)`` in the anchor group, 0 for singletons.
Defaults: gamma = 0.95, w = 1.0 (``step_weight``), exact anchors. No teacher, no aux term.
"""
from __future__ import annotations

import dataclasses

from pipeline.algorithm.advantages import gigpo_advantages, rows_from_groups
from pipeline.orchestration.batches import Credit
from pipeline.methods.base import register_method
from pipeline.methods.common import check_types, require
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.core.types import EpisodeGroup


@dataclasses.dataclass
class GigpoFields:
    gamma: float = 0.95  # discount of the step return R_t, in [0, 1]
    step_weight: float = 1.0  # w: weight of the anchor-state advantage A_S, >= 0
    similarity_threshold: float | None = None  # None = identical observations; e.g. 0.95 = fuzzy anchors

    def validate_gigpo(self, method: str) -> None:
        require(0.0 <= self.gamma <= 1.0, f"method={method}: method.gamma={self.gamma} must be in [0, 1]")
        require(self.step_weight >= 0.0, f"method={method}: method.step_weight={self.step_weight} must be >= 0")
        t = self.similarity_threshold
        require(t is None or 0.0 < t < 1.0,
                f"method={method}: method.similarity_threshold={t} must be in (0, 1), or null for exact anchors")


@register_method
class GiGPO(GRPO):
    name = "gigpo"

    @dataclasses.dataclass
    class Options(GigpoFields, GRPO.Options):
        name: str = "gigpo"

        def validate(self) -> None:
            check_types(self)
            self.validate_gigpo("gigpo")

    def row_advantages(self, groups: list[EpisodeGroup]):
        o = self.opts
        return gigpo_advantages(rows_from_groups(groups), invalid_penalty=self.invalid_action_penalty,
                                gamma=o.gamma, step_weight=o.step_weight,
                                similarity_threshold=o.similarity_threshold,
                                mean_std_across_rows=o.mean_std_across_rows, norm_std=o.norm_std)

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        adv = self.row_advantages(groups)
        a = adv.advantages
        metrics = {"adv/mean": float(a.mean()), "adv/abs_mean": float(a.abs().mean()),
                   "adv/zero_frac": float((a == 0).float().mean()), **adv.metrics}
        return Credit(advantages=broadcast(groups, a.tolist()), metrics=metrics)
