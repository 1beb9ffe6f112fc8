"""scripts/bench/step_cost.py's table: each run's means, then every ratio of a later run over an
earlier one (base, current, variant), whichever runs are present."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("step_cost_bench", ROOT / "scripts" / "bench" / "step_cost.py")
step_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_cost)


def run(step, learner, wait, peak, private=None):
    out = {"step_s": step, "learner_s": learner, "wait_rollout_s": wait, "learner_peak_gb": peak}
    return out if private is None else {**out, "learner_private_peak_gb": private}


def test_the_table_has_every_run_then_every_ratio():
    report = {"base": run(100.0, 60.0, 40.0, 10.0), "current": run(80.0, 45.0, 35.0, 7.6, 6.0)}
    report["variant"] = run(90.0, 55.0, None, 3.8, 3.0)
    report["ratios"] = step_cost.ratios(report)
    table = step_cost.step_table(report)
    assert [r["tree"] for r in table] == ["base", "current", "variant", "current / base", "variant / base",
                                          "variant / current"]  # fmt: skip
    by = {r["tree"]: r for r in table}
    assert by["current / base"]["step_s"] == 0.8 and by["variant / current"]["learner_peak_gb"] == 0.5
    assert by["variant / base"]["wait_rollout_s"] is None  # a mean that is missing stays missing
    assert by["variant"]["learner_peak_gb"] == pytest.approx(3.8)
    # the private peak (resident less shared pages): a base stored before it was sampled has none
    assert by["variant / current"]["learner_private_peak_gb"] == 0.5 and by["base"]["learner_private_peak_gb"] is None


def test_without_a_base_only_the_variant_is_compared_with_current():
    report = {"current": run(80.0, 45.0, 35.0, 7.6), "variant": run(88.0, 54.0, 34.0, 3.8)}
    report["ratios"] = step_cost.ratios(report)
    assert list(report["ratios"]) == ["variant / current"]
    assert report["ratios"]["variant / current"]["learner_s"] == pytest.approx(1.2)


def test_every_variant_is_a_run_of_its_own_compared_with_every_other():
    report = {"current": run(80.0, 45.0, 35.0, 7.6), "variant": run(88.0, 54.0, 34.0, 4.0)}
    report["variant2"] = run(70.0, 36.0, 34.0, 4.4)
    report["ratios"] = step_cost.ratios(report)
    assert list(report["ratios"]) == ["variant / current", "variant2 / current", "variant2 / variant"]
    assert [r["tree"] for r in step_cost.step_table(report)][:3] == ["current", "variant", "variant2"]
    assert report["ratios"]["variant2 / current"]["learner_s"] == pytest.approx(0.8)


def test_a_run_says_where_its_learners_memory_went():
    """The learner's own breakdown at the last step (learner/memory/*) beside the sampled peak;
    what no tensor it counts explains (activations, logits, libraries, the allocator's keep) is
    the rest. A base that logged none has no breakdown."""
    last = {"step": 3, "time/step_s": 1.0, "learner/memory/parameters_gb": 0.27, "learner/memory/gradients_gb": 0.27,
            "learner/memory/optimizer_gb": 1.08, "learner/memory/deepspeed_gb": 1.08,
            "learner/memory/rss_shmem_gb": 0.3, "learner/memory/rss_peak_gb": 4.0}  # fmt: skip
    raw = {"rows": [{"step": 2, "time/step_s": 1.0}, last], "learner_peak_gb": 4.2, "wall_s": 9.0}
    mem = step_cost.summarise(raw, warmup=1)["learner_memory_gb"]
    assert mem["parameters"] == 0.27 and mem["optimizer"] == 1.08 and mem["rss_shmem"] == 0.3
    assert mem["rest"] == pytest.approx(4.2 - 0.27 - 0.27 - 1.08 - 1.08 - 0.3)
    assert step_cost.summarise({**raw, "rows": [{"step": 2, "time/step_s": 1.0}]}, 1)["learner_memory_gb"] is None
