"""targeted_guidance: per-row feedback, failed-turn masks, teacher prompts, the criteria reward and
its ablations, both KL estimators."""

from __future__ import annotations

import dataclasses

import pytest
from method_groups import PENALTY, build, episode, group, turn

from pipeline.algorithm.advantages import grpo_advantages, rows_from_groups
from pipeline.context.providers import turn_feedback
from pipeline.core.types import CriterionResult


def crit(name: str, passed: bool, failing_turn: int | None = None, feedback: str | None = None):
    return CriterionResult(
        criterion=name,
        passed=passed,
        failing_turn=failing_turn,
        feedback=f"fix {name}" if feedback is None else feedback,
    )


class FakeFeedbackPrompts:
    """Stands in for the driver's prompts: ids that reveal which feedback a row was given."""

    def __init__(self):
        self.calls: list[tuple[int, list[str]]] = []

    def feedback_ids(self, row, feedback):
        self.calls.append((row.turn_index, list(feedback)))
        return list(row.prompt_ids) + [900 + len(f) for f in feedback]

    def plain_ids(self, row):
        return list(row.prompt_ids)


def tg_groups():
    """Group a: ep0 won, all pass; ep1 fails "tests" at turn 1 and "style" at turn 1, passes "format";
    ep2 fails "format" at turn 0. Group b: ep0 fails "tests" at turn 0; ep1 passes everything."""
    g1 = group(
        "a",
        [
            episode(
                [turn(0, [-1.0, -1.0]), turn(1, [-1.0, -1.0, -1.0])],
                won=True,
                criteria=[crit("tests", True), crit("style", True), crit("format", True)],
            ),
            episode(
                [turn(0, [-1.0, -1.0]), turn(1, [-1.0, -1.0, -1.0, -1.0], thinking_len=3)],
                criteria=[crit("tests", False, 1), crit("style", False, 1, "be brief"), crit("format", True)],
            ),
            episode(
                [turn(0, [-1.0, -1.0, -1.0], thinking_len=1), turn(1, [-1.0])],
                criteria=[crit("tests", True), crit("style", True), crit("format", False, 0)],
            ),
        ],
    )
    g2 = group(
        "b",
        [
            episode([turn(0, [-1.0, -1.0]), turn(1, [-1.0])], criteria=[crit("tests", False, 0), crit("style", True)]),
            episode([turn(0, [-1.0])], criteria=[crit("tests", True), crit("style", True)]),
        ],
    )
    return [g1, g2]


def full_method(**options):
    m = build("targeted_guidance", **options)
    m.attach(FakeFeedbackPrompts())
    return m


# ----- turn_feedback ---------------------------------------------------------------------------------------


def test_turn_feedback_lists_the_criteria_failing_at_that_turn_in_order():
    ep = tg_groups()[0].episodes[1]
    assert turn_feedback(ep, 1) == ["fix tests", "be brief"]
    assert turn_feedback(ep, 0) == []


def test_turn_feedback_always_on_gives_every_failed_criterion_on_every_row():
    ep = episode(
        [turn(0, [-1.0]), turn(1, [-1.0])], criteria=[crit("a", False, 1), crit("b", True), crit("c", False, None)]
    )
    assert turn_feedback(ep, 0, always_on=True) == ["fix a", "fix c"]
    assert turn_feedback(ep, 1, always_on=True) == ["fix a", "fix c"]
    assert turn_feedback(ep, 0) == []


def test_turn_feedback_skips_empty_feedback_strings():
    ep = episode([turn(0, [-1.0])], criteria=[crit("a", False, 0, feedback="  "), crit("b", False, 0)])
    assert turn_feedback(ep, 0) == ["fix b"]


# ----- estimator full ---------------------------------------------------------------------------------------


def test_full_estimator_masks_only_failed_turn_rows():
    credit = full_method().credit(tg_groups(), 0)
    # rows: a/ep0 t0,t1 | a/ep1 t0,t1 | a/ep2 t0,t1 | b/ep0 t0,t1 | b/ep1 t0
    assert credit.distill.distill_mask == [
        [0, 0],
        [0, 0, 0],
        [0, 0],
        [1, 1, 1, 1],
        [1, 1, 1],
        [0],
        [1, 1],
        [0],
        [0],
    ]
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef) == ("tg", "full_kl", 0.1)
    assert credit.distill.teacher_logprobs is None


def test_full_estimator_without_thinking_masks_only_the_tokens_after_thinking():
    credit = full_method(distill_thinking=False).credit(tg_groups(), 0)
    assert credit.distill.distill_mask[3] == [0, 0, 0, 1]  # thinking_len 3 of 4
    assert credit.distill.distill_mask[4] == [0, 1, 1]  # thinking_len 1 of 3
    assert credit.distill.distill_mask[6] == [1, 1]  # no thinking


def test_full_estimator_builds_feedback_prompts_for_failed_rows_and_plain_ones_elsewhere():
    method = full_method()
    groups = tg_groups()
    credit = method.credit(groups, 0)
    rows = [r for g in groups for r in g.rows()]
    assert method.prompts.calls == [(1, ["fix tests", "be brief"]), (0, ["fix format"]), (0, ["fix tests"])]
    assert credit.teacher_prompt_ids[3] == rows[3].prompt_ids + [900 + 9, 900 + 8]
    assert credit.teacher_prompt_ids[0] == rows[0].prompt_ids
    assert len(credit.teacher_prompt_ids) == len(rows)
    assert method.teacher_spec() is None and not method.teacher_active(0)


def test_full_estimator_without_attached_prompts_says_what_is_missing():
    with pytest.raises(RuntimeError, match="attach"):
        build("targeted_guidance").credit(tg_groups(), 0)


def test_always_on_distills_every_row_of_episodes_with_a_failure():
    method = full_method(always_on=True)
    credit = method.credit(tg_groups(), 0)
    selected = [any(row) for row in credit.distill.distill_mask]
    assert selected == [False, False, True, True, True, True, True, True, False]
    assert (0, ["fix tests", "be brief"]) in method.prompts.calls


def test_a_batch_without_failures_carries_no_distillation_term():
    groups = tg_groups()
    for g in groups:
        for e in g.episodes:
            e.criteria = [crit("tests", True)]
    credit = full_method().credit(groups, 0)
    assert credit.aux_terms == [] and credit.teacher_prompt_ids is None
    assert credit.metrics["tg/failed_turn_fraction"] == 0.0


def test_failed_fractions_count_rows_and_tokens():
    m = full_method(distill_thinking=False).credit(tg_groups(), 0).metrics
    assert m["tg/failed_turn_fraction"] == pytest.approx(3 / 9)
    assert m["tg/failed_token_fraction"] == pytest.approx((1 + 2 + 2) / 19)  # 19 response tokens in all
    assert m["tg/pass/tests"] == pytest.approx(3 / 5)


# ----- reward -------------------------------------------------------------------------------------------------


def _grpo(groups, episode_rewards):
    rows = rows_from_groups(groups)
    by_episode = {(r.group, r.episode): None for r in rows}
    reward_of = dict(zip(by_episode, episode_rewards))
    rows = [dataclasses.replace(r, episode_reward=reward_of[(r.group, r.episode)]) for r in rows]
    return grpo_advantages(rows, invalid_penalty=PENALTY).advantages.tolist()


def test_reward_is_task_success_plus_the_weighted_criterion_pass_rate():
    groups = tg_groups()
    method = full_method(success_weight=2.0, criteria_weight=3.0, criterion_weights={"tests": 2.0})
    # a/ep0: 2*1 + 3*(2+1+1)/4 | a/ep1: 3*1/4 | a/ep2: 3*3/4 | b/ep0: 3*1/3 | b/ep1: 3*3/3
    want = [2 + 3.0, 0.75, 2.25, 1.0, 3.0]
    assert [method.episode_reward(e) for g in groups for e in g.episodes] == pytest.approx(want)
    credit = method.credit(groups, 0)
    assert [a[0] for a in credit.advantages] == pytest.approx(_grpo(groups, want), abs=1e-6)


def test_criterion_reward_ablation_uses_task_success_only_and_changes_advantages():
    groups = tg_groups()
    with_criteria = full_method().credit(groups, 0).advantages
    without = full_method(criterion_reward=False).credit(groups, 0).advantages
    assert [a[0] for a in without] == pytest.approx(_grpo(groups, [1.0, 0.0, 0.0, 0.0, 0.0]), abs=1e-6)
    assert [a[0] for a in without[6:]] == [0.0, 0.0, 0.0]  # group b: nobody won, nothing to learn
    assert with_criteria != without


# ----- estimator sampled -----------------------------------------------------------------------------------


def test_sampled_estimator_asks_the_scorer_for_failed_turns_and_uses_k3_is():
    method = build("targeted_guidance", estimator="k3_is", always_on=True)
    spec = method.teacher_spec()
    assert (spec.follows_policy, spec.context, spec.rows, spec.always_on) == (True, "feedback", "failed_turns", True)
    assert method.teacher_active(0)


def test_the_scorer_decides_in_one_place_which_rows_it_scores_and_which_still_need_it():
    """``TeacherScorer._items`` (the select part, then the provider) chooses the rows; the train
    loop's "is this group scored?" asks the same function, so an unselected row without teacher
    log-probs never makes a group look unscored. (The actor handle is unused: nothing is called.)"""
    from actors.scorer import TeacherScorer

    method = build("targeted_guidance", estimator="k3_is")
    scorer = TeacherScorer(None, method.teacher_spec(), FakeFeedbackPrompts())
    a, b = tg_groups()
    rows, items = scorer._items([a])
    assert [r.turn_index for r in rows] == [1, 0]  # a/ep1's failed turn 1, a/ep2's failed turn 0
    assert [ids[-2:] for ids, _ in items][0] == [900 + len("fix tests"), 900 + len("be brief")]
    assert scorer.needs_scoring(a)
    for r in rows:
        r.teacher_logprobs = [-0.5] * r.n_response
    assert not scorer.needs_scoring(a)  # the passing turns were never to be scored
    assert scorer.needs_scoring(b) and [r.turn_index for r in scorer._items([b])[0]] == [0]


def test_sampled_estimator_fills_unscored_rows_with_zero_and_masks_them():
    groups = tg_groups()
    rows = [r for g in groups for r in g.rows()]
    rows[3].teacher_logprobs = [-0.5, -0.6, -0.7, -0.8]  # a/ep1 t1: failed and scored
    rows[6].teacher_logprobs = [-0.1, -0.2]  # b/ep0 t0: failed and scored
    # a/ep2 t0 failed but was not scored
    credit = build("targeted_guidance", estimator="k3_is").credit(groups, 0)
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef) == ("tg", "k3_is", 0.1)
    assert credit.distill.teacher_logprobs[3] == [-0.5, -0.6, -0.7, -0.8]
    assert credit.distill.teacher_logprobs[4] == [0.0, 0.0, 0.0]
    assert [any(m) for m in credit.distill.distill_mask] == [
        False,
        False,
        False,
        True,
        False,
        False,
        True,
        False,
        False,
    ]
    assert credit.teacher_prompt_ids is None
