"""The base of every part, the slots, and the registry ``@part`` fills (see ``pipeline.methods.parts``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

SLOTS = ("reward", "advantage", "teacher", "context", "student", "select", "signal", "schedule")
DEFAULT_KINDS = {
    "reward": "env",
    "advantage": "grpo",
    "teacher": "none",
    "context": "none",
    "student": "plain",
    "select": "all",
    "signal": "none",
    "schedule": "constant",
}


@dataclass(frozen=True)
class Setting:
    """What every part may need to know about the method it is part of."""

    method: str  # the preset's name, for messages
    prefix: str  # metric prefix of the method's own metrics (sdar/, opd/, tg/, adrs/)
    invalid_action_penalty: float


class Part:
    slot: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    # A signal that trains on the hinted expert's episodes (the rollout workers play them too).
    demonstrations: ClassVar[bool] = False

    @dataclasses.dataclass
    class Options:
        def validate(self, method: str) -> None:
            pass

    def __init__(self, opts, setting: Setting):
        self.opts, self.setting = opts, setting


PARTS: dict[str, dict[str, type[Part]]] = {slot: {} for slot in SLOTS}


def part(cls: type[Part]) -> type[Part]:
    if cls.slot not in PARTS or not cls.kind or cls.kind in PARTS[cls.slot]:
        raise ValueError(f"part {cls.__name__}: slot {cls.slot!r} / kind {cls.kind!r} invalid or taken")
    PARTS[cls.slot][cls.kind] = cls
    return cls


__all__ = ["DEFAULT_KINDS", "PARTS", "Part", "SLOTS", "Setting", "part"]
