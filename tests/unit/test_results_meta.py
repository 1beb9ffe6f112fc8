"""A result folder's metadata (scripts/lab/results.py) where the code is not a git checkout."""

from __future__ import annotations

import json

from lab.results import git_commit, write_benchmark


def test_a_tree_without_git_is_named_so_instead_of_failing(tmp_path):
    # the GPU machine receives a copy of the tree, not a repository
    assert git_commit(tmp_path) == {"commit": "unknown (no git repository)", "dirty": None}


def test_a_benchmark_folder_holds_its_command_commit_machine_and_table(tmp_path):
    out = tmp_path / "bench"
    report = {"command": "python scripts/bench/x.py --out bench", "value": 1.5}
    write_benchmark(out, tmp_path, report, [{"a": 1, "b": "x"}], {"commit": "abc", "dirty": False}, ["w=1"])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["commit"] == "abc" and meta["command"] == report["command"] and meta["workload"] == ["w=1"]
    assert meta["machine"]["cpu_kind"] and json.loads((out / "results.json").read_text()) == report
    assert (out / "table.md").read_text().splitlines()[2] == "| 1 | x |"
    assert (out / "command.txt").read_text().endswith("x.py --out bench\n")
