"""Each run records the commit it ran and whether the tree was clean (``pipeline.core.provenance``),
and never fails where there is no git."""

from __future__ import annotations

import subprocess

from pipeline.core.provenance import REPO, source


def git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_a_clean_checkout_names_its_commit_and_any_change_makes_it_unclean(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert source(tmp_path) == {"commit": head, "clean": True}
    (tmp_path / "runs").mkdir()  # ignored output (a run's own directory) keeps the tree clean
    (tmp_path / "runs" / "metrics.jsonl").write_text("{}\n")
    assert source(tmp_path)["clean"] is True
    (tmp_path / "new_module.py").write_text("y = 2\n")  # untracked code a run could import
    assert source(tmp_path) == {"commit": head, "clean": False}
    (tmp_path / "new_module.py").unlink()
    (tmp_path / "a.py").write_text("x = 2\n")  # a tracked file edited
    assert source(tmp_path) == {"commit": head, "clean": False}


def test_without_a_repository_or_without_git_both_fields_are_none(tmp_path, monkeypatch):
    assert source(tmp_path) == {"commit": None, "clean": None}  # a copy of the tree, no .git
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    assert source(REPO) == {"commit": None, "clean": None}


def test_the_default_is_this_checkout():
    assert source()["commit"] == git(REPO, "rev-parse", "HEAD")


# ----- the results check reads it -------------------------------------------------------------------
def result_folder(root, commits: dict[str, str | list[dict] | None]):
    """A learning folder of docs/results whose runs (point -> the commit its summary records, or the
    parts of a resumed run) are packed, with its meta and tables, so that only what the runs record
    can differ."""
    import json

    from lab import results

    (root / "README.md").write_text("a checkout's README (the check reads every doc)\n")
    folder = root / "docs" / "results" / "toy"
    for point, commit in commits.items():
        d = folder / "runs" / point
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "final/test/success": 0.5}) + "\n")
        summary = {"steps": 1, "seconds": 1.0} if commit is None else {"steps": 1, "commit": commit, "clean": True}
        if isinstance(commit, list):
            summary = {"steps": 1, "commit": commit[-1]["commit"], "clean": True, "parts": commit}
        (d / "summary.json").write_text(json.dumps(summary))
    results.pack_runs(folder)
    results.write_meta(folder, REPO, kind="learning", command="python x", baseline="grpo", split="test")
    results.rebuild_folder(folder)
    return folder


def test_the_check_refuses_runs_of_several_commits_unless_the_readme_says_why(tmp_path):
    from lab import results

    folder = result_folder(tmp_path, {"grpo_s0": "a" * 40, "grpo_s1": "b" * 40, "sdar_s0": "a" * 40})
    [problem] = results.check(tmp_path)
    assert "runs come from 2 commits (aaaaaaaa (2 runs), bbbbbbbb (1 runs))" in problem and "Commits:" in problem
    (folder / "README.md").write_text("Some text.\n\nCommits: seed 1 ran after the fix of ...\n")
    assert results.check(tmp_path) == []
    assert results.commit_notes(tmp_path) == [
        "docs/results/toy: runs from 2 commits; its README.md says what is known (Commits:)"
    ]


def test_runs_that_record_no_commit_are_reported_not_refused(tmp_path):
    from lab import results

    result_folder(tmp_path, {"grpo_s0": None, "grpo_s1": "a" * 40})  # one old run, one new
    assert results.check(tmp_path) == []
    assert results.commit_notes(tmp_path) == [
        "docs/results/toy: commit unknown for 1 of 2 runs (stored before runs recorded it)"
    ]


def test_a_resumed_run_keeps_each_parts_commit_and_seconds_and_the_check_reads_them(tmp_path):
    import json

    from lab import results
    from pipeline.orchestration.run import _parts

    run = tmp_path / "run"
    run.mkdir()
    first = {"commit": "a" * 40, "clean": True, "steps": 11, "seconds": 1370.0}
    assert _parts(run, True, first) == [first]  # nothing before it
    (run / "summary.json").write_text(json.dumps({"steps": 11, "finished": False, **first}))
    second = {"commit": "b" * 40, "clean": True, "steps": 16, "seconds": 1249.0}
    assert _parts(run, True, second) == [first, second]
    assert _parts(run, False, second) == [second]  # started afresh in the same directory: its own
    (run / "summary.json").write_text(json.dumps({"parts": [first, second]}))
    third = {"commit": "c" * 40, "clean": False, "steps": 20, "seconds": 5.0}
    assert _parts(run, True, third) == [first, second, third]

    root = tmp_path / "checkout"
    root.mkdir()
    folder = result_folder(root, {"grpo_s0": "a" * 40, "grpo_s1": [{**first}, {**second}]})
    [problem] = results.check(root)  # one run of two parts is two commits
    assert "runs come from 2 commits (aaaaaaaa (2 runs), bbbbbbbb (1 runs))" in problem
    (folder / "README.md").write_text("Commits: seed 1 resumed at bbbbbbbb\n")
    assert results.check(root) == []
