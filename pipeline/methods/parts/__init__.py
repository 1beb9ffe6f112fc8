"""The parts a method is made of, one slot each (``parts:`` in ``conf/method/<name>.yaml``):

| slot | kinds | decides |
|---|---|---|
| ``reward`` | ``env``, ``criteria`` | the episode reward the advantages use |
| ``advantage`` | ``grpo``, ``gigpo`` | row advantages (and the env-signal strength of a group) |
| ``teacher`` | ``none``, ``self``, ``frozen`` | whose log-probs teach: nobody, the policy's synced weights, a frozen checkpoint (trained first when none is given) |
| ``context`` | ``none``, ``skills``, ``feedback`` | the privileged context (``pipeline.context.providers``) |
| ``student`` | ``plain``, ``context`` | whether the student's own prompts carry the context too |
| ``select`` | ``all``, ``failed_turns`` | which rows (and tokens) the teacher signal touches |
| ``signal`` | ``none``, ``aux``, ``shaping``, ``null``, ``imitate`` | how the teacher enters: an aux loss (estimator, gate) or shaped advantages (ADRS TVA); the controls without a teacher: a fixed negative advantage (null baseline), NLL on the hinted expert's demonstrations (equal information) |
| ``schedule`` | ``constant``, ``window``, ``retirement`` | when the teacher signal is on, and at what scale |

Each part is a small class with an ``Options`` dataclass (defaults and a ``validate``), registered
by naming its kind (``class Window(Schedule, kind="window")``); a preset is a YAML naming one kind per slot plus option values, so a new combination
costs a YAML and a new kind of part costs one class here.
"""

from __future__ import annotations

from pipeline.methods.parts.base import DEFAULT_KINDS, PARTS, SLOTS, Part, Setting


def load_parts() -> None:
    """Import every module of this package: each registers its parts (a new kind of part is a
    new module here, or a class in an existing one; nothing lists them)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


__all__ = ["DEFAULT_KINDS", "PARTS", "Part", "SLOTS", "Setting", "load_parts"]
