"""The per-method diagnostics every run logs (issue 42, item 2) that the methods did not log before:
ADRS's share of the advantage that is the teacher's shaping and the fraction of tokens its TVA
gate opens, and the teacher's success rate RetireOPD judged its retirement against. (SDAR's
``sdar/gate_mean`` / ``sdar/gate_active_ratio``, targeted guidance's ``tg/failed_token_fraction``,
``opd/retire_step`` and ``val/privilege_gap`` are tested where they are made: test_methods.py,
test_method_targeted.py, test_retirement.py, test_controller_with_fake_workers.py.)"""

from __future__ import annotations

import pytest
import torch
from method_groups import build, scored_groups

from pipeline.algorithm.adrs import adrs_advantages, tva_per_row
from pipeline.algorithm.advantages import RowInput, grpo_advantages
from pipeline.algorithm.retirement import RetirementRule


def rows_and_teacher():
    """Two groups of two rows with different scores (so both are shaped), teacher log-probs by hand."""
    rows = [RowInput(group=g, episode=e, turn=0, episode_reward=float(e + g)) for g in range(2) for e in range(2)]
    lps = [[-1.0, -3.0, -0.5], [-2.0, -2.5], [-0.1, -4.0], [-1.5, -1.0, -2.0]]
    return rows, lps


def test_adrs_shaping_share_is_the_mean_absolute_shaping_over_the_mean_absolute_advantage():
    rows, lps = rows_and_teacher()
    base = grpo_advantages(rows)
    out, m = adrs_advantages(rows, lps, base, eta_s=0.5, tva_apply="after_whitening")
    adv = torch.cat(out).double()
    row_adv = torch.repeat_interleave(base.advantages.double(), torch.tensor([len(x) for x in lps]))
    shaping = adv - row_adv  # what ADRS added to each token's advantage
    assert m["adrs/shaping_share"] == pytest.approx(float(shaping.abs().mean() / adv.abs().mean()), rel=1e-5)
    assert 0.0 < m["adrs/shaping_share"] < 1.0
    assert m["adrs/shaping_abs_mean"] == pytest.approx(float(shaping.abs().mean()), rel=1e-5)
    # unshaped (eta_s = 0): no share, and a batch whose every advantage is 0 does not divide by 0
    assert adrs_advantages(rows, lps, base, eta_s=0.0)[1]["adrs/shaping_share"] == 0.0
    flat = [RowInput(group=0, episode=e, turn=0, episode_reward=1.0) for e in range(2)]
    assert adrs_advantages(flat, lps[:2], grpo_advantages(flat), eta_s=0.5)[1]["adrs/shaping_share"] == 0.0


def test_adrs_gate_active_ratio_is_the_fraction_of_tokens_whose_tva_gate_is_open():
    rows, lps = rows_and_teacher()
    base = grpo_advantages(rows)
    _, m = adrs_advantages(rows, lps, base, eta_s=0.5, tau=2.0)
    gate = torch.sigmoid(2.0 * tva_per_row(rows, lps))  # one gate per row, on each of its tokens
    per_token = torch.repeat_interleave(gate, torch.tensor([len(x) for x in lps]))
    assert m["adrs/gate_active_ratio"] == pytest.approx(float((per_token > 0.5).double().mean()))
    assert 0.0 < m["adrs/gate_active_ratio"] < 1.0  # these groups' TVAs differ in sign: a real fraction
    _, closed = adrs_advantages(rows, lps, base, eta_s=0.5, tau=0.0)  # tau 0: every gate is exactly 0.5
    assert closed["adrs/gate_mean"] == pytest.approx(0.5) and closed["adrs/gate_active_ratio"] == 0.0


def test_a_training_step_of_adrs_logs_the_share_and_the_gate():
    credit = build("adrs", warmup_steps=0).credit(scored_groups(), 0)
    for key in ("adrs/gate_mean", "adrs/gate_active_ratio", "adrs/shaping_share"):
        assert key in credit.metrics, key
    assert credit.metrics["adrs/shaping_share"] > 0.0


def retire(rule: RetirementRule, windows: list[tuple[list[float], float]], teacher=None) -> list[dict]:
    """Each window's K_n, then its validation success (and, for a teacher that learns, its SR_T)."""
    out, step = [], 0
    for i, (ks, sr) in enumerate(windows):
        for k in ks:
            step += 1
            out.append(rule.record_step(step, k))
        out.append(rule.end_window(sr, None if teacher is None else teacher[i]))
    return out


def test_retirement_logs_the_teacher_success_it_was_judged_against():
    rule = RetirementRule(teacher_success_rate=0.8, window=2, delta=0.0, gamma=0.9)
    metrics = retire(rule, [([1.0, 0.8], 0.5), ([0.6, 0.6], 0.7), ([0.7, 0.7], 0.8)])
    assert metrics[0]["opd/retire_teacher_success"] == -1.0 and metrics[0]["opd/teacher_success_rate"] == 0.8
    assert metrics[-1]["opd/retire_step"] == 6.0 and metrics[-1]["opd/retire_teacher_success"] == 0.8
    restored = RetirementRule(teacher_success_rate=None, window=2)
    restored.load_state_dict(rule.state_dict())
    assert restored.metrics()["opd/retire_teacher_success"] == 0.8
    old = {k: v for k, v in rule.state_dict().items() if k != "retire_teacher_success"}  # a checkpoint from before
    restored.load_state_dict(old)
    assert restored.metrics()["opd/retire_teacher_success"] == -1.0


def test_a_teacher_that_learns_is_recorded_at_the_window_it_retired_in():
    rule = RetirementRule(teacher_success_rate=None, window=1, delta=0.0, gamma=0.9)
    assert "opd/teacher_success_rate" not in rule.metrics()  # SR_T unknown until the first window closes
    metrics = retire(rule, [([1.0], 0.2), ([0.5], 0.3), ([0.6], 0.7)], teacher=[0.9, 0.8, 0.5])
    assert [m["opd/teacher_success_rate"] for m in metrics[1::2]] == [0.9, 0.8, 0.5]
    assert rule.retired and rule.retire_step == 3 and metrics[-1]["opd/retire_teacher_success"] == 0.5


def test_the_result_tables_gather_each_methods_diagnostics_per_method():
    import json

    from lab import results

    def run(point: str, rows: list[dict]) -> results.Run:
        return results._parse_run(point, {"metrics.jsonl": "".join(json.dumps(r) + "\n" for r in rows)})

    runs = [
        run("grpo_s0", [{"step": 1}]),
        run(
            "sdar_s0",
            [{"step": 1, "sdar/gate_mean": 0.4}, {"step": 2, "sdar/gate_mean": 0.6, "val/privilege_gap": 0.1}],
        ),
        run("sdar_s1", [{"step": 1, "sdar/gate_mean": 0.3}]),
        run("retire_opd_s0", [{"step": 4, "opd/retire_step": -1.0}, {"step": 8, "opd/retire_step": 8.0}]),
        run("retire_opd_s1", [{"step": 8, "opd/retire_step": -1.0, "opd/retire_teacher_success": -1.0}]),
    ]
    rows = {r["method"]: r for r in results.learning_tables(runs, floors=[])["diagnostics"]}
    assert set(rows) == {"sdar", "retire_opd"}  # grpo logs none of them
    assert rows["sdar"]["SDAR gate mean"] == "0.400"  # seed 0's mean 0.5, seed 1's 0.3
    assert rows["sdar"]["privilege gap (valid)"] == "0.100" and rows["sdar"]["OPD retire step"] == ""
    assert rows["retire_opd"]["OPD retire step"] == "s0: 8, s1: never"
    assert rows["retire_opd"]["OPD teacher success at retirement"] == "s1: never"
    assert "ADRS gate mean" not in rows["sdar"]  # no method logged it: no column
