"""Rebuild, check or pack the stored results behind the docs (``scripts/lab/results.py``).

python scripts/results.py rebuild        # every docs/results/<name>/ table from its runs, then the docs' blocks
python scripts/results.py check          # exit 1, listing each stored table or doc block that does not follow,
                                         # or a folder whose runs span commits without a README "Commits:" line;
                                         # runs of unknown commit or from an unclean tree are reported, not refused
python scripts/results.py pack [FOLDER]  # a folder's loose runs/ into its runs.tar.xz (default: every such folder)
"""

from __future__ import annotations

import sys
from pathlib import Path

from lab.checkout import ROOT
from lab.results import RUNS, check, commit_notes, doc_files, has_runs, pack_runs, rebuild_folder, rewrite_blocks


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    results = ROOT / "docs" / "results"
    if what == "pack":
        folders = [Path(f) for f in sys.argv[2:]] or sorted(p.parent for p in results.glob(f"*/{RUNS}"))
        for folder in folders:
            print(f"results: {folder}: {pack_runs(folder)} runs in its archive")
        return 0
    if what == "rebuild":
        for folder in sorted(p for p in results.iterdir() if has_runs(p)):
            rebuild_folder(folder)
            print(f"results: {folder.relative_to(ROOT)}: tables rebuilt from its runs")
        for doc in doc_files(ROOT):
            text = doc.read_text()
            new = rewrite_blocks(text, results)
            if new != text:
                doc.write_text(new)
                print(f"results: {doc.relative_to(ROOT)}: blocks rewritten")
    elif what != "check":
        print(__doc__, file=sys.stderr)
        return 2
    for note in commit_notes(ROOT):  # reported, not refused
        print(f"results: note: {note}")
    problems = check(ROOT)
    for p in problems:
        print(f"results: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
