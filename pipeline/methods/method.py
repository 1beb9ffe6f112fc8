"""A method composed of parts: what the controller, the run assembly and the scorer talk to.

``credit(groups, step)`` is the same for every method::

    R_episode  = reward part                     (env reward, or the criteria formula)
    A_row      = advantage part over the rows     (grpo | gigpo), broadcast to tokens
    scale      = schedule part at this step       (0 = the teacher is off: no teacher forward)
    signal part adds to the Credit                (an aux loss term, or shaped advantages)

The learner and the controller never see which parts a method has: the learner executes the
Credit's terms, the controller asks ``teacher_active`` / ``student_view`` and forwards the hooks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeline.algorithm.advantages import RowAdvantages, RowInput, rows_from_groups
from pipeline.context.providers import ContextProvider, StudentView, TeacherSpec
from pipeline.core.types import Credit, Episode, EpisodeGroup, TurnRecord
from pipeline.methods.options import flat_options
from pipeline.methods.parts.advantage import Advantage, StepOptions
from pipeline.methods.parts.base import Part, Setting
from pipeline.methods.parts.context import Context, Student
from pipeline.methods.parts.reward import Reward
from pipeline.methods.parts.schedule import Schedule
from pipeline.methods.parts.select import Select
from pipeline.methods.parts.signal import Signal
from pipeline.methods.parts.teacher import TEACHER_META, Teacher, read_teacher_success_rate


def broadcast(groups: list[EpisodeGroup], per_row: list[float]) -> list[list[float]]:
    """One scalar per policy row -> that value on every response token of the row, in the
    learner's row order (``rows_of``): a group's demonstration rows get 0 after its own rows."""
    values = iter(per_row)
    out: list[list[float]] = []
    for g in groups:
        out += [[float(next(values))] * r.n_response for r in g.rows()]
        out += [[0.0] * r.n_response for e in g.demonstrations for r in e.turns]
    return out


def policy_mask(groups: list[EpisodeGroup]) -> list[list[float]] | None:
    """1 on the policy's rows, 0 on demonstration rows (their log-probs are no behaviour's: the
    policy term and its token mean leave them out); None when the step has no demonstration."""
    if not any(g.demonstrations for g in groups):
        return None
    return broadcast(groups, [1.0] * sum(len(g.rows()) for g in groups))


@dataclass
class CreditJob:
    """One step's credit assignment in progress: what the signal part reads and fills. It holds
    what a signal may need from the method's other parts, never the parts' kinds."""

    method_name: str
    groups: list[EpisodeGroup]
    rows: list[RowInput]
    base: RowAdvantages
    scale: float
    credit: Credit
    select: Select  # which rows and tokens the signal touches (the one place that decides it)
    step_options: StepOptions  # the advantage part's discount and anchor matching (ADRS shapes with them)
    provider: ContextProvider | None = None
    prompts: object | None = None  # the driver's TeacherPrompts, for a learner-side teacher
    pairs: list[tuple[Episode, TurnRecord]] = field(default_factory=list)

    def __post_init__(self):
        self.pairs = [(e, t) for g in self.groups for e in g.episodes for t in e.turns]

    def token_masks(self) -> list[list[float]]:
        return [self.select.token_mask(e, t) for e, t in self.pairs]

    def teacher_logprobs(self) -> tuple[list[list[float]], list[list[float]] | None]:
        """Teacher log-probs of every row ``[B][n_response]`` and, when the select part masks,
        the masks (rows the scorer did not score get lpT 0 and mask 0)."""
        select, name = self.select, self.method_name
        teacher, masks = [], []
        for i, (e, row) in enumerate(self.pairs):
            lpt = row.teacher_logprobs
            if lpt is not None and len(lpt) != row.n_response:
                raise ValueError(
                    f"method={name}: row {i} has {len(lpt)} teacher log-probs for {row.n_response} response tokens"
                )
            if lpt is None and not select.masks:
                raise ValueError(
                    f"method={name}: row {i} (turn {row.turn_index}) has no teacher log-probs; the "
                    "teacher scorer must score every row while the teacher is active"
                )
            teacher.append([float(x) for x in lpt] if lpt is not None else [0.0] * row.n_response)
            masks.append(select.token_mask(e, row) if lpt is not None else [0.0] * row.n_response)
        return teacher, (masks if select.masks else None)

    def teacher_support(self, k: int) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
        """The student's top-k ids ``[B][n_response][k]`` and the teacher's log-probs there (rows
        the scorer did not score: zeros, and the select part's mask leaves them out)."""
        ids, lpt = [], []
        for i, (_, row) in enumerate(self.pairs):
            if row.teacher_topk_ids is None:
                if row.teacher_logprobs is not None:
                    raise ValueError(
                        f"method={self.method_name}: row {i} was scored without the student's support "
                        "(estimator topk_rkl needs TeacherNeeds.support_k)"
                    )
                ids.append([[0] * k for _ in range(row.n_response)])
                lpt.append([[0.0] * k for _ in range(row.n_response)])
                continue
            if len(row.teacher_topk_ids) != row.n_response or any(len(x) != k for x in row.teacher_topk_ids):
                raise ValueError(f"method={self.method_name}: row {i}'s support is not [{row.n_response}][{k}]")
            ids.append([[int(v) for v in x] for x in row.teacher_topk_ids])
            lpt.append([[float(v) for v in x] for x in row.teacher_topk_logprobs])
        return ids, lpt

    def teacher_channel(self, name: str) -> list[list[float]]:
        """A quantity of the teacher's distribution at every row's tokens ``[B][n_response]``, as
        the signal asked the scorer for (``TeacherNeeds.channels``); rows the scorer did not score
        get zeros (the select part's mask leaves them out)."""
        out = []
        for i, (_, row) in enumerate(self.pairs):
            values = (row.teacher_channels or {}).get(name)
            if values is None and row.teacher_logprobs is not None:
                raise ValueError(f"method={self.method_name}: row {i} was scored without the teacher's {name!r}")
            out.append([float(v) for v in values] if values is not None else [0.0] * row.n_response)
        return out

    def teacher_prompts(self) -> list[list[int]]:
        """Learner-side teacher prompts: the privileged prompt of each selected row, the plain
        prompt elsewhere."""
        prompts = self.prompts
        if prompts is None:
            raise RuntimeError(
                f"method={self.method_name} runs the teacher in the learner: the driver must "
                "attach() its TeacherPrompts (feedback_ids / skills_ids / plain_ids)"
            )
        out = []
        for e, row in self.pairs:
            ids = self.provider.teacher_prompt(prompts, e, row) if self.select.selected(e, row) else None
            out.append(list(ids) if ids is not None else list(prompts.plain_ids(row)))
        return out


P = TypeVar("P", bound=Part)


class _Slot(Generic[P]):
    """``method.<slot>``: the part in the slot of that name, typed by the slot's base class."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = name

    def __get__(self, method: "Method | None", owner: type | None = None) -> P:
        return self if method is None else method.parts[self.slot]


class Method:
    """The composed method; ``parts`` maps each slot to its part (see ``pipeline.methods.parts``)."""

    def __init__(self, name: str, parts: dict[str, Part], setting: Setting, *, env_name: str = "", seed: int = 0):
        self.name, self.parts, self.setting = name, parts, setting
        self.opts = flat_options(name, parts)
        self.prompts = None
        self.signal.check(self.advantage, self.teacher)
        self.provider: ContextProvider | None = self.context.build_provider(
            env_name=env_name, seed=seed, always_on=self.select.always_on
        )
        if self.student.carries_context and self.provider is None:
            raise ValueError(f"method={name}: parts.student=context needs a context (parts.context=skills, ...)")
        if self.teacher.present and self.provider is None:
            raise ValueError(f"method={name}: a teacher needs privileged context (parts.context=skills | feedback)")
        self._sync_teacher_success_rate()

    # ----- parts by role (each slot's base class says what the method may ask of it) -------------------
    reward = _Slot[Reward]()
    advantage = _Slot[Advantage]()
    context = _Slot[Context]()
    student = _Slot[Student]()
    teacher = _Slot[Teacher]()
    schedule = _Slot[Schedule]()
    signal = _Slot[Signal]()
    select = _Slot[Select]()

    @property
    def invalid_action_penalty(self) -> float:
        return self.setting.invalid_action_penalty

    # ----- upstream --------------------------------------------------------------------------------
    def _signal_on(self, step: int) -> bool:
        return self.signal.coef() > 0.0 and self.schedule.scale(step) > 0.0

    def teacher_spec(self) -> TeacherSpec | None:
        """What the teacher scorer must compute, or None (no teacher, or one run by the learner)."""
        t = self.teacher
        if not t.present or self.signal.learner_side:
            return None
        return TeacherSpec(
            provider=self.provider,
            selects=self.select.selected,
            follows_policy=t.follows_policy,
            weights_path=t.path,
            needs=self.signal.teacher_needs(),
            rows=self.select.kind,
        )

    def teacher_active(self, step: int) -> bool:
        """Whether the scorer must run this step (False outside the schedule, once retired)."""
        if self.teacher_spec() is None:
            return False
        self.teacher.check_ready()
        return self._signal_on(step)

    def wants_demonstrations(self, step: int) -> bool:
        """Whether the groups that train ``step`` need the hinted expert's episode (signal ``imitate``)."""
        return self.signal.demonstrations and self._signal_on(step)

    def student_view(self) -> StudentView | None:
        """The context in the student's own prompts (``skill_grpo``), or None."""
        return self.provider.student_view() if self.student.carries_context else None

    def privileged_view(self, first_attempt: Episode | None = None) -> StudentView | None:
        """The teacher's context given to the student (validation measures the privilege gap)."""
        if not self.teacher.present or self.provider is None:
            return None
        return self.provider.student_view(first_attempt)

    def attach(self, prompts) -> None:
        """Receive the driver's ``TeacherPrompts`` (learner-side teacher prompts)."""
        self.prompts = prompts

    def skills_for_student(self) -> dict | None:
        """The skill retrieval options when the student's own prompts carry skills, else None."""
        ok = self.student.carries_context and self.provider is not None
        return self.provider.retrieval() if ok else None

    def skills_for_teacher(self) -> dict | None:
        ok = self.teacher.present and self.provider is not None
        return self.provider.retrieval() if ok else None

    def required_val_every(self) -> int | None:
        return self.schedule.required_val_every()

    # ----- two phases (a frozen teacher trained first) ----------------------------------------------
    def prerequisite(self) -> dict | None:
        """The method dict of the first phase when the frozen teacher must be trained first: the
        same reward, advantage and context, with the context in the student's own prompts."""
        if not self.teacher.needs_first_phase:
            return None
        kinds = {
            "reward": self.parts["reward"].kind,
            "advantage": self.parts["advantage"].kind,
            "context": self.parts["context"].kind,
            "student": "context",
        }
        options = {}
        for slot in ("reward", "advantage", "context"):
            options.update(
                dataclasses.asdict(self.parts[slot].opts) if dataclasses.is_dataclass(self.parts[slot].opts) else {}
            )
        name = (self.provider.first_phase_preset if self.provider else None) or f"{self.name}_phase1"
        return {"name": name, "parts": kinds, **options}

    def prerequisite_steps(self) -> int:
        return self.teacher.opts.phase1_steps

    def adopt_prerequisite(self, hf_dir: str, success_rate: float) -> None:
        """Use the first phase's final model as the frozen teacher, with SR_T = ``success_rate``."""
        self.teacher.adopt(hf_dir, success_rate)
        self._sync_teacher_success_rate()

    @staticmethod
    def finished_prerequisite(hf_dir) -> float | None:
        """SR_T from ``teacher.json``, which ``adopt_prerequisite`` writes when phase 1 has finished."""
        from pathlib import Path

        return read_teacher_success_rate(hf_dir) if (Path(hf_dir) / TEACHER_META).exists() else None

    def _sync_teacher_success_rate(self) -> None:
        if self.teacher.success_rate is not None:
            self.schedule.set_teacher_success_rate(self.teacher.success_rate)

    # ----- credit ----------------------------------------------------------------------------------
    def episode_reward(self, episode: Episode) -> float:
        return self.reward.episode_reward(episode)

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        reward = self.reward
        rewards = [reward.episode_reward(e) for g in groups for e in g.episodes for _ in e.turns]
        rows = [dataclasses.replace(r, episode_reward=rw) for r, rw in zip(rows_from_groups(groups), rewards)]
        base = self.advantage.advantages(rows)
        a = base.advantages
        credit = Credit(
            advantages=broadcast(groups, a.tolist()),
            entropy_coef=self.schedule.entropy_coef(step),
            metrics={
                "adv/mean": float(a.mean()),
                "adv/abs_mean": float(a.abs().mean()),
                "adv/zero_frac": float((a == 0).float().mean()),
                **base.metrics,
                **reward.metrics(groups),
                **self.schedule.metrics(step),
            },
        )
        credit.distill.policy_mask = policy_mask(groups)
        if self.select.masks:
            credit.metrics.update(self._selection_metrics(groups))
        on = self._signal_on(step)
        if on:
            self.teacher.check_ready()
            self.schedule.check(step)
        self.signal.apply(
            CreditJob(
                method_name=self.name,
                groups=groups,
                rows=rows,
                base=base,
                scale=self.schedule.scale(step) if on else 0.0,
                credit=credit,
                select=self.select,
                step_options=self.advantage.step_options(),
                provider=self.provider,
                prompts=self.prompts,
            )
        )
        return credit

    def _selection_metrics(self, groups: list[EpisodeGroup]) -> dict[str, float]:
        select, prefix = self.select, self.setting.prefix
        pairs = [(e, t) for g in groups for e in g.episodes for t in e.turns]
        masks = [select.token_mask(e, t) for e, t in pairs]
        n_tokens = sum(t.n_response for _, t in pairs)
        return {
            f"{prefix}/failed_turn_fraction": sum(select.selected(e, t) for e, t in pairs) / max(len(pairs), 1),
            f"{prefix}/failed_token_fraction": sum(sum(m) for m in masks) / max(n_tokens, 1),
        }

    # ----- controller hooks ------------------------------------------------------------------------
    def observe(self, groups: list[EpisodeGroup]) -> None:
        """Completed groups (their outcomes teach the context provider, e.g. UCB statistics)."""
        if self.provider is not None:
            self.provider.observe(groups)

    def after_train_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return self.schedule.after_train_step(step, metrics)

    def on_validation(
        self, step: int, success_rate: float, privileged_success: float | None = None
    ) -> dict[str, float]:
        sr_t = self.teacher.success_rate
        return self.schedule.on_validation(step, success_rate, sr_t if sr_t is not None else privileged_success)

    @property
    def needs_privileged_success(self) -> bool:
        """Whether the next validation must measure the policy's success with the privileged
        context: a retirement rule still on whose teacher learns with the student (no recorded
        SR_T), so SR_T is that success, measured anew at each window end."""
        return self.schedule.rule is not None and not self.schedule.retired and self.teacher.success_rate is None

    # retirement state, for tests and diagnostics
    @property
    def retirement(self):
        return self.schedule.rule

    @property
    def retired(self) -> bool:
        return bool(self.schedule.retired)

    @property
    def teacher_path(self) -> str | None:
        return self.teacher.path

    @property
    def teacher_success_rate(self) -> float | None:
        return self.teacher.success_rate

    def state_dict(self) -> dict:
        return {
            **self.teacher.state_dict(),
            "schedule": self.schedule.state_dict(),
            "context": self.provider.state_dict() if self.provider is not None else {},
        }

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state)
        if state.get("schedule"):
            self.schedule.load_state_dict(state["schedule"])
        if self.provider is not None:
            self.provider.load_state_dict(state.get("context", {}))
        self._sync_teacher_success_rate()
