"""Which code a run ran: the commit of the checkout it was started from and whether its tree was clean.

``source()`` is read once when a run starts (``run_training``; the working tree may change while
it trains) and written to the run's ``summary.json`` as ``{"commit": sha, "clean": bool}``, so a
result folder knows, run by run, whether its runs come from one commit
(``scripts/results.py check``). Never raises: where there is no git (a GPU machine gets a copy of
the tree, not a repository) or the directory is no repository, both fields are None.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # pipeline/core/ is two levels below the checkout


def _git(root: Path, *args: str) -> str | None:
    """The command's stdout, or None when git is missing, fails or hangs."""
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def source(root: Path | str = REPO) -> dict[str, str | bool | None]:
    """``{"commit": HEAD's sha or None, "clean": no change to any file git sees (tracked or
    untracked; ignored paths such as runs/ excepted), or None}``. Untracked files count: a new
    module that a run imports is code the commit does not hold."""
    commit = _git(Path(root), "rev-parse", "HEAD")
    if not commit or not commit.strip():
        return {"commit": None, "clean": None}
    status = _git(Path(root), "status", "--porcelain")
    return {"commit": commit.strip(), "clean": None if status is None else not status.strip()}
