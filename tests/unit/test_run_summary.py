"""The line a finished run prints: its last train step, then held-out success at every validation."""

from __future__ import annotations

import json

from pipeline.tools.cli import summary_line


def test_the_summary_shows_held_out_success_from_the_start_to_the_end(tmp_path):
    rows = [
        {"step": 0, "val/success": 0.4375},
        {"step": 1, "rollout/success": 0.25},
        {"step": 2, "rollout/reward": 0.5, "rollout/success": 0.5, "val/success": 0.59375},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = summary_line(rows[1:], tmp_path)
    assert line == (
        f"privy-rl: done: 2 steps in {tmp_path}; last train reward 0.500, success 0.500; "
        "held-out success 0.438 (step 0) -> 0.594 (step 2)"
    )
    # a resumed run logs step 2 again: its validation is shown once, the later value
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "val/success": 0.625}) + "\n")
    assert summary_line(rows[1:], tmp_path).endswith("0.438 (step 0) -> 0.625 (step 2)")


def test_a_run_without_validation_prints_only_its_last_train_step(tmp_path):
    line = summary_line([{"rollout/reward": 1.0, "rollout/success": 1.0}], tmp_path)
    assert line.endswith("last train reward 1.000, success 1.000")


def test_the_summary_ends_with_each_final_split(tmp_path):
    rows = [
        {"step": 0, "val/success": 0.25},
        {
            "step": 4,
            "rollout/reward": 0.5,
            "rollout/success": 0.5,
            "val/success": 0.5,
            "final/valid_unseen/success": 0.375,
            "final/valid_unseen/greedy/success": 0.375,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert summary_line(rows[1:], tmp_path).endswith(
        "held-out success 0.250 (step 0) -> 0.500 (step 4); valid_unseen success 0.375"
    )


def test_an_evaluation_only_run_prints_its_validations_without_a_train_step(tmp_path):
    rows = [{"step": 0, "val/success": 0.09375, "final/valid_unseen/success": 0.0625}]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert summary_line([], tmp_path) == (
        f"privy-rl: done: 0 steps in {tmp_path}; held-out success 0.094 (step 0); valid_unseen success 0.062"
    )
