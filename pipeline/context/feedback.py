"""``feedback``: the feedback strings of the criteria that failed at a row's turn (targeted
guidance), right before the response; a student view needs a first attempt of the task."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.context.base import ContextProvider, StudentView, turn_feedback
from pipeline.context.placement import PrivilegedPrompt, insert_feedback


@dataclass
class FeedbackView(StudentView):
    feedback: dict[int, list[str]]  # turn -> feedback strings of the criteria that failed there

    def apply(self, messages, env, turn, default_system):
        lines = [f for t, fs in sorted(self.feedback.items()) if t <= turn for f in fs]
        return PrivilegedPrompt(messages=insert_feedback(messages, lines) if lines else list(messages)), []


class FeedbackContext(ContextProvider):
    """The feedback strings of the criteria that failed at a row's turn (targeted guidance), or,
    with ``always_on``, every failed criterion's feedback on every row of the episode."""

    kind = "feedback"

    @dataclasses.dataclass
    class Options:
        def validate(self, method: str) -> None:
            pass

    def teacher_prompt(self, prompts, episode, row):
        fb = turn_feedback(episode, row.turn_index, self.always_on)
        return prompts.feedback_ids(row, fb) if fb else None

    def student_view(self, first_attempt=None):
        if first_attempt is None:
            return None  # feedback exists only after an attempt
        per_turn: dict[int, list[str]] = {}
        for c in first_attempt.criteria:
            if not c.passed and c.feedback.strip():
                per_turn.setdefault(0 if self.always_on or c.failing_turn is None else c.failing_turn, []).append(
                    c.feedback
                )
        return FeedbackView(feedback=per_turn) if per_turn else None
