"""pipeline.algorithm.retirement: RetireOPD's windowed retirement rule on constructed K / SR sequences."""

from __future__ import annotations

import json
import math
import random

import pytest

from pipeline.algorithm.retirement import RetirementRule


def run(ctrl: RetirementRule, ks: list[float], srs: list[float], start_step: int = 1) -> list[dict]:
    """Feed K_n step by step and close each full window with the next SR; returns window metrics."""
    out, sr_iter, step = [], iter(srs), start_step
    for k in ks:
        ctrl.record_step(step, k)
        if ctrl.needs_validation:
            out.append(ctrl.end_window(next(sr_iter)))
        step += 1
    return out


def reference_retire_step(ks, srs, *, window, sr_t, delta, gamma):
    """The rule written directly over the whole series: first m >= 2 with rho >= delta, eta >= gamma."""
    kbars = [sum(ks[i : i + window]) / window for i in range(0, len(ks) - window + 1, window)]
    for m in range(1, len(kbars)):
        rho = (kbars[m] - kbars[m - 1]) / abs(kbars[m])
        eta = (srs[m] + srs[m - 1]) / (2 * sr_t)
        if rho >= delta and eta >= gamma:
            return (m + 1) * window  # the last step of window m + 1 (1-based)
    return -1


def test_teacher_retires_at_the_first_window_where_k_stops_falling_and_the_student_is_close():
    ctrl = RetirementRule(teacher_success_rate=0.8, window=2, delta=0.0, gamma=0.9)
    metrics = run(ctrl, [1.0, 0.8, 0.6, 0.6, 0.7, 0.7], [0.5, 0.7, 0.8])
    assert "opd/rho" not in metrics[0]  # window 1 has nothing to compare with
    assert metrics[1]["opd/rho"] == pytest.approx((0.6 - 0.9) / 0.6)  # K still falling
    assert metrics[1]["opd/eta"] == pytest.approx((0.7 + 0.5) / 1.6)
    assert metrics[1]["opd/retired"] == 0.0
    assert metrics[2]["opd/Kbar"] == pytest.approx(0.7)
    assert metrics[2]["opd/rho"] == pytest.approx(0.1 / 0.7)
    assert metrics[2]["opd/eta"] == pytest.approx((0.8 + 0.7) / 1.6)
    assert metrics[2]["opd/retired"] == 1.0 and metrics[2]["opd/retire_step"] == 6.0
    assert ctrl.retired and ctrl.retire_step == 6


def test_the_first_window_never_retires_however_good_it_looks():
    ctrl = RetirementRule(teacher_success_rate=0.5, window=3, delta=-10.0, gamma=0.0)
    (m1,) = run(ctrl, [1.0, 1.0, 1.0], [1.0])
    assert m1["opd/retired"] == 0.0 and not ctrl.retired
    (m2,) = run(ctrl, [1.0, 1.0, 1.0], [1.0], start_step=4)
    assert m2["opd/retired"] == 1.0 and ctrl.retire_step == 6


def test_both_conditions_are_needed():
    rho_only = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.9)
    run(rho_only, [0.5, 0.6], [0.1, 0.1])  # K rose, success far below the teacher's
    eta_only = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.9)
    run(eta_only, [0.6, 0.5], [1.0, 1.0])  # student as good as the teacher, K still falling
    assert not rho_only.retired and not eta_only.retired


def test_negative_kbar_uses_the_absolute_value_in_the_denominator():
    ctrl = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.5)
    _, m2 = run(ctrl, [-0.5, -0.4], [1.0, 1.0])
    assert m2["opd/rho"] == pytest.approx(0.1 / 0.4)  # K rose; a signed denominator would say -0.25
    assert ctrl.retired


def test_delta_and_gamma_thresholds_are_inclusive():
    ctrl = RetirementRule(teacher_success_rate=0.5, window=1, delta=0.25, gamma=0.9)
    _, m2 = run(ctrl, [0.75, 1.0], [0.45, 0.45])
    assert m2["opd/rho"] == 0.25 and m2["opd/eta"] == pytest.approx(0.9)
    assert ctrl.retired


def test_retirement_is_permanent_and_later_steps_are_ignored():
    ctrl = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.0)
    run(ctrl, [0.5, 0.5], [0.0, 0.0])
    assert ctrl.retired and ctrl.retire_step == 2
    m = ctrl.record_step(3, 100.0)
    assert not ctrl.needs_validation
    assert m["opd/retired"] == 1.0 and m["opd/retire_step"] == 2.0 and m["opd/K"] == 0.5
    with pytest.raises(RuntimeError):
        ctrl.end_window(1.0)


def test_kbar_of_zero_gives_an_infinite_rho_with_the_sign_of_the_change():
    rose = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.0)
    _, m = run(rose, [-0.2, 0.0], [1.0, 1.0])
    assert m["opd/rho"] == math.inf and rose.retired
    fell = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.0)
    _, m = run(fell, [0.2, 0.0], [1.0, 1.0])
    assert m["opd/rho"] == -math.inf and not fell.retired
    flat = RetirementRule(teacher_success_rate=1.0, window=1, delta=0.0, gamma=0.0)
    _, m = run(flat, [0.0, 0.0], [1.0, 1.0])
    assert m["opd/rho"] == 0.0 and flat.retired


def test_a_teacher_success_rate_of_zero_sets_no_bar_so_rho_alone_decides():
    ctrl = RetirementRule(teacher_success_rate=0.0, window=1, delta=0.0, gamma=0.9)
    _, m2 = run(ctrl, [0.5, 0.4], [0.0, 0.0])
    assert m2["opd/eta"] == math.inf and not ctrl.retired  # K fell
    run(ctrl, [0.45], [0.0], start_step=3)
    assert ctrl.retired and ctrl.retire_step == 3
    with pytest.raises(ValueError):
        RetirementRule(teacher_success_rate=-0.1)


def test_restoring_from_state_dict_mid_window_gives_the_same_decisions():
    ks = [0.9, 0.8, 0.7, 0.65, 0.6, 0.62, 0.64, 0.66, 0.7]
    srs = [0.3, 0.6, 0.75, 0.8]
    straight = RetirementRule(teacher_success_rate=0.8, window=2, delta=0.0, gamma=0.9)
    expected = run(straight, ks, srs)

    first = RetirementRule(teacher_success_rate=0.8, window=2, delta=0.0, gamma=0.9)
    got = run(first, ks[:3], srs[:1])  # stop with one K pending in window 2
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints must survive serialisation
    resumed = RetirementRule(teacher_success_rate=0.8, window=2, delta=0.0, gamma=0.9)
    resumed.load_state_dict(state)
    assert resumed.pending == [0.7] and resumed.metrics() == first.metrics()
    got += run(resumed, ks[3:], srs[1:], start_step=4)
    assert got == expected
    assert resumed.retire_step == straight.retire_step == 8


def test_window_protocol_errors_say_what_to_call():
    ctrl = RetirementRule(teacher_success_rate=1.0, window=2)
    ctrl.record_step(1, 0.5)
    with pytest.raises(RuntimeError, match="full window"):
        ctrl.end_window(0.5)
    ctrl.record_step(2, 0.5)
    with pytest.raises(RuntimeError, match="end_window"):
        ctrl.record_step(3, 0.5)


@pytest.mark.parametrize("seed", range(8))
def test_controller_matches_the_rule_applied_to_the_whole_series(seed):
    rng = random.Random(seed)
    window, sr_t = rng.choice([1, 2, 5]), rng.uniform(0.3, 0.9)
    delta, gamma = rng.uniform(-0.1, 0.04), rng.uniform(0.8, 0.96)
    n_windows = 12
    ks = [rng.uniform(-0.5, 1.5) for _ in range(window * n_windows)]
    srs = [min(1.0, rng.uniform(0.0, 1.1) * sr_t) for _ in range(n_windows)]
    ctrl = RetirementRule(teacher_success_rate=sr_t, window=window, delta=delta, gamma=gamma)
    run(ctrl, ks, srs)
    assert ctrl.retire_step == reference_retire_step(ks, srs, window=window, sr_t=sr_t, delta=delta, gamma=gamma)
