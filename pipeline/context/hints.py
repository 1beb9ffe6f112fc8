"""``hints``: privileged state of the task that the env itself knows and the student does not
(ALFWorld: where the task's objects are and where they go), as text, at a placement
raw_prefix | system | user | user_front.

The env writes it (``TextEnv.privileged_hint``) when an episode resets; the rollout worker keeps
it in ``Episode.privileged_hint``, so the teacher scorer, which has no env, reads it from the
episode, and a student view (privileged validation, a student trained with hints) asks the env.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.context.base import ContextProvider, StudentView
from pipeline.context.placement import Placement, with_privileged


@dataclass
class HintsView(StudentView):
    placement: str

    def apply(self, messages, env, turn, default_system):
        return with_privileged(messages, env.privileged_hint() or "", self.placement, default_system), []


class HintsContext(ContextProvider):
    kind = "hints"

    @dataclasses.dataclass
    class Options:
        placement: str = "system"  # where the hint goes: raw_prefix | system | user | user_front

        def validate(self, method: str) -> None:
            places = [p.value for p in Placement]
            if self.placement not in places:
                raise ValueError(f"method={method}: method.placement={self.placement!r}; choose one of {places}")

    def teacher_prompt(self, prompts, episode, row):
        if not episode.privileged_hint:
            return None  # an env without hints: the row is not distilled
        return prompts.skills_ids(row, episode.privileged_hint, self.opts.placement)

    def student_view(self, first_attempt=None):
        return HintsView(placement=self.opts.placement)
