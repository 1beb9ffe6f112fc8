"""``teacher`` parts: whose log-probs teach.

- ``none``: no teacher (grpo, gigpo, skill_grpo).
- ``self``: the policy itself, at the weights the scorer holds (synced like a rollout worker's; the
  records carry ``teacher_version``), or the learner's current weights for a learner-side teacher
  (estimator ``full_kl``).
- ``frozen``: a separate checkpoint (``teacher_path``). Left null, a first phase trains it: the
  same method's advantage and context with the context in the *student's* prompt
  (``skill_grpo`` for skills) for ``phase1_steps`` steps; its validation success rate with the
  context is SR_T, written to ``teacher.json`` beside its HF weights (RetireOPD: one command runs
  both phases).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from pipeline.methods.options import require
from pipeline.methods.parts.base import Part

TEACHER_META = "teacher.json"  # next to the phase-1 teacher's HF weights


def write_teacher_meta(hf_dir: str | Path, success_rate: float, **extra) -> Path:
    """Store SR_T (and anything else worth keeping) with the teacher."""
    path = Path(hf_dir) / TEACHER_META
    path.write_text(json.dumps({"success_rate": float(success_rate), **extra}, indent=1))
    return path


def read_teacher_success_rate(hf_dir: str | Path) -> float:
    path = Path(hf_dir) / TEACHER_META
    if not path.exists():
        raise ValueError(
            f"method.teacher_success_rate is null and {path} does not exist; set "
            "method.teacher_success_rate=<SR_T> or point method.teacher_path at a phase-1 teacher "
            "exported by the two-phase command"
        )
    return float(json.loads(path.read_text())["success_rate"])


class Teacher(Part, slot="teacher"):
    """What the method asks of any teacher part (the defaults are "no teacher")."""

    present = False  # there is a teacher
    follows_policy = False  # its weights are the policy's (synced like a rollout worker's, or the live engine's)
    path: str | None = None  # HF dir of weights of its own (a frozen teacher); None: the policy
    success_rate: float | None = None  # SR_T, known for a frozen teacher

    @property
    def needs_first_phase(self) -> bool:
        """Whether a first phase must train this teacher before the method can run."""
        return False

    def check_ready(self) -> None:
        """Raise when the teacher cannot score yet."""


class NoTeacher(Teacher, kind="none"):
    """No teacher."""


class SelfTeacher(Teacher, kind="self"):
    """The policy itself, at the weights the scorer holds (or the learner's, learner-side)."""

    present = follows_policy = True


class FrozenTeacher(Teacher, kind="frozen"):
    """A separate checkpoint, trained first by a phase of its own when none is given."""

    present = True

    @dataclasses.dataclass
    class Options:
        teacher_path: str | None = None  # HF dir of the frozen teacher; None = train it first (phase 1)
        teacher_success_rate: float | None = None  # SR_T in [0, 1]; None = read from the phase-1 run
        phase1_steps: int = 150  # steps of phase 1 when teacher_path is None

        def validate(self, method: str) -> None:
            sr = self.teacher_success_rate
            require(
                sr is None or 0.0 <= sr <= 1.0,
                f"method={method}: method.teacher_success_rate={sr} must be in [0, 1] or null",
            )
            require(self.phase1_steps >= 1, f"method={method}: method.phase1_steps={self.phase1_steps} must be >= 1")
            require(
                self.teacher_path is None or bool(str(self.teacher_path)),
                f"method={method}: method.teacher_path is empty; use null to train the teacher first",
            )

    def __init__(self, opts, setting):
        super().__init__(opts, setting)
        self.path = opts.teacher_path
        sr = opts.teacher_success_rate
        if sr is None and self.path is not None:
            try:
                sr = read_teacher_success_rate(self.path)
            except ValueError as e:
                raise ValueError(f"method={setting.method}: {e}") from None
        self.success_rate = sr

    @property
    def needs_first_phase(self) -> bool:
        return self.path is None

    def check_ready(self) -> None:
        if self.path is None:
            raise RuntimeError(
                f"method={self.setting.method} has no teacher: set method.teacher_path=<phase-1 HF dir> (with "
                "method.teacher_success_rate or its teacher.json), or launch with the two-phase "
                "command, which trains the teacher first"
            )

    def adopt(self, hf_dir: str, success_rate: float) -> None:
        if not (math.isfinite(success_rate) and 0.0 <= success_rate <= 1.0):
            raise ValueError(f"{self.setting.method}: the teacher's success rate must be in [0, 1], got {success_rate}")
        write_teacher_meta(hf_dir, success_rate)
        self.path, self.success_rate = str(hf_dir), float(success_rate)

    def state_dict(self) -> dict:
        return {"teacher_path": self.path, "teacher_success_rate": self.success_rate}

    def load_state_dict(self, state: dict) -> None:
        self.path, self.success_rate = state["teacher_path"], state["teacher_success_rate"]
