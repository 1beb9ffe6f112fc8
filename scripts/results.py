"""Rebuild or check the stored results behind the docs (``pipeline/tools/results.py``).

python scripts/results.py rebuild   # every docs/results/<name>/ table from its runs, then the docs' blocks
python scripts/results.py check     # exit 1, listing each stored table or doc block that does not follow
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.tools.results import check, doc_files, rebuild_folder, rewrite_blocks  # noqa: E402


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    results = ROOT / "docs" / "results"
    if what == "rebuild":
        for folder in sorted(p for p in results.iterdir() if (p / "runs").is_dir()):
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
    problems = check(ROOT)
    for p in problems:
        print(f"results: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
