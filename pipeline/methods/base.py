"""The method interface: how a scored batch of groups becomes advantages and loss components.

A method is a registered class. It declares what it needs upstream (a teacher: none, self or
frozen; privileged context for the teacher or for the student's own prompts) and turns the step's
groups into a ``Credit``: per-token advantages plus auxiliary per-token tensors and the aux loss
terms with their coefficients. Controllers (schedules, retirement) live inside the method and are
checkpointed with it. The learner and the controller never branch on a method's name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from pipeline.orchestration.batches import Credit
from pipeline.core.types import EpisodeGroup


@dataclasses.dataclass
class TeacherSpec:
    """What the teacher scorer must do for a method (``Method.teacher_spec``)."""

    source: str  # "self" (the policy, synced weights) | "frozen" (a separate checkpoint)
    context: str  # "skills" | "feedback": the privileged context of the teacher prompt
    placement: str = "raw_prefix"  # skills placement: raw_prefix | system | user
    rows: str = "all"  # "all" rows, or only "failed_turns" (rows where a criterion failed)
    always_on: bool = False  # feedback on every row of an episode with a failed criterion
    frozen_path: str | None = None  # HF dir of the frozen teacher (source == "frozen")


class Method:
    """Base class; subclasses set ``name``, ``Options`` and implement ``credit``."""

    name: ClassVar[str] = ""

    @dataclasses.dataclass
    class Options:
        name: str = ""

    def __init__(self, options: Any, *, total_steps: int, invalid_action_penalty: float):
        self.opts = options
        self.total_steps = total_steps
        self.invalid_action_penalty = invalid_action_penalty

    # ----- what the method needs upstream -----------------------------------------------------------
    def teacher_spec(self) -> TeacherSpec | None:
        """What the scorer must compute, or None when the method has no teacher scorer."""
        return None

    def teacher_active(self, step: int) -> bool:
        """Whether the scorer must run this step (False once a teacher retired)."""
        return self.teacher_spec() is not None

    def attach(self, prompts) -> None:
        """Receive the driver's ``TeacherPrompts`` (tokenised privileged prompts), for methods
        whose learner-side teacher forward needs privileged input ids (targeted guidance, full)."""
        self.prompts = prompts

    def skills_for_student(self) -> dict | None:
        """Retrieval options when the student itself sees skills (skill_grpo), else None."""
        return None

    def skills_for_teacher(self) -> dict | None:
        """Retrieval options when the teacher prompt carries skills, else None."""
        return None

    def required_val_every(self) -> int | None:
        """A ``trainer.val_every`` the method depends on (retirement windows), else None."""
        return None

    # ----- multi-phase recipes (e.g. RetireOPD trains its own teacher first) -----------------------
    @classmethod
    def prerequisite(cls, method_dict: dict) -> dict | None:
        """The method dict of a run that must precede this one, or None."""
        return None

    @classmethod
    def prerequisite_steps(cls, method_dict: dict) -> int:
        return 0

    def adopt_prerequisite(self, hf_dir: str, success_rate: float) -> None:
        """Take the finished prerequisite run's model and its validation success rate."""

    @classmethod
    def finished_prerequisite(cls, hf_dir) -> float | None:
        """The success rate recorded with a prerequisite run's final model if that run finished
        (resume after a crash between the phases), else None."""
        return None

    # ----- credit assignment ----------------------------------------------------------------------
    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        raise NotImplementedError

    # ----- controller hooks -----------------------------------------------------------------------
    def after_train_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """See the learner's metrics of the step just taken (e.g. an aux term's statistics);
        returns metrics to log."""
        return {}

    def on_validation(self, step: int, success_rate: float) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


METHODS: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    if not cls.name or cls.name in METHODS:
        raise ValueError(f"method class {cls.__name__} needs a unique name (got {cls.name!r})")
    METHODS[cls.name] = cls
    return cls


def parse_options(cls: type[Method], raw: dict[str, Any]) -> Any:
    """``method.*`` from Hydra -> the method's Options dataclass; unknown keys are an error."""
    known = {f.name for f in dataclasses.fields(cls.Options)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"method={cls.name} has no option(s) {unknown}; its options are {sorted(known)}")
    try:
        opts = cls.Options(**raw)
    except TypeError as e:
        raise ValueError(f"method={cls.name}: {e}") from None
    check = getattr(opts, "validate", None)
    if check is not None:
        check()
    return opts
