"""``context`` and ``student`` parts.

``context``: which privileged context the teacher gets, ``none`` or a provider kind of
``pipeline.context.providers`` (``skills``, ``feedback``, ``hints``: each provider's module says
what it gives); its options are the provider's.

- ``none`` (context): no privileged context.
- ``plain`` (student): the student's own prompts carry no privileged context.
- ``context`` (student): the student's own prompts carry the same context as the teacher's
  (``skill_grpo``, RetireOPD's phase 1).
"""

from __future__ import annotations

from pipeline.context.providers import PROVIDERS, ContextProvider
from pipeline.methods.parts.base import PARTS, Part


class Context(Part, slot="context"):
    """What the method asks of any context part: its provider (the default: none)."""

    def build_provider(self, *, env_name: str, seed: int, always_on: bool) -> ContextProvider | None:
        """The provider (built by the method: ``always_on`` is the select part's)."""
        return None


class Student(Part, slot="student"):
    """What the method asks of any student part."""

    carries_context = False  # the student's own prompts carry the privileged context too


class NoContext(Context, kind="none"):
    """No privileged context."""


def _context_part(provider_cls: type[ContextProvider]) -> type[Part]:
    class ContextPart(Context, kind=provider_cls.kind):
        Options = provider_cls.Options

        def build_provider(self, *, env_name: str, seed: int, always_on: bool) -> ContextProvider:
            return provider_cls(self.opts, env_name=env_name, seed=seed, always_on=always_on)

    ContextPart.__name__ = f"{provider_cls.kind.title()}Context"
    return ContextPart


def sync_context_parts() -> None:
    """A context part for every registered provider kind (providers may be registered later)."""
    for cls in PROVIDERS.values():
        if cls.kind not in PARTS["context"]:
            _context_part(cls)


sync_context_parts()


class PlainStudent(Student, kind="plain"):
    """The student's own prompts carry no privileged context."""


class ContextStudent(Student, kind="context"):
    """The student's own prompts carry the teacher's context too (skill_grpo, RetireOPD's phase 1)."""

    carries_context = True
