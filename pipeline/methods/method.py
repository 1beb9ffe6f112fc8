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

from pipeline.algorithm.advantages import RowAdvantages, RowInput, rows_from_groups
from pipeline.context.providers import PROVIDERS, ContextProvider, FeedbackContext, StudentView, TeacherSpec
from pipeline.core.types import Credit, Episode, EpisodeGroup, TurnRecord
from pipeline.methods.options import flat_options
from pipeline.methods.parts.base import Part, Setting
from pipeline.methods.parts.signal import check_signal
from pipeline.methods.parts.teacher import TEACHER_META, read_teacher_success_rate


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
    """One step's credit assignment in progress: what the signal part reads and fills."""

    method: "Method"
    groups: list[EpisodeGroup]
    rows: list[RowInput]
    base: RowAdvantages
    scale: float
    credit: Credit
    pairs: list[tuple[Episode, TurnRecord]] = field(default_factory=list)

    def __post_init__(self):
        self.pairs = [(e, t) for g in self.groups for e in g.episodes for t in e.turns]

    @property
    def advantage_part(self) -> Part:
        return self.method.parts["advantage"]

    def token_masks(self) -> list[list[float]]:
        select = self.method.parts["select"]
        return [select.token_mask(e, t) for e, t in self.pairs]

    def teacher_logprobs(self) -> tuple[list[list[float]], list[list[float]] | None]:
        """Teacher log-probs of every row ``[B][n_response]`` and, when the select part masks,
        the masks (rows the scorer did not score get lpT 0 and mask 0)."""
        select, name = self.method.parts["select"], self.method.name
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

    def teacher_prompts(self) -> list[list[int]]:
        """Learner-side teacher prompts: the privileged prompt of each selected row, the plain
        prompt elsewhere."""
        prompts = self.method.prompts
        if prompts is None:
            raise RuntimeError(
                f"method={self.method.name} runs the teacher in the learner: the driver must "
                "attach() its TeacherPrompts (feedback_ids / skills_ids / plain_ids)"
            )
        select, provider = self.method.parts["select"], self.method.provider
        out = []
        for e, row in self.pairs:
            ids = provider.teacher_prompt(prompts, e, row) if select.selected(e, row) else None
            out.append(list(ids) if ids is not None else list(prompts.plain_ids(row)))
        return out


class Method:
    """The composed method; ``parts`` maps each slot to its part (see ``pipeline.methods.parts``)."""

    def __init__(self, name: str, parts: dict[str, Part], setting: Setting, *, env_name: str = "", seed: int = 0):
        self.name, self.parts, self.setting = name, parts, setting
        self.opts = flat_options(name, parts)
        self.prompts = None
        check_signal(parts["signal"], parts["advantage"], parts["teacher"], name)
        self.provider: ContextProvider | None = None
        ctx = parts["context"]
        if ctx.kind != "none":
            cls = PROVIDERS[ctx.kind]
            extra = {"always_on": parts["select"].always_on} if cls is FeedbackContext else {}
            self.provider = cls(ctx.opts, env_name=env_name, seed=seed, **extra)
        if parts["student"].kind == "context" and self.provider is None:
            raise ValueError(f"method={name}: parts.student=context needs a context (parts.context=skills, ...)")
        if parts["teacher"].kind != "none" and self.provider is None:
            raise ValueError(f"method={name}: a teacher needs privileged context (parts.context=skills | feedback)")
        self._sync_teacher_success_rate()

    # ----- parts by role ---------------------------------------------------------------------------
    @property
    def teacher(self) -> Part:
        return self.parts["teacher"]

    @property
    def schedule(self) -> Part:
        return self.parts["schedule"]

    @property
    def signal(self) -> Part:
        return self.parts["signal"]

    @property
    def invalid_action_penalty(self) -> float:
        return self.setting.invalid_action_penalty

    # ----- upstream --------------------------------------------------------------------------------
    def _ready(self) -> None:
        t = self.teacher
        if t.kind == "frozen" and t.path is None:
            raise RuntimeError(
                f"method={self.name} has no teacher: set method.teacher_path=<phase-1 HF dir> (with "
                "method.teacher_success_rate or its teacher.json), or launch with the two-phase "
                "command, which trains the teacher first"
            )

    def _signal_on(self, step: int) -> bool:
        return self.signal.kind != "none" and self.signal.coef() > 0.0 and self.schedule.scale(step) > 0.0

    def teacher_spec(self) -> TeacherSpec | None:
        """What the teacher scorer must compute, or None (no teacher, or one run by the learner)."""
        t = self.teacher
        if t.kind == "none" or getattr(self.signal, "learner_side", False):
            return None
        select = self.parts["select"]
        return TeacherSpec(
            source=t.source,
            provider=self.provider,
            selects=select.selected,
            rows=select.kind,
            frozen_path=getattr(t, "path", None),
        )

    def teacher_active(self, step: int) -> bool:
        """Whether the scorer must run this step (False outside the schedule, once retired)."""
        if self.teacher_spec() is None:
            return False
        self._ready()
        return self._signal_on(step)

    def wants_demonstrations(self, step: int) -> bool:
        """Whether the groups that train ``step`` need the hinted expert's episode (signal ``imitate``)."""
        return self.signal.demonstrations and self._signal_on(step)

    def student_view(self) -> StudentView | None:
        """The context in the student's own prompts (``skill_grpo``), or None."""
        return self.provider.student_view() if self.parts["student"].kind == "context" else None

    def privileged_view(self, first_attempt: Episode | None = None) -> StudentView | None:
        """The teacher's context given to the student (validation measures the privilege gap)."""
        if self.teacher.kind == "none" or self.provider is None:
            return None
        return self.provider.student_view(first_attempt)

    def attach(self, prompts) -> None:
        """Receive the driver's ``TeacherPrompts`` (learner-side teacher prompts)."""
        self.prompts = prompts

    def skills_for_student(self) -> dict | None:
        """The skill retrieval options when the student's own prompts carry skills, else None."""
        ok = self.parts["student"].kind == "context" and self.parts["context"].kind == "skills"
        return self.provider.retrieval() if ok else None

    def skills_for_teacher(self) -> dict | None:
        ok = self.teacher.kind != "none" and self.parts["context"].kind == "skills"
        return self.provider.retrieval() if ok else None

    def required_val_every(self) -> int | None:
        return self.schedule.required_val_every()

    # ----- two phases (a frozen teacher trained first) ----------------------------------------------
    def prerequisite(self) -> dict | None:
        """The method dict of the first phase when the frozen teacher must be trained first: the
        same reward, advantage and context, with the context in the student's own prompts."""
        t = self.teacher
        if t.kind != "frozen" or t.path is not None:
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
        name = "skill_grpo" if kinds["context"] == "skills" else f"{self.name}_phase1"
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
        sr = getattr(self.teacher, "success_rate", None)
        if sr is not None and hasattr(self.schedule, "controller"):
            self.schedule.controller.teacher_success_rate = sr

    # ----- credit ----------------------------------------------------------------------------------
    def episode_reward(self, episode: Episode) -> float:
        return self.parts["reward"].episode_reward(episode)

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        reward = self.parts["reward"]
        rewards = [reward.episode_reward(e) for g in groups for e in g.episodes for _ in e.turns]
        rows = [dataclasses.replace(r, episode_reward=rw) for r, rw in zip(rows_from_groups(groups), rewards)]
        base = self.parts["advantage"].advantages(rows)
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
        if (pmask := policy_mask(groups)) is not None:
            credit.aux["policy_mask"] = pmask
        if self.parts["select"].masks:
            credit.metrics.update(self._selection_metrics(groups))
        if self.signal.kind == "none":
            return credit
        on = self._signal_on(step)
        if on:
            self._ready()
            self.schedule.check(step)
        self.signal.apply(
            CreditJob(
                method=self,
                groups=groups,
                rows=rows,
                base=base,
                scale=self.schedule.scale(step) if on else 0.0,
                credit=credit,
            )
        )
        return credit

    def _selection_metrics(self, groups: list[EpisodeGroup]) -> dict[str, float]:
        select, prefix = self.parts["select"], self.setting.prefix
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
        sr_t = getattr(self.teacher, "success_rate", None)
        return self.schedule.on_validation(step, success_rate, sr_t if sr_t is not None else privileged_success)

    # retirement state, for tests and diagnostics
    @property
    def controller(self):
        return getattr(self.schedule, "controller", None)

    @property
    def retired(self) -> bool:
        return bool(getattr(self.schedule, "retired", False))

    @property
    def teacher_path(self) -> str | None:
        return getattr(self.teacher, "path", None)

    @property
    def teacher_success_rate(self) -> float | None:
        return getattr(self.teacher, "success_rate", None)

    def state_dict(self) -> dict:
        teacher = self.teacher.state_dict() if hasattr(self.teacher, "state_dict") else {}
        return {
            **teacher,
            "schedule": self.schedule.state_dict(),
            "context": self.provider.state_dict() if self.provider is not None else {},
        }

    def load_state_dict(self, state: dict) -> None:
        if hasattr(self.teacher, "load_state_dict"):
            self.teacher.load_state_dict(state)
        if state.get("schedule"):
            self.schedule.load_state_dict(state["schedule"])
        if self.provider is not None:
            self.provider.load_state_dict(state.get("context", {}))
        self._sync_teacher_success_rate()
