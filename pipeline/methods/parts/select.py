"""``select`` parts: which rows, and which of their tokens, the teacher signal touches.

- ``all``: every token of every row (the teacher scores every row).
- ``failed_turns`` (targeted guidance): a row whose ``turn_index`` is the ``failing_turn`` of a
  failed rubric criterion of its episode (``always_on``: every row of an episode with a failed
  criterion). ``distill_thinking: true``: all tokens of such a row; ``false``: only those from
  ``thinking_len`` on (the response after ``</think>``). Only selected rows are scored.
"""

from __future__ import annotations

import dataclasses

from pipeline.core.types import Episode, TurnRecord
from pipeline.methods.parts.base import Part


class Select(Part, slot="select"):
    """The default: every row, every token."""

    always_on = False  # every row of an episode with a failed criterion (the feedback provider reads it)
    masks = False  # True: the batch carries a distill mask, rows not selected are not scored

    def selected(self, episode: Episode, row: TurnRecord) -> bool:
        return True

    def token_mask(self, episode: Episode, row: TurnRecord) -> list[float]:
        return [1.0] * row.n_response


class AllRows(Select, kind="all"):
    """Every token of every row."""


class FailedTurns(Select, kind="failed_turns"):
    """The rows of the turns that failed a rubric criterion (targeted guidance)."""

    masks = True

    @dataclasses.dataclass
    class Options:
        distill_thinking: bool = True  # also distill the <think> tokens of a failed turn
        always_on: bool = False  # ablation: distill every row of an episode with a failed criterion

    @property
    def always_on(self) -> bool:
        return self.opts.always_on

    def selected(self, episode: Episode, row: TurnRecord) -> bool:
        return any(not c.passed and (self.opts.always_on or c.failing_turn == row.turn_index) for c in episode.criteria)

    def token_mask(self, episode: Episode, row: TurnRecord) -> list[float]:
        if not self.selected(episode, row):
            return [0.0] * row.n_response
        start = 0 if self.opts.distill_thinking else min(row.thinking_len, row.n_response)
        return [1.0 if t >= start else 0.0 for t in range(row.n_response)]
