"""Privileged context as one interface: what the teacher is told that the student is not.

A method names one provider kind (its ``context`` part); the teacher scorer, a learner-side
teacher (targeted guidance's full KL), the student's own prompts (``skill_grpo``, RetireOPD's
phase 1) and the privileged validation that measures the privilege gap all go through it:

- ``teacher_prompt(prompts, episode, row)``: the teacher's prompt ids for one turn row (the row's
  own prompt ids plus the privileged text, ``pipeline.context.prompts``), or None when the row
  has no privileged context (feedback kinds: no failed criterion at that turn).
- ``student_view(first_attempt=None)``: a small picklable ``StudentView`` the rollout worker
  applies to every prompt it builds, so the student itself sees the context; feedback needs a
  first attempt of the task (its failed criteria), the others do not.
- ``observe(groups)``: learn from outcomes (the skills' UCB statistics); ``state_dict`` /
  ``load_state_dict``: checkpointed with the run.

Kinds: ``skills`` (retrieved from a skill bank by the task: full | keyword | random | ucb, at a
placement raw_prefix | system | user | user_front) and ``feedback`` (the failed criteria's feedback strings,
right before the failing turn) and ``hints`` (privileged state the env writes as text,
``TextEnv.privileged_hint``). A new kind is one class here registered in ``PROVIDERS``.

One skill retriever, on the driver, owns the UCB statistics: a student view carries a snapshot of
them to the rollout worker, the worker records which skills it offered in
``Episode.context_ids``, and ``observe`` updates the statistics from the groups that come back.
"""

from __future__ import annotations

from pipeline.context.base import ContextProvider, StudentView, TeacherSpec, task_seed_of, turn_feedback
from pipeline.context.feedback import FeedbackContext, FeedbackView
from pipeline.context.hints import HintsContext, HintsView
from pipeline.context.skills import SkillsContext, SkillsView

PROVIDERS: dict[str, type[ContextProvider]] = {p.kind: p for p in (SkillsContext, FeedbackContext, HintsContext)}


def register_provider(cls: type[ContextProvider]) -> type[ContextProvider]:
    """Make a context kind available to methods (``parts: {context: <kind>}``)."""
    if not cls.kind or cls.kind in PROVIDERS:
        raise ValueError(f"context provider {cls.__name__}: kind {cls.kind!r} missing or taken")
    PROVIDERS[cls.kind] = cls
    return cls


__all__ = [
    "ContextProvider",
    "FeedbackContext",
    "FeedbackView",
    "HintsContext",
    "HintsView",
    "PROVIDERS",
    "SkillsContext",
    "SkillsView",
    "StudentView",
    "TeacherSpec",
    "register_provider",
    "task_seed_of",
    "turn_feedback",
]
