"""scripts/bench/learning.py and the stored results (scripts/lab/results.py) on hand-made runs:
the test split's intervals, the paired differences, the repeats, the result folder and its check."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from lab import results
from lab.stats import mean_interval, paired_interval, task_bootstrap_interval

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "scripts" / "bench" / "learning.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

T_975 = {1: 12.706204736, 2: 4.302652730}  # Student t quantiles (closed form for the intervals)


def write_run(
    root: Path, name: str, curve: list[float], test_won: list[int], seconds: float = 60.0, extra: dict | None = None
) -> Path:
    """A finished run's folder as scripts/train.py writes it (metrics, summary, per-task outcomes)."""
    d = root / name
    (d / "outcomes").mkdir(parents=True)
    rows = [{"step": s, "val/success": v} for s, v in enumerate(curve)]
    rows[-1]["final/test/success"] = sum(test_won) / len(test_won)
    rows[-1].update(extra or {})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = len(curve) - 1
    (d / "summary.json").write_text(json.dumps({"seconds": seconds, "steps": step}))
    for tag, won in (("t1", test_won), ("greedy", [1 - w for w in test_won])):  # the second temperature differs
        lines = [
            {"task": i, "task_id": f"k-{i}", "seed": i, "won": bool(w), "reward": float(w), "turns": 1, "error": ""}
            for i, w in enumerate(won)
        ]
        (d / "outcomes" / f"final_test_step{step:04d}_{tag}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines)
        )
    return d


def make_runs(root: Path) -> Path:
    runs = root / "runs"
    write_run(runs, "start_s0", [0.2], [1, 0, 0, 0])
    write_run(runs, "grpo_s0", [0.2, 0.4], [1, 1, 0, 0])
    write_run(runs, "grpo_s1", [0.2, 0.6], [1, 1, 1, 0])
    write_run(runs, "grpo_s0_r2", [0.2, 0.5], [1, 0, 0, 0])
    write_run(
        runs,
        "hint_distill_s0",
        [0.2, 0.8],
        [1, 1, 1, 0],
        extra={"teacher/gap_abs_mean": 0.5, "noise/gap_abs_mean": 0.1, "sd/kl": 0.02},
    )
    write_run(
        runs,
        "hint_distill_s1",
        [0.2, 0.9],
        [1, 1, 1, 1],
        extra={"teacher/gap_abs_mean": 0.7, "noise/gap_abs_mean": 0.1, "sd/kl": 0.04},
    )
    return root


def test_the_intervals_are_the_t_intervals_of_their_closed_form():
    m = mean_interval([1.0, 2.0, 3.0])
    half = T_975[2] * 1.0 / 3**0.5
    assert (m.mean, m.low, m.high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    d = paired_interval([0.5, 0.75], [0.5, 0.5])  # differences 0 and 0.25: mean 0.125, sd 0.177
    half = T_975[1] * (0.25 / 2**0.5) / 2**0.5
    assert (d.mean, d.low, d.high) == pytest.approx((0.125, 0.125 - half, 0.125 + half))
    assert not d.excludes_zero() and 0.0 < d.p_value < 1.0
    assert mean_interval([0.5]).text() == "0.500 (n=1)"
    near_one = mean_interval([0.9, 1.0]).clipped(0.0, 1.0)
    assert near_one.high == 1.0 and near_one.low == pytest.approx(0.95 - T_975[1] * 0.05)
    same = paired_interval([0.6, 0.7], [0.5, 0.6])
    assert (same.low, same.high) == pytest.approx((0.1, 0.1)) and same.excludes_zero()


def test_the_task_bootstrap_brackets_the_mean_and_is_reproducible():
    a = [[1, 1, 0, 1, 0, 1, 1, 0], [1, 0, 1, 1, 1, 1, 0, 1]]
    b = [[0, 1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0, 0, 1]]
    ci = task_bootstrap_interval(a, b)
    assert ci.mean == pytest.approx(6 / 16) and ci.low < ci.mean < ci.high
    assert task_bootstrap_interval(a, b) == ci
    with pytest.raises(ValueError, match="one shape"):
        task_bootstrap_interval(a, b[:1])


def test_the_table_reads_the_test_split_pairs_seeds_and_keeps_repeats_apart(tmp_path):
    folder = make_runs(tmp_path)
    tables = results.learning_tables(results.load_runs(folder))
    by = {r["method"]: r for r in tables["table"]}
    assert [r["method"] for r in tables["table"]] == ["start", "grpo", "hint_distill"]
    # grpo's first runs only (0.5, 0.75), not the repeat of seed 0
    half = T_975[1] * (0.25 / 2**0.5) / 2**0.5  # 1.59: the t interval of 2 seeds, cut to [0, 1]
    assert half > 0.625 and by["grpo"]["test success"] == "0.625 [0.000, 1.000]"
    assert by["grpo"]["runs"] == "2" and by["start"]["test success"] == "0.250 (n=1)"
    # hint_distill - grpo: 0.75 - 0.5 and 1.0 - 0.75: both +0.25, a zero-width interval
    assert by["hint_distill"]["test - grpo"].startswith("0.250 [0.250, 0.250]")
    assert by["hint_distill"]["seeds +/=/- grpo"] == "2/0/0"
    assert by["hint_distill"]["test - start"].startswith("0.625 [")  # 0.75 - 0.25, 1.0 - 0.25
    assert by["hint_distill"]["test - grpo, by task"]  # the per-task outcomes were found
    assert by["hint_distill"]["teacher |gap|"] == "0.600" and by["hint_distill"]["noise |gap|"] == "0.100"
    assert by["hint_distill"]["distill KL"] == "0.0300"
    assert by["grpo"]["valid: start -> end"] == "0.200 -> 0.500"
    assert by["grpo"]["steps"] == "1" and by["start"]["steps"] == "0"
    assert [list(r) for r in tables["summary"]][1] == [
        "method",
        "runs",
        "test success",
        "test - grpo",
        "seeds +/=/- grpo",
        "test - start",
    ]
    [pair] = tables["pairs"]
    assert (pair["a"], pair["b"], pair["seeds +/=/-"]) == ("hint_distill", "grpo", "2/0/0")
    assert pair["test: a - b"] == by["hint_distill"]["test - grpo"]
    [rep] = tables["repeats"]
    assert rep["method"] == "grpo" and rep["test, run 1"] == "0.500" and rep["test, run 2"] == "0.250"
    assert rep["same-seed difference"] == "0.250" and rep["std over seeds"] == "0.177"


def test_a_result_folder_and_the_docs_blocks_are_checked_against_their_runs(tmp_path):
    root = tmp_path / "repo"
    folder = make_runs(root / "docs" / "results" / "toy")
    results.pack_runs(folder)
    results.write_meta(folder, ROOT, kind="learning", command="python x", baseline="grpo", split="test")
    results.rebuild_folder(folder)
    (root / "README.md").write_text("intro\n<!-- results: toy/table -->\nstale\n<!-- /results -->\nend\n")
    assert any("block toy/table differs" in p for p in results.check(root))
    (root / "README.md").write_text(results.rewrite_blocks((root / "README.md").read_text(), root / "docs" / "results"))
    assert results.check(root) == []
    assert (folder / "table.md").read_text() in (root / "README.md").read_text()
    # a run's data changed after the table was made: the check names the stale table
    write_run(folder / "runs", "grpo_s1", [0.2, 0.6], [1, 1, 0, 0])
    results.pack_runs(folder)
    problems = results.check(root)
    assert any("table.json: does not follow" in p for p in problems)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["machine"]["cpu_kind"] in ("avx512_bf16", "AVX-512 without bf16", "AVX2 only", "unknown")
    assert len(meta["commit"]) == 40


def test_a_finished_point_loses_its_checkpoints_unless_kept_with_a_fake_train_process(tmp_path, monkeypatch):
    """run_point around a FAKE scripts/train.py (a function writing what a run writes)."""
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        run_dir = Path(next(a for a in cmd if a.startswith("trainer.run_dir=")).split("=", 1)[1])
        (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"0" * 1024)
        (run_dir / "phase1_teacher" / "checkpoints" / "step_1").mkdir(parents=True)  # RetireOPD's phase 1
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success": 0.5}) + "\n")
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 3.0}))
        return 0

    monkeypatch.setattr(bench.CHILDREN, "run", fake_run)
    d = bench.run_point(tmp_path, "grpo", 0, [])
    assert d == tmp_path / "grpo_s0" and results.load_run(d).seconds == 3.0
    assert not (tmp_path / "grpo_s0" / "checkpoints").exists()
    assert not (tmp_path / "grpo_s0" / "phase1_teacher" / "checkpoints").exists()
    assert (tmp_path / "grpo_s0" / "phase1_teacher").is_dir()  # its metrics stay
    bench.run_point(tmp_path, "grpo", 1, [], keep_checkpoints=True, repeat=2)
    assert (tmp_path / "grpo_s1_r2" / "checkpoints" / "step_2" / "model.safetensors").exists()
    bench.run_point(tmp_path, "start", 0, ["+experiment=x", "trainer.total_steps=8"])
    start = calls[-1]
    assert "trainer.total_steps=8" not in start and start[-2:] == ["trainer.total_steps=0", "trainer.val_at_start=true"]
    assert not any(a.startswith("method=") for a in start)
    bench.run_point(tmp_path, "start", 1, ["+experiment=x", "trainer.val_at_start=false"])
    assert calls[-1][-2:] == ["trainer.total_steps=0", "trainer.val_at_start=false"]  # a test-only start


def test_a_stopped_point_is_resumed_and_a_finished_one_skipped_with_a_fake_train_process(tmp_path, monkeypatch):
    """run_point around a FAKE scripts/train.py: a point whose summary says a signal stopped it
    (``finished: false``) runs again with ``trainer.resume=auto``; a finished one (or one from
    before the field) is not run again."""
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        run_dir = Path(next(a for a in cmd if a.startswith("trainer.run_dir=")).split("=", 1)[1])
        (run_dir / "summary.json").write_text(json.dumps({"steps": 16, "finished": True, "seconds": 1.0}))
        return 0

    monkeypatch.setattr(bench.CHILDREN, "run", fake_run)
    for name, summary in [("grpo_s0", {"steps": 0, "finished": False}), ("grpo_s1", {"steps": 16, "finished": True}),
                          ("grpo_s2", {"steps": 16})]:  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({**summary, "seconds": 1.0}))
    for seed in (0, 1, 2):
        assert bench.run_point(tmp_path, "grpo", seed, ["method.lam=0.1"]) == tmp_path / f"grpo_s{seed}"
    assert len(calls) == 1 and "trainer.run_dir=" + str(tmp_path / "grpo_s0") in calls[0]
    assert calls[0].index("trainer.resume=auto") < calls[0].index("method.lam=0.1")  # a preset may override it
    assert json.loads((tmp_path / "grpo_s0" / "summary.json").read_text())["finished"]


def test_points_side_by_side_join_one_cluster_start_first_and_share_a_time_budget_with_a_fake_train_process(
    tmp_path, monkeypatch
):
    """run_plan around a FAKE scripts/train.py and a FAKE cluster: the start runs alone and first,
    the trained points overlap (each starts before any other ends: an ordering, not a duration),
    each joins the cluster, logs to its own train.log and gets the budget left as its time limit."""
    import threading

    events, lock = [], threading.Lock()

    def fake_run(cmd, cwd, **kw):
        run_dir = Path(next(a for a in cmd if a.startswith("trainer.run_dir=")).split("=", 1)[1])
        with lock:
            events.append(("begin", run_dir.name))
        assert kw["stdout"].name == str(run_dir / "train.log")
        time.sleep(0.3)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success": 0.5}) + "\n")
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 0.3, "steps": 2}))
        with lock:
            events.append(("end", run_dir.name, cmd))
        return 0

    @contextlib.contextmanager
    def fake_cluster(parallel):
        events.append(("cluster", parallel))
        yield "10.0.0.1:6379"
        events.append(("cluster down",))

    monkeypatch.setattr(bench.CHILDREN, "run", fake_run)
    monkeypatch.setattr(bench, "shared_cluster", fake_cluster)
    plan = [("start", 0, 1), ("grpo", 0, 1), ("hint_distill", 0, 1), ("grpo", 1, 1)]
    dirs = bench.run_plan(tmp_path, plan, lambda m: [f"+x={m}"], parallel=3, time_budget_s=3600, reserve_s=600)
    assert [d.name for d in dirs] == ["start_s0", "grpo_s0", "hint_distill_s0", "grpo_s1"]
    assert events[0] == ("cluster", 3) and events[-1] == ("cluster down",)
    assert events[1:3] == [("begin", "start_s0"), events[2]] and events[2][:2] == ("end", "start_s0")
    trained = events[3:-1]
    assert [e[0] for e in trained] == ["begin"] * 3 + ["end"] * 3  # all three at once
    for e in (e for e in events if e[0] == "end"):
        cmd = e[2]
        assert "cluster.address=10.0.0.1:6379" in cmd
        # 3 points at once: each actor gets a third of the cores (one busy actor per point at lag 0)
        assert f"cluster.threads_per_actor={max(1, (os.cpu_count() or 1) // 3)}" in cmd
        limits = [a for a in cmd if a.startswith("trainer.time_limit_s=")]
        if e[1] == "start_s0":
            assert limits == []  # the start is evaluated, never trained
        else:
            assert [2990 <= float(a.split("=")[1]) <= 3000 for a in limits] == [True]
    # a budget cannot be shared fairly among points that do not all run at once
    with pytest.raises(SystemExit, match="--parallel 3"):
        bench.run_plan(tmp_path / "b", plan, lambda m: [], parallel=2, time_budget_s=60)
    # threads the user set are kept
    events.clear()
    bench.run_plan(tmp_path / "c", plan[:2], lambda m: ["cluster.threads_per_actor=5"], parallel=2)
    [cmd] = [e[2] for e in events if e[0] == "end" and e[1] == "grpo_s0"]
    assert [a for a in cmd if a.startswith("cluster.threads_per_actor=")] == ["cluster.threads_per_actor=5"]


def test_time_limited_runs_that_stopped_at_different_steps_show_the_range(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "grpo_s0", [0.2, 0.4, 0.5], [1, 1, 0, 0])
    write_run(runs, "grpo_s1", [0.2, 0.6], [1, 1, 1, 0])
    [row] = results.learning_tables(results.load_runs(tmp_path))["table"]
    assert row["steps"] == "1-2"


def test_a_stopped_comparison_writes_no_tables_and_exits_with_the_signal(tmp_path, monkeypatch):
    """A stop signal during the points (their checkpoints saved, bench.CHILDREN.stopped set): no
    table, plot or result folder is written from the points that happened to be finished, and the
    exit status is the shell's for the signal. run_plan here is a FAKE that records the stop."""
    monkeypatch.setattr(bench.CHILDREN, "stopped", None)
    monkeypatch.setattr(bench.CHILDREN, "install", lambda: None)

    def stopped_plan(*_a, **_k):
        bench.CHILDREN.stopped = 15  # SIGTERM
        return [None]

    monkeypatch.setattr(bench, "run_plan", stopped_plan)
    out, res = tmp_path / "out", tmp_path / "res"
    argv = ["learning.py", "--preset", "search_qa_methods", "--methods", "grpo", "--seeds", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--results", str(res), "--start-only"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 128 + 15
    assert not (out / "table.md").exists() and not (res / "meta.json").exists()
