"""scripts/bench/env_stats.py: its table, its WebShop split statistics against the split test's,
and the stored result folder (docs/results/env_stats) against what the split tests assert."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_split_search_qa import EXPECTED as SEARCH_QA_EXPECTED
from test_split_webshop import EXPECTED as WEBSHOP_EXPECTED
from test_split_webshop import N_GOALS

from envs.code_edit.tasks import SPLIT_PAIRS

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("env_stats", ROOT / "scripts" / "bench" / "env_stats.py")
env_stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env_stats)
STORED = ROOT / "docs" / "results" / "env_stats" / "results.json"


def test_the_table_has_one_row_per_leaf_of_each_section():
    report = {
        "command": "python scripts/bench/env_stats.py",
        "seconds": 12.5,
        "webshop": {"split": {"valid": 0, "draws": {"mean": 9.25, "max": 68}}, "ok": True},
        "alfworld": {"games": [{"seconds": 1.0}], "seconds": [0.5, 12.0]},
        "elsewhere": {"x": 1},
    }
    assert env_stats.table_rows(report) == [
        {"section": "alfworld", "key": "seconds", "value": "0.5, 12"},  # a list of records stays in results.json
        {"section": "webshop", "key": "split.valid", "value": "0"},
        {"section": "webshop", "key": "split.draws.mean", "value": "9.25"},
        {"section": "webshop", "key": "split.draws.max", "value": "68"},
        {"section": "webshop", "key": "ok", "value": "true"},
    ]


def test_the_webshop_split_statistics_are_the_split_tests():
    got = env_stats.webshop_split({s: N_GOALS for s in ("train", "valid", "test")})
    for split, (targets, requirements, instructions) in WEBSHOP_EXPECTED[(0, 400)].items():
        assert got["distinct_targets"][split] == targets
        assert got["distinct_requirements"][split] == requirements
        assert got["distinct_instructions"][split] == instructions
    for key in (
        "held_out_tasks_with_a_train_requirement",
        "held_out_tasks_with_a_train_instruction",
        "held_out_targets_in_train",
    ):
        assert got[key] == {"valid": 0, "test": 0}, key


@pytest.mark.skipif(not STORED.exists(), reason="no stored docs/results/env_stats")
def test_the_stored_results_agree_with_the_split_tests():
    r = json.loads(STORED.read_text())
    for case in r["alfworld"]["split"].values():
        assert case["valid_seen_tasks_sharing_a_train_goal_key"] == 0
        assert case["valid_unseen_tasks_sharing_a_train_goal_key"] == 0
    split = r["code_edit"]["split"]
    assert split["pairs"] == {s: sum(map(len, fams.values())) for s, fams in SPLIT_PAIRS.items()}
    assert split["held_out_pairs_in_train"] == split["held_out_instructions_in_train"] == {"valid": 0, "test": 0}
    generated = r["search_qa"]["generated"]
    assert generated["questions_by_split"] == SEARCH_QA_EXPECTED[(0, 200)][0]
    assert generated["default_task_lists"] == {"train": 2015, "valid": 273, "test": 312}
    if "wiki" in r["search_qa"]:
        assert r["search_qa"]["wiki"]["questions_by_split"] == {"train": 5066, "valid": 623, "test": 650}
    ws = r["webshop"]["split"]
    assert ws["held_out_tasks_with_a_train_requirement"] == {"valid": 0, "test": 0}
    assert ws["held_out_tasks_with_a_train_instruction"] == {"valid": 0, "test": 0}
    assert ws["held_out_targets_in_train"] == {"valid": 0, "test": 0}
