"""``skills``: skills retrieved from a bank by the task (full | keyword | random | ucb), at a
placement raw_prefix | system | user | user_front. One retriever on the driver owns the UCB statistics; a
student view carries a snapshot of them, the worker records the offered ids in
``Episode.context_ids``, ``observe`` updates the statistics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from pipeline.context.base import ContextProvider, StudentView, task_seed_of
from pipeline.context.placement import Placement, with_privileged
from pipeline.context.skill_bank import RetrievalMode, SkillRetriever, load_bank


@lru_cache(maxsize=8)
def _bank(name: str):
    return load_bank(name)


@dataclass
class SkillsView(StudentView):
    bank: str
    mode: str
    top_k: int
    placement: str
    seed: int
    ucb_state: dict = field(default_factory=dict)

    def retriever(self) -> SkillRetriever:
        r = SkillRetriever(_bank(self.bank), self.mode, top_k=self.top_k, seed=self.seed)
        r.load_state_dict(self.ucb_state)
        return r

    def apply(self, messages, env, turn, default_system):
        got = self.retriever().retrieve(env.task_text, env.task_type, seed=task_seed_of(env.task_text))
        return with_privileged(messages, got.text, self.placement, default_system), list(got.skill_ids)


class SkillsContext(ContextProvider):
    kind = "skills"
    first_phase_preset = "skill_grpo"

    @dataclasses.dataclass
    class Options:
        skill_bank: str = "alfworld"  # a packaged bank name (envs/skill_banks) or a path to a bank JSON
        skill_mode: str = "keyword"  # full | keyword | random | ucb
        skill_top_k: int = 6  # skills retrieved (keyword mode: general skills; else all), >= 1
        placement: str = "raw_prefix"  # where the skills go: raw_prefix | system | user | user_front

        def validate(self, method: str) -> None:
            if not self.skill_bank:
                raise ValueError(
                    f"method={method}: method.skill_bank is empty; name a packaged bank "
                    "(e.g. alfworld) or a bank JSON path"
                )
            modes = [m.value for m in RetrievalMode]
            if self.skill_mode not in modes:
                raise ValueError(f"method={method}: method.skill_mode={self.skill_mode!r}; choose one of {modes}")
            if self.skill_top_k < 1:
                raise ValueError(f"method={method}: method.skill_top_k={self.skill_top_k} must be >= 1")
            places = [p.value for p in Placement]
            if self.placement not in places:
                raise ValueError(f"method={method}: method.placement={self.placement!r}; choose one of {places}")

    def __init__(self, opts, **kw):
        super().__init__(opts, **kw)
        self._retriever: SkillRetriever | None = None

    def retrieval(self) -> dict:
        """The retrieval options as one dict (what a student view carries)."""
        o = self.opts
        return {"bank": o.skill_bank, "mode": o.skill_mode, "top_k": o.skill_top_k, "placement": o.placement}

    @property
    def retriever(self) -> SkillRetriever:
        if self._retriever is None:  # the bank loads on first use, not when the method is built
            o = self.opts
            self._retriever = SkillRetriever(_bank(o.skill_bank), o.skill_mode, top_k=o.skill_top_k, seed=self.seed)
        return self._retriever

    def teacher_prompt(self, prompts, episode, row):
        # The G episodes of a group share the task, so this retrieval is the group's; the ids are
        # recorded for ``observe`` (UCB statistics of what the teacher was offered).
        got = self.retriever.retrieve(episode.task_text, episode.task_type, seed=task_seed_of(episode.task_text))
        episode.context_ids = list(got.skill_ids)
        return prompts.skills_ids(row, got.text, self.opts.placement)

    def student_view(self, first_attempt=None):
        o = self.opts
        return SkillsView(
            bank=o.skill_bank,
            mode=o.skill_mode,
            top_k=o.skill_top_k,
            placement=o.placement,
            seed=self.seed,
            ucb_state=self.retriever.state_dict(),
        )

    def observe(self, groups):
        if self.opts.skill_mode != RetrievalMode.UCB:
            return
        for g in groups:
            for ep in g.episodes:
                if ep.context_ids:
                    task_type = self.retriever.resolve_task_type(ep.task_text, ep.task_type)
                    self.retriever.update(task_type, ep.context_ids, ep.reward)

    def state_dict(self):
        return self.retriever.state_dict()

    def load_state_dict(self, state):
        self.retriever.load_state_dict(state)
