"""The checkout the lab measures: where it is, and the commit it is at. Standard library only (the
GPU check's runner imports it before the payload is unpacked)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # scripts/lab/ is two levels down


def git_commit(root: Path = ROOT) -> dict:
    """The commit the code is at, and whether tracked files differ from it. Where there is no git
    (the GPU machine gets a copy of the tree, not a repository) both say so instead of failing."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": "unknown (no git repository)", "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
