"""The base of every part, the slots, and the registry a part joins by naming its kind (see
``pipeline.methods.parts``)."""

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


PARTS: dict[str, dict[str, type[Part]]] = {slot: {} for slot in SLOTS}


class Part:
    """A slot's base class names its slot, ``class Schedule(Part, slot="schedule")``; a part names
    its kind, ``class Window(Schedule, kind="window")``, and that registers it in ``PARTS`` (a
    subclass that names no kind is not a new part: it inherits its parent's)."""

    slot: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    # A signal that trains on the hinted expert's episodes (the rollout workers play them too).
    demonstrations: ClassVar[bool] = False

    @dataclasses.dataclass
    class Options:
        def validate(self, method: str) -> None:
            pass

    def __init_subclass__(cls, *, slot: str = "", kind: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if slot:
            if slot not in PARTS:
                raise ValueError(f"part {cls.__name__}: slot {slot!r} is not one of {SLOTS}")
            cls.slot = slot
        if kind:
            if not cls.slot or kind in PARTS[cls.slot]:
                raise ValueError(f"part {cls.__name__}: slot {cls.slot!r} / kind {kind!r} invalid or taken")
            cls.kind = kind
            PARTS[cls.slot][kind] = cls

    def __init__(self, opts, setting: Setting):
        self.opts, self.setting = opts, setting

    # What a resumed run needs of this part; most parts keep none (the schedule's retirement
    # rule and a frozen teacher's success rate do).
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


__all__ = ["DEFAULT_KINDS", "PARTS", "Part", "SLOTS", "Setting"]
