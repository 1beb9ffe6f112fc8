"""``context`` and ``student`` parts.

``context``: which privileged context the teacher gets (``none``, or a provider kind of
``pipeline.context.providers``: ``skills``, ``feedback``); its options are the provider's.
``student``: ``plain`` prompts, or ``context`` = the student's own prompts carry the same context
(``skill_grpo``, RetireOPD's phase 1).
"""

from __future__ import annotations

from pipeline.context.providers import PROVIDERS, ContextProvider
from pipeline.methods.parts.base import PARTS, Part, part


@part
class NoContext(Part):
    slot, kind = "context", "none"
    provider: ContextProvider | None = None


def _context_part(provider_cls: type[ContextProvider]) -> type[Part]:
    class ContextPart(Part):
        slot, kind = "context", provider_cls.kind
        Options = provider_cls.Options
        provider: ContextProvider | None = None  # built by the method (it needs the select part)

    ContextPart.__name__ = f"{provider_cls.kind.title()}Context"
    return part(ContextPart)


def sync_context_parts() -> None:
    """A context part for every registered provider kind (providers may be registered later)."""
    for cls in PROVIDERS.values():
        if cls.kind not in PARTS["context"]:
            _context_part(cls)


sync_context_parts()


@part
class PlainStudent(Part):
    slot, kind = "student", "plain"


@part
class ContextStudent(Part):
    slot, kind = "student", "context"
