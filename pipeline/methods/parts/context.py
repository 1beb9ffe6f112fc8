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

    def build_provider(self, *, env_name: str, seed: int, always_on: bool) -> ContextProvider | None:
        return None


def _context_part(provider_cls: type[ContextProvider]) -> type[Part]:
    class ContextPart(Part):
        slot, kind = "context", provider_cls.kind
        Options = provider_cls.Options

        def build_provider(self, *, env_name: str, seed: int, always_on: bool) -> ContextProvider:
            """The provider (built by the method: ``always_on`` is the select part's)."""
            return provider_cls(self.opts, env_name=env_name, seed=seed, always_on=always_on)

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
    carries_context = False


@part
class ContextStudent(Part):
    slot, kind = "student", "context"
    carries_context = True
