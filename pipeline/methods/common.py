"""Small parts shared by the method modules: skill-retrieval options and teacher log-prob rows.

Skill retrieval options (``SkillFields``) travel as one flat group of ``method.*`` keys so that
each is a plain Hydra override (``method.skill_mode=ucb method.skill_top_k=3``). They become the
dict ``{"bank", "mode", "top_k", "placement"}`` that ``skills_for_student()`` (the student sees
the skills, ``skill_grpo``) and ``skills_for_teacher()`` (the teacher prompt carries them,
``sdar``, ``skill_sd``, ``adrs``, ``retire_opd``) hand to the driver; the driver owns the
``envs.skills.SkillRetriever`` and the prompt builder (``pipeline.context.placement``).
"""
from __future__ import annotations

import dataclasses
import types
import typing

from envs.skills import RetrievalMode
from pipeline.context.placement import Placement
from pipeline.core.types import EpisodeGroup


@dataclasses.dataclass
class SkillFields:
    """Retrieval options of a method that puts skills in a prompt."""

    skill_bank: str = "alfworld"  # a packaged bank name (envs/skill_banks) or a path to a bank JSON
    skill_mode: str = "keyword"  # full | keyword | random | ucb
    skill_top_k: int = 6  # skills retrieved (keyword mode: general skills; else all), >= 1
    placement: str = "raw_prefix"  # where the skills go: raw_prefix | system | user

    def skill_retrieval(self) -> dict:
        return {"bank": self.skill_bank, "mode": self.skill_mode, "top_k": self.skill_top_k,
                "placement": self.placement}

    def validate_skills(self, method: str) -> None:
        if not self.skill_bank:
            raise ValueError(f"method={method}: method.skill_bank is empty; name a packaged bank "
                             "(e.g. alfworld) or a bank JSON path")
        modes = [m.value for m in RetrievalMode]
        if self.skill_mode not in modes:
            raise ValueError(f"method={method}: method.skill_mode={self.skill_mode!r}; choose one of {modes}")
        if self.skill_top_k < 1:
            raise ValueError(f"method={method}: method.skill_top_k={self.skill_top_k} must be >= 1")
        places = [p.value for p in Placement]
        if self.placement not in places:
            raise ValueError(f"method={method}: method.placement={self.placement!r}; choose one of {places}")


def require(cond: bool, msg: str) -> None:
    """Options validation: raise ValueError with the message when ``cond`` is false."""
    if not cond:
        raise ValueError(msg)


def _accepts(hint, value) -> bool:
    if hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, hint)


def check_types(opts) -> None:
    """Every option has the type its field declares (Hydra hands over YAML scalars as parsed)."""
    hints = typing.get_type_hints(type(opts))
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if not _accepts(hints[f.name], value):
            raise ValueError(f"method={opts.name}: method.{f.name}={value!r} should be of type "
                             f"{hints[f.name]}".replace("typing.", "").replace("<class '", "").replace("'>", ""))


def teacher_rows(groups: list[EpisodeGroup], method: str) -> list[list[float]]:
    """Teacher log-probs of every row ``[B][n_response]``; every row must have been scored."""
    out = []
    for i, row in enumerate(t for g in groups for t in g.rows()):
        if row.teacher_logprobs is None:
            raise ValueError(f"method={method}: row {i} (turn {row.turn_index}) has no teacher log-probs; "
                             "the teacher scorer must score every row while the teacher is active")
        if len(row.teacher_logprobs) != row.n_response:
            raise ValueError(f"method={method}: row {i} has {len(row.teacher_logprobs)} teacher log-probs "
                             f"for {row.n_response} response tokens")
        out.append([float(x) for x in row.teacher_logprobs])
    return out

