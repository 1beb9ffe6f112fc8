"""Every stored result table follows from its runs, and every table quoted in README.md or docs/
is its folder's table (``scripts/results.py check``; ``rebuild`` fixes what it finds)."""

from pathlib import Path

from lab.results import BLOCK, check, doc_files

ROOT = Path(__file__).resolve().parents[2]


def test_stored_tables_follow_from_their_runs_and_the_docs_quote_them_exactly():
    assert check(ROOT) == []


def test_every_result_folder_is_quoted_somewhere_and_says_where_it_ran():
    results = ROOT / "docs" / "results"
    quoted = {m["ref"].split("/")[0] for doc in doc_files(ROOT) for m in BLOCK.finditer(doc.read_text())}
    folders = [p for p in results.iterdir() if p.is_dir()] if results.is_dir() else []
    for folder in folders:  # a folder no doc quotes says what it is in a README of its own
        assert folder.name in quoted or (folder / "README.md").exists(), folder
        assert (folder / "meta.json").exists(), folder
