"""retire_opd: OPD credit, retirement on a constructed K / success-rate sequence, checkpointing,
and the two-phase hooks."""

from __future__ import annotations

import pytest
from method_groups import PENALTY, build, episode, group, turn

from pipeline.algorithm.advantages import grpo_advantages, rows_from_groups
from pipeline.methods import build_method
from pipeline.methods.parts.teacher import TEACHER_META, read_teacher_success_rate, write_teacher_meta


def groups_with_alignment(k: float):
    """Two groups whose rows all have lp_old - lpT = k (the engine's view: K_n is the learner's)."""

    def t(index, old):
        return turn(index, old, lpt=[o - k for o in old])

    return [
        group(
            "a",
            [
                episode([t(0, [-1.0, -0.5]), t(1, [-0.2])], reward=10.0, won=True),
                episode([t(0, [-0.3, -0.9, -0.1])], reward=0.0),
            ],
        ),
        group("b", [episode([t(0, [-0.6])], reward=0.0), episode([t(0, [-0.4, -0.4])], reward=10.0, won=True)]),
    ]


def method(**options):
    return build("retire_opd", teacher_path="/ckpt/teacher/hf", teacher_success_rate=0.5, **options)


def run_steps(m, ks_and_srs, *, window: int, start: int = 0):
    """Drive the method as the controller does with trainer.val_every = window; return the steps
    (controller numbering) at which the teacher was asked for."""
    asked = []
    for step, (k, sr) in enumerate(ks_and_srs, start=start):
        if m.teacher_active(step):
            asked.append(step)
            m.credit(groups_with_alignment(k), step)
            m.after_train_step(step, {"opd/alignment": k})  # the learner's K_n of this step
        else:
            credit = m.credit(groups_with_alignment(k), step)
            assert credit.aux_terms == [] and credit.distill.present() == {}
        if (step + 1) % window == 0:
            m.on_validation(step + 1, sr)
    return asked


# Windows of 2 steps, SR_T = 0.5, gamma 0.9, delta 0:
#   m=1: Kbar 1.0, SR 0.3
#   m=2: Kbar 0.5 (rho = -1, still falling), SR 0.4 (eta 0.7)           -> keep
#   m=3: Kbar 0.6 (rho = +0.167), SR 0.5 (eta 0.9)                     -> retire at training step 6
SEQUENCE = [(1.0, 0.0), (1.0, 0.3), (0.5, 0.0), (0.5, 0.4), (0.6, 0.0), (0.6, 0.5)] + [(0.6, 0.5)] * 4


def test_opd_credit_is_grpo_plus_k3_is_towards_the_frozen_teacher():
    groups = groups_with_alignment(0.25)
    credit = method().credit(groups, 0)
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef) == ("opd", "k3_is", 0.01)
    rows = [r for g in groups for r in g.rows()]
    assert credit.distill.present() == {"teacher_logprobs": [r.teacher_logprobs for r in rows]}
    want = grpo_advantages(rows_from_groups(groups), invalid_penalty=PENALTY).advantages.tolist()
    assert [a[0] for a in credit.advantages] == pytest.approx(want)


def test_k_n_is_the_learners_alignment_metric_not_the_engines_logprobs():
    m = method()
    groups = groups_with_alignment(0.25)  # behaviour log-probs say lp_old - lpT = 0.25
    m.credit(groups, 0)
    out = m.after_train_step(0, {"opd/alignment": 0.4, "opd/loss": 0.1})  # the learner measured 0.4
    assert out["opd/K"] == pytest.approx(0.4) and out["opd/retired"] == 0.0
    assert m.retirement.pending == [0.4]


def test_teacher_is_asked_for_until_retirement_and_never_after():
    m = method(window=2)
    asked = run_steps(m, SEQUENCE, window=2)
    assert asked == [0, 1, 2, 3, 4, 5]
    assert m.retired and m.retirement.retire_step == 6
    metrics = m.on_validation(10, 0.5)
    assert metrics["opd/retired"] == 1.0 and metrics["opd/retire_step"] == 6.0


def test_window_end_metrics_report_kbar_rho_and_eta():
    m = method(window=2)
    run_steps(m, SEQUENCE[:4], window=2)
    out = m.on_validation(4, 0.4)  # not a window end any more: only reports
    assert out["opd/Kbar"] == pytest.approx(0.5)
    assert out["opd/rho"] == pytest.approx(-1.0)
    assert out["opd/eta"] == pytest.approx(0.7)


def test_a_gamma_above_the_reachable_success_ratio_keeps_the_teacher():
    m = method(window=2, gamma=1.5)  # eta <= (0.5 + 0.5) / (2 * 0.5) = 1 in this sequence
    assert run_steps(m, SEQUENCE, window=2) == list(range(len(SEQUENCE)))
    assert not m.retired


def test_state_dict_round_trip_stays_retired():
    m = method(window=2)
    run_steps(m, SEQUENCE[:6], window=2)
    assert m.retired
    fresh = method(window=2)
    fresh.load_state_dict(m.state_dict())
    assert not fresh.teacher_active(6)
    assert fresh.credit(groups_with_alignment(0.6), 6).aux_terms == []
    assert fresh.retirement.retire_step == 6


def test_state_dict_round_trip_mid_window_continues_the_same_decision():
    whole, half = method(window=2), method(window=2)
    run_steps(whole, SEQUENCE[:6], window=2)
    run_steps(half, SEQUENCE[:5], window=2)
    resumed = method(window=2)
    resumed.load_state_dict(half.state_dict())
    run_steps(resumed, SEQUENCE[5:6], window=2, start=5)
    assert resumed.retired and resumed.retirement.retire_step == whole.retirement.retire_step


def test_a_window_without_validation_says_to_set_val_every():
    m = method(window=2)
    assert m.required_val_every() == 2
    for step in (0, 1):
        m.credit(groups_with_alignment(1.0), step)
        m.after_train_step(step, {"opd/alignment": 1.0})
    with pytest.raises(RuntimeError, match="trainer.val_every=2"):
        m.credit(groups_with_alignment(1.0), 2)


def test_validations_between_window_ends_are_ignored():
    m = method(window=2)
    m.credit(groups_with_alignment(1.0), 0)
    m.after_train_step(0, {"opd/alignment": 1.0})
    assert "opd/Kbar" not in m.on_validation(1, 0.9)
    m.credit(groups_with_alignment(1.0), 1)
    m.after_train_step(1, {"opd/alignment": 1.0})
    assert m.on_validation(2, 0.3)["opd/Kbar"] == pytest.approx(1.0)


# ----- two phases ----------------------------------------------------------------------------------------


def test_prerequisite_is_skill_grpo_with_the_same_retrieval_options_when_no_teacher_is_given():
    raw = {"name": "retire_opd", "skill_mode": "full", "skill_top_k": 4}
    phase2 = build_method(raw, invalid_action_penalty=PENALTY)
    phase1 = phase2.prerequisite()
    assert phase1["name"] == "skill_grpo"
    student = build_method(phase1, invalid_action_penalty=PENALTY)
    assert student.skills_for_student() == {"bank": "alfworld", "mode": "full", "top_k": 4, "placement": "user_front"}
    assert student.teacher_spec() is None and student.signal.kind == "none"
    assert phase2.skills_for_teacher() == student.skills_for_student()
    assert phase2.prerequisite_steps() == 150
    given = build_method({**raw, "teacher_path": "/t", "teacher_success_rate": 0.4}, invalid_action_penalty=PENALTY)
    assert given.prerequisite() is None


def test_adopting_the_phase_one_teacher_sets_path_and_success_rate(tmp_path):
    m = build("retire_opd")
    with pytest.raises(RuntimeError, match="has no teacher"):
        m.teacher_active(0)
    m.adopt_prerequisite(str(tmp_path), 0.8)
    spec = m.teacher_spec()
    assert (spec.follows_policy, spec.weights_path, spec.placement) == (False, str(tmp_path), "user_front")
    assert m.teacher_active(0) and m.retirement.teacher_success_rate == 0.8
    assert m.state_dict()["teacher_path"] == str(tmp_path)
    assert read_teacher_success_rate(tmp_path) == 0.8  # stored with the teacher


def test_teacher_success_rate_is_read_from_the_phase_one_export(tmp_path):
    write_teacher_meta(tmp_path, 0.7, phase1_steps=150)
    m = build("retire_opd", teacher_path=str(tmp_path))
    assert m.teacher_success_rate == 0.7 and (tmp_path / TEACHER_META).exists()
    with pytest.raises(ValueError, match="method.teacher_success_rate is null"):
        build("retire_opd", teacher_path=str(tmp_path / "elsewhere"))
