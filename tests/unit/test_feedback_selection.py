"""Feedback selection: the adoption rule on constructed outcome tables, and a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest

from pipeline.context.placement import FEEDBACK_HEADER
from pipeline.core.types import CriterionResult, Episode, Message
from pipeline.tools.feedback_selection import (
    Rates,
    adopt,
    adopted_map,
    feedback_view,
    load_candidates,
    markdown_table,
    rates,
    select,
)


@pytest.mark.parametrize(
    "pw,pwo,sw,swo,expected",
    [
        (0.6, 0.4, 0.5, 0.5, True),  # criterion up, success equal
        (0.6, 0.4, 0.6, 0.5, True),  # both up
        (0.4, 0.4, 0.9, 0.5, False),  # criterion flat
        (0.3, 0.4, 0.5, 0.5, False),  # criterion down
        (0.9, 0.4, 0.4, 0.5, False),  # success falls
    ],
)
def test_adoption_rule(pw, pwo, sw, swo, expected):
    assert adopt(pw, pwo, sw, swo) is expected


def test_select_applies_the_rule_per_criterion_against_one_baseline():
    table = {
        None: Rates({"format": 0.25, "brevity": 0.5}, 0.25, 4),
        "good format": Rates({"format": 0.75, "brevity": 0.5}, 0.25, 4),
        "hurts success": Rates({"format": 1.0, "brevity": 0.5}, 0.0, 4),
        "useless brevity": Rates({"format": 0.25, "brevity": 0.5}, 0.5, 4),
    }
    calls = []

    def evaluate(fb):
        calls.append(fb)
        return table[fb]

    cands = {"format": ["good format", "hurts success"], "brevity": ["useless brevity"]}
    outcomes = select(cands, evaluate)
    assert calls == [None, "good format", "hurts success", "useless brevity"]  # baseline evaluated once
    assert [(o.feedback, o.adopted) for o in outcomes] == [
        ("good format", True),
        ("hurts success", False),
        ("useless brevity", False),
    ]
    assert adopted_map(cands, outcomes) == {"format": ["good format"], "brevity": []}
    assert adopted_map(cands, select(cands, evaluate, min_gain=0.6)) == {"format": [], "brevity": []}
    md = markdown_table(outcomes)
    assert "| format | good format | 0.750 | 0.250 | 0.250 | 0.250 | yes |" in md


def test_rates_count_missing_verdicts_as_failures():
    eps = [
        Episode(
            task_id="a", env_name="k", seed=0, won=True, criteria=[CriterionResult(criterion="format", passed=True)]
        ),
        Episode(task_id="b", env_name="k", seed=1),
    ]
    r = rates(eps, ["format", "brevity"])
    assert r.passed == {"format": 0.5, "brevity": 0.0} and r.success == 0.5 and r.n == 2


def test_view_appends_feedback_to_last_user_message_and_candidates_load(tmp_path):
    prompt, _ = feedback_view("Be brief.").apply(
        [Message(role="user", content="task")], env=None, turn=0, default_system=None
    )
    assert prompt.messages[-1].content == f"task\n\n{FEEDBACK_HEADER}\nBe brief."
    (tmp_path / "c.yaml").write_text("format:\n  - use tags\n")
    assert load_candidates(tmp_path / "c.yaml") == {"format": ["use tags"]}
    (tmp_path / "bad.json").write_text(json.dumps({"format": "not a list"}))
    with pytest.raises(ValueError, match="expected a mapping"):
        load_candidates(tmp_path / "bad.json")


def test_end_to_end_tiny_model_on_keyword_writes_adopted_json_and_table(tmp_path):
    from scripts.select_feedback import main

    cands = {"format": ["Put the word inside <answer>...</answer>."], "brevity": ["Be very short."]}
    (tmp_path / "cands.json").write_text(json.dumps(cands))
    out = tmp_path / "out"
    assert (
        main(
            [
                "--env",
                "keyword",
                "--candidates",
                str(tmp_path / "cands.json"),
                "--tasks",
                "2",
                "--model",
                "tiny",
                "--out",
                str(out),
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    adopted = json.loads((out / "adopted.json").read_text())
    assert set(adopted) == {"format", "brevity"}
    table = (out / "feedback_selection.md").read_text()
    assert table.count("\n| format |") == 1 and table.count("\n| brevity |") == 1
    outcomes = json.loads((out / "outcomes.json").read_text())
    for o in outcomes:
        assert o["adopted"] == adopt(o["pass_with"], o["pass_without"], o["success_with"], o["success_without"])


def test_max_prompt_tokens_reaches_the_rollout_worker(tmp_path):
    # code_edit's system prompt alone is ~700 tokens: the script must let the prompt budget be raised
    # (and lowered); a budget below the keyword prompt must stop the run at the first prompt.
    from pipeline.context.student_prompts import PromptTooLong
    from scripts.select_feedback import main

    (tmp_path / "cands.json").write_text(json.dumps({"format": ["Use tags."]}))
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=16"):
        main(
            [
                "--env",
                "keyword",
                "--candidates",
                str(tmp_path / "cands.json"),
                "--tasks",
                "1",
                "--model",
                "tiny",
                "--out",
                str(tmp_path / "out"),
                "--max-new-tokens",
                "4",
                "--max-prompt-tokens",
                "16",
            ]
        )
