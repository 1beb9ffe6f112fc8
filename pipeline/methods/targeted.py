"""``targeted_guidance``: masked self-distillation towards the feedback-conditioned self on the
turns where a rubric criterion failed (seed 000; no public code).

RL reward. Recomputed per episode from the judge's verdicts (``Episode.criteria``) and
``Episode.won``, replacing ``Episode.reward`` for the GRPO statistics (the record is not changed)::

    R = success_weight * won + criteria_weight * sum_c w_c * passed_c / sum_c w_c

with ``w_c = criterion_weights.get(c, 1)`` (an episode without criteria gets only the first
term). Ablation ``criterion_reward: false``: ``R = success_weight * won``. The invalid-action
penalty and the GRPO normalisation are those of ``grpo``.

Rows distilled. A *failed-turn row* is a row whose ``turn_index`` equals the ``failing_turn`` of a
failed criterion of its episode. ``turn_feedback(episode, turn_index)`` gives that row's privileged
feedback: the (non-empty) feedback strings of the criteria failing at that turn, in criterion
order; the scorer / prompt builder inserts them just before the assistant's response
(``pipeline.context.placement.insert_feedback``). Ablation ``always_on``: every row of an episode with a
failed criterion is distilled, with all of that episode's failed feedback strings.

Tokens distilled. ``distill_thinking: true`` (default): all tokens of a distilled row; ``false``:
only tokens from ``thinking_len`` on (the response after ``</think>``).

Loss ``L = L_RL + lam * L_TG``, lam = 0.1 (the seed gives no value; 0.1 is our default, and the
seed warns of entropy spikes at high lam), with ``L_TG = (1/N_all) sum_{selected t} KL(pi || sg mu)``:

- estimator ``full`` (default): exact reverse KL over the vocabulary, ``AuxTerm(name="tg",
  kind="full_kl")``, aux ``distill_mask``; the learner runs the teacher forward itself with the
  current weights on ``Credit.teacher_prompt_ids``: for every row
  ``prompts.feedback_ids(row, feedback)`` when it has feedback, else ``prompts.plain_ids(row)``.
  No scorer (``teacher_spec() is None``).
- estimator ``sampled``: the scorer (``source=self``, ``context=feedback``,
  ``rows=failed_turns``) fills ``teacher_logprobs`` on the rows it scores; K3-IS
  (``AuxTerm(name="tg", kind="k3_is")``) on the selected tokens of scored rows; unscored rows get
  lpT = 0 and mask 0.

A step with no selected token carries no aux term (and no teacher prompts, so no teacher forward).

The ``prompts`` protocol (``FeedbackPrompts``), attached by the driver via ``Method.attach``::

    feedback_ids(row: TurnRecord, feedback: list[str]) -> list[int]   # the row's prompt with the
                                                                      # feedback, tokenised
    plain_ids(row: TurnRecord) -> list[int]                           # the row's prompt without it

Both must end where the response starts (``row.response_ids`` is appended to them).

Metrics: ``tg/failed_turn_fraction`` (distilled rows / rows), ``tg/failed_token_fraction``
(distilled tokens / tokens), ``tg/reward_mean``, ``tg/pass/<criterion>`` (pass rate); the learner
adds ``tg/kl``, ``tg/loss``.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Protocol

from pipeline.algorithm.advantages import grpo_advantages, rows_from_groups
from pipeline.orchestration.batches import Credit
from pipeline.methods.base import TeacherSpec, register_method
from pipeline.methods.common import check_types, require
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.core.types import AuxTerm, Episode, EpisodeGroup, TurnRecord

ESTIMATORS = ("full", "sampled")


class FeedbackPrompts(Protocol):
    """Tokenised teacher prompts for learner-side teacher forwards (see the module docstring)."""

    def feedback_ids(self, row: TurnRecord, feedback: list[str]) -> list[int]: ...

    def plain_ids(self, row: TurnRecord) -> list[int]: ...


def turn_feedback(episode: Episode, turn_index: int, always_on: bool = False) -> list[str]:
    """Feedback strings for one row: failed criteria failing at ``turn_index`` (with ``always_on``:
    every failed criterion of the episode), non-empty ones only, in criterion order."""
    return [c.feedback for c in episode.criteria
            if not c.passed and (always_on or c.failing_turn == turn_index) and c.feedback.strip()]


def is_distilled_row(episode: Episode, turn_index: int, always_on: bool = False) -> bool:
    """A failed-turn row (or, with ``always_on``, any row of an episode with a failed criterion)."""
    return any(not c.passed and (always_on or c.failing_turn == turn_index) for c in episode.criteria)


@register_method
class TargetedGuidance(GRPO):
    name = "targeted_guidance"

    @dataclasses.dataclass
    class Options(GRPO.Options):
        name: str = "targeted_guidance"
        lam: float = 0.1  # coefficient of L_TG, >= 0
        estimator: str = "full"  # full (exact KL, learner-side teacher) | sampled (scorer, K3-IS)
        distill_thinking: bool = True  # also distill the <think> tokens of a failed turn
        always_on: bool = False  # ablation: distill every row of an episode with a failed criterion
        criterion_reward: bool = True  # ablation false: RL reward from task success only
        success_weight: float = 1.0  # weight of task success (won) in the reward, >= 0
        criteria_weight: float = 1.0  # weight of the weighted criterion pass rate, >= 0
        criterion_weights: dict[str, float] = dataclasses.field(default_factory=dict)  # per criterion, default 1

        def validate(self) -> None:
            check_types(self)
            require(self.lam >= 0.0, f"method=targeted_guidance: method.lam={self.lam} must be >= 0")
            require(self.estimator in ESTIMATORS, f"method=targeted_guidance: method.estimator="
                    f"{self.estimator!r}; choose one of {list(ESTIMATORS)}")
            require(self.success_weight >= 0.0 and self.criteria_weight >= 0.0,
                    "method=targeted_guidance: method.success_weight and method.criteria_weight must be >= 0")
            bad = {k: v for k, v in dict(self.criterion_weights).items()
                   if not isinstance(v, (int, float)) or v < 0}
            require(not bad, f"method=targeted_guidance: method.criterion_weights {bad} must be numbers >= 0")

    def teacher_spec(self) -> TeacherSpec | None:
        if self.opts.estimator == "full":
            return None  # the learner runs the teacher forward itself
        return TeacherSpec(source="self", context="feedback", rows="failed_turns", always_on=self.opts.always_on)

    # ----- reward ----------------------------------------------------------------------------------
    def episode_reward(self, episode: Episode) -> float:
        o = self.opts
        reward = o.success_weight * float(episode.won)
        if o.criterion_reward and episode.criteria:
            weights = [float(o.criterion_weights.get(c.criterion, 1.0)) for c in episode.criteria]
            total = sum(weights)
            if total > 0:
                passed = sum(w for w, c in zip(weights, episode.criteria) if c.passed)
                reward += o.criteria_weight * passed / total
        return reward

    def row_advantages(self, groups: list[EpisodeGroup]):
        rewards = [self.episode_reward(e) for g in groups for e in g.episodes for _ in e.turns]
        rows = [dataclasses.replace(r, episode_reward=rw) for r, rw in zip(rows_from_groups(groups), rewards)]
        return grpo_advantages(rows, invalid_penalty=self.invalid_action_penalty,
                               mean_std_across_rows=self.opts.mean_std_across_rows, norm_std=self.opts.norm_std)

    # ----- credit ----------------------------------------------------------------------------------
    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        o = self.opts
        adv = self.row_advantages(groups).advantages
        pairs = [(e, t) for g in groups for e in g.episodes for t in e.turns]
        sampled = o.estimator == "sampled"
        masks: list[list[float]] = []
        teacher: list[list[float]] = []
        feedback: list[list[str]] = []
        n_rows_selected = 0
        for i, (episode, row) in enumerate(pairs):
            selected = is_distilled_row(episode, row.turn_index, o.always_on)
            lpt = row.teacher_logprobs
            if sampled:
                if lpt is not None and len(lpt) != row.n_response:
                    raise ValueError(f"method=targeted_guidance: row {i} has {len(lpt)} teacher log-probs "
                                     f"for {row.n_response} response tokens")
                selected = selected and lpt is not None
                teacher.append([float(x) for x in lpt] if lpt is not None else [0.0] * row.n_response)
            start = 0 if o.distill_thinking else min(row.thinking_len, row.n_response)
            masks.append([1.0 if selected and t >= start else 0.0 for t in range(row.n_response)])
            feedback.append(turn_feedback(episode, row.turn_index, o.always_on) if selected else [])
            n_rows_selected += selected

        n_tokens = sum(row.n_response for _, row in pairs)
        n_selected = sum(sum(m) for m in masks)
        metrics = {
            "tg/failed_turn_fraction": n_rows_selected / max(len(pairs), 1),
            "tg/failed_token_fraction": n_selected / max(n_tokens, 1),
            "adv/mean": float(adv.mean()), "adv/abs_mean": float(adv.abs().mean()),
            **self._reward_metrics(groups),
        }
        credit = Credit(advantages=broadcast(groups, adv.tolist()), metrics=metrics)
        if n_selected == 0:
            return credit
        credit.aux["distill_mask"] = masks
        if sampled:
            credit.aux["teacher_logprobs"] = teacher
            credit.aux_terms = [AuxTerm(name="tg", kind="k3_is", coef=o.lam)]
        else:
            prompts: FeedbackPrompts | None = getattr(self, "prompts", None)
            if prompts is None:
                raise RuntimeError("targeted_guidance with estimator=full needs the driver to attach() a prompts "
                                   "object with feedback_ids(row, feedback) and plain_ids(row)")
            credit.teacher_prompt_ids = [list(prompts.feedback_ids(row, fb)) if fb else list(prompts.plain_ids(row))
                                         for (_, row), fb in zip(pairs, feedback)]
            credit.aux_terms = [AuxTerm(name="tg", kind="full_kl", coef=o.lam)]
        return credit

    def _reward_metrics(self, groups: list[EpisodeGroup]) -> dict[str, float]:
        episodes = [e for g in groups for e in g.episodes]
        passes: dict[str, list[bool]] = defaultdict(list)
        for e in episodes:
            for c in e.criteria:
                passes[c.criterion].append(c.passed)
        out = {"tg/reward_mean": sum(self.episode_reward(e) for e in episodes) / max(len(episodes), 1)}
        out.update({f"tg/pass/{name}": sum(v) / len(v) for name, v in passes.items()})
        return out
