"""The context-provider interface (see ``pipeline.context.providers`` for the kinds and the registry)."""

from __future__ import annotations

import abc
import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.context.placement import PrivilegedPrompt
from pipeline.core.types import Episode, EpisodeGroup, Message, TeacherNeeds, TurnRecord


def task_seed_of(task_text: str) -> int:
    """A stable per-task seed (the G episodes of a group share the task, hence the skills)."""
    return zlib.crc32(task_text.encode())


def turn_feedback(episode: Episode, turn_index: int, always_on: bool = False) -> list[str]:
    """Feedback strings for one row: failed criteria failing at ``turn_index`` (with ``always_on``:
    every failed criterion of the episode), non-empty ones only, in criterion order."""
    return [
        c.feedback
        for c in episode.criteria
        if not c.passed and (always_on or c.failing_turn == turn_index) and c.feedback.strip()
    ]


@dataclass
class TeacherSpec:
    """What a teacher scorer must do for a method: which rows, with which context, on whose weights,
    computing what (the signal's ``TeacherNeeds``)."""

    provider: "ContextProvider"
    selects: Callable[[Episode, TurnRecord], bool]  # rows to score
    follows_policy: bool  # its weights are the policy's (synced, or the live rollout engine's)
    weights_path: str | None = None  # a checkpoint of its own (a frozen teacher); None: the policy
    needs: TeacherNeeds = field(default_factory=TeacherNeeds)
    rows: str = "all"  # the select part's kind: "all" | "failed_turns"

    @property
    def context(self) -> str:
        return self.provider.kind

    @property
    def placement(self) -> str | None:
        return getattr(self.provider.opts, "placement", None)

    @property
    def always_on(self) -> bool:
        return self.provider.always_on


# ----- what the rollout worker applies ---------------------------------------------------------------
class StudentView(abc.ABC):
    """Privileged context in the student's own prompt; applied by the rollout worker to every
    prompt it builds. Must pickle small (it travels with every ``run_group``)."""

    @abc.abstractmethod
    def apply(
        self, messages: list[Message], env, turn: int, default_system: str | None
    ) -> tuple[PrivilegedPrompt, list[str]]:
        """The prompt to render for this turn, and the ids of the context offered (for UCB)."""


# ----- providers ---------------------------------------------------------------------------------------
class ContextProvider(abc.ABC):
    """One kind of privileged context (see the module docstring)."""

    kind: ClassVar[str] = ""
    # The preset of a first phase that trains a frozen teacher with this context in the
    # student's own prompts (RetireOPD); None: named after the method (``<name>_phase1``).
    first_phase_preset: ClassVar[str | None] = None

    @dataclasses.dataclass
    class Options:
        def validate(self, method: str) -> None:
            pass

    def __init__(self, opts, *, env_name: str, seed: int = 0, always_on: bool = False):
        # always_on: the select part's (feedback on every row of an episode with a failed criterion)
        self.opts, self.env_name, self.seed, self.always_on = opts, env_name, seed, always_on

    def retrieval(self) -> dict | None:
        """The skill retrieval options when this context retrieves skills, else None."""
        return None

    @abc.abstractmethod
    def teacher_prompt(self, prompts, episode: Episode, row: TurnRecord) -> list[int] | None: ...

    @abc.abstractmethod
    def student_view(self, first_attempt: Episode | None = None) -> StudentView | None: ...

    def observe(self, groups: list[EpisodeGroup]) -> None:  # noqa: B027 - optional hook
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - optional hook
        pass
