"""``advantage`` parts: row advantages (``pipeline.algorithm.advantages``), broadcast to tokens.

- ``grpo``: verl-agent's GRPO, ``A_row = (R_row - mean_g) / (std_g + 1e-6)`` over the group's
  turn rows (or its episodes), ``R_row`` = episode reward minus the invalid-action penalty on
  invalid turns; ``norm_std: false`` is Dr.GRPO.
- ``gigpo``: ``A = A_E + step_weight * A_S``, anchor-state step advantages with discount ``gamma``
  over identical (or, with ``similarity_threshold``, near-identical) observations.
"""

from __future__ import annotations

import dataclasses

from pipeline.algorithm.advantages import RowAdvantages, RowInput, gigpo_advantages, grpo_advantages
from pipeline.methods.options import require
from pipeline.methods.parts.base import Part


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """How a signal that shapes step returns (ADRS) discounts and matches anchor states: the
    advantage part's own, so that shaping and advantage agree."""

    gamma: float = 0.95  # discount of the step return
    similarity_threshold: float | None = None  # None: anchors are identical observations


class Advantage(Part, slot="advantage"):
    """What the method asks of any advantage part."""

    unit = "row"  # what an advantage is computed for: "row" | "anchor" (ADRS's level shapes it)

    def advantages(self, rows: list[RowInput]) -> RowAdvantages:
        raise NotImplementedError

    def step_options(self) -> StepOptions:
        """The discount and anchor matching a shaping signal uses (a row advantage has no anchor states)."""
        return StepOptions()


class Grpo(Advantage, kind="grpo"):
    """Group-normalized row advantages (verl-agent's GRPO; Dr.GRPO without the std)."""

    @dataclasses.dataclass
    class Options:
        mean_std_across_rows: bool = True  # statistics over all turn rows (verl-agent) or episodes
        norm_std: bool = True  # False = Dr.GRPO (no division by the std)

    def advantages(self, rows: list[RowInput]) -> RowAdvantages:
        return grpo_advantages(
            rows,
            invalid_penalty=self.setting.invalid_action_penalty,
            mean_std_across_rows=self.opts.mean_std_across_rows,
            norm_std=self.opts.norm_std,
        )


class Gigpo(Advantage, kind="gigpo"):
    """Episode advantages plus anchor-state step advantages (GiGPO)."""

    unit = "anchor"  # ADRS's L3 shapes an anchor-step advantage

    @dataclasses.dataclass
    class Options:
        mean_std_across_rows: bool = True
        norm_std: bool = True
        gamma: float = 0.95  # discount of the step return R_t, in [0, 1]
        step_weight: float = 1.0  # w: weight of the anchor-state advantage A_S, >= 0
        similarity_threshold: float | None = None  # None = identical observations; e.g. 0.95 = fuzzy anchors

        def validate(self, method: str) -> None:
            require(0.0 <= self.gamma <= 1.0, f"method={method}: method.gamma={self.gamma} must be in [0, 1]")
            require(self.step_weight >= 0.0, f"method={method}: method.step_weight={self.step_weight} must be >= 0")
            t = self.similarity_threshold
            require(
                t is None or 0.0 < t < 1.0,
                f"method={method}: method.similarity_threshold={t} must be in (0, 1), or null for exact anchors",
            )

    def advantages(self, rows: list[RowInput]) -> RowAdvantages:
        o = self.opts
        return gigpo_advantages(
            rows,
            invalid_penalty=self.setting.invalid_action_penalty,
            gamma=o.gamma,
            step_weight=o.step_weight,
            similarity_threshold=o.similarity_threshold,
            mean_std_across_rows=o.mean_std_across_rows,
            norm_std=o.norm_std,
        )

    def step_options(self) -> StepOptions:
        return StepOptions(gamma=self.opts.gamma, similarity_threshold=self.opts.similarity_threshold)
