"""A result folder's runs are stored as one archive (``runs.tar.xz``), the same bytes whenever it
is packed again, and the tables are recomputed from the archive itself (scripts/lab/results.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from lab import results

ROOT = Path(__file__).resolve().parents[2]


def write_point(runs: Path, name: str, test_success: float, seconds: float = 10.0) -> None:
    d = runs / name
    (d / "outcomes").mkdir(parents=True)
    rows = [{"step": 0, "val/success": 0.25}, {"step": 1, "val/success": 0.5, "final/test/success": test_success}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"seconds": seconds, "steps": 1}))
    (d / "config.yaml").write_text(f"name: {name}\n")
    won = [1.0] * int(test_success * 4) + [0.0] * (4 - int(test_success * 4))
    lines = [{"task": i, "won": w} for i, w in enumerate(won)]
    (d / "outcomes" / "final_test_step0001_t1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def folder_with_runs(root: Path) -> Path:
    folder = root / "toy"
    for name, success in (("start_s0", 0.25), ("grpo_s0", 0.5), ("grpo_s1", 0.75)):
        write_point(folder / "runs", name, success)
    return folder


def test_packing_replaces_the_loose_runs_by_one_archive_that_gives_the_same_tables(tmp_path):
    folder = folder_with_runs(tmp_path)
    loose = results.learning_tables(results.load_runs(folder))
    results.pack_runs(folder)
    assert not (folder / "runs").exists() and (folder / results.RUNS_ARCHIVE).is_file()
    assert results.learning_tables(results.load_runs(folder)) == loose
    assert [r.method for r in results.load_runs(folder)] == ["grpo", "grpo", "start"]


def test_the_archive_is_deterministic_sorted_and_names_no_owner_or_time(tmp_path):
    first = folder_with_runs(tmp_path / "a")
    results.pack_runs(first)
    second = folder_with_runs(tmp_path / "b")  # written later: other mtimes
    (second / "runs" / "grpo_s1" / "summary.json").touch()
    results.pack_runs(second)
    data = (first / results.RUNS_ARCHIVE).read_bytes()
    assert data == (second / results.RUNS_ARCHIVE).read_bytes()
    with tarfile.open(first / results.RUNS_ARCHIVE, "r:xz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and "runs/grpo_s0/outcomes/final_test_step0001_t1.jsonl" in names
    assert all(m.isfile() and m.mtime == 0 and (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "") for m in members)
    results.pack_runs(first)  # nothing loose: packing again changes nothing
    assert (first / results.RUNS_ARCHIVE).read_bytes() == data


def test_runs_stored_after_packing_replace_their_namesakes_and_keep_the_others(tmp_path):
    folder = folder_with_runs(tmp_path)
    results.pack_runs(folder)
    write_point(folder / "runs", "grpo_s1", 0.0, seconds=99.0)  # grpo_s1 run again
    write_point(folder / "runs", "grpo_s2", 1.0)  # and a new seed
    results.pack_runs(folder)
    by = {(r.method, r.seed): r for r in results.load_runs(folder)}
    assert sorted(by) == [("grpo", 0), ("grpo", 1), ("grpo", 2), ("start", 0)]
    assert by["grpo", 1].seconds == 99.0 and by["grpo", 1].last("final/test/success") == 0.0


def test_the_check_reads_the_archive_and_refuses_loose_runs(tmp_path):
    root = tmp_path / "repo"
    folder = folder_with_runs(root / "docs" / "results")
    (root / "README.md").write_text("no blocks\n")
    results.write_meta(folder, ROOT, kind="learning", command="python x")
    results.rebuild_folder(folder)
    assert any("loose runs" in p and "pack" in p for p in results.check(root))
    results.pack_runs(folder)
    assert results.check(root) == []
    write_point(folder / "runs", "grpo_s1", 0.0)  # a run changed after the table was made
    results.pack_runs(folder)
    assert any("table.json: does not follow" in p and results.RUNS_ARCHIVE in p for p in results.check(root))


def test_the_results_script_packs_a_folder_named_on_its_command_line(tmp_path):
    folder = folder_with_runs(tmp_path)
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "results.py"), "pack", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert (folder / results.RUNS_ARCHIVE).is_file() and not (folder / "runs").exists()
    assert "3 runs" in res.stdout
