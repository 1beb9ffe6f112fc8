"""What every benchmark in scripts/bench/ shares: the checkout it measures, its ``--out`` result
folder, the commit read before it runs, and writing that folder.

    ap = argparse.ArgumentParser(); add_out(ap); args = ap.parse_args()
    bench = Bench.start(args.out)   # the command line and the commit, before anything runs
    ...
    bench.store(report, table_rows, workload)   # with --out: results.json, table.md/.json, meta.json, command.txt
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from lab.checkout import ROOT, git_commit
from lab.results import write_benchmark

__all__ = ["ROOT", "Bench", "add_out"]

OUT_HELP = "a result folder (results.json, table.md, meta.json, command.txt)"


def add_out(ap: argparse.ArgumentParser, help: str = OUT_HELP) -> None:
    ap.add_argument("--out", help=help)


@dataclass(frozen=True)
class Bench:
    out: Path | None  # --out: where the result folder goes (None: print only)
    command: str  # this process's command line, as a shell would run it again
    git: dict  # the commit the measured code is at, and whether the tree was dirty

    @classmethod
    def start(cls, out: str | None) -> Bench:
        """Read when the benchmark starts: the tree may change while it runs."""
        return cls(Path(out) if out else None, shlex.join([sys.executable, *sys.argv]), git_commit(ROOT))

    def store(self, report: dict, table: list[dict], workload: list[str] | None = None) -> None:
        """With ``--out``: the result folder of ``report`` (the whole of it) and its ``table``."""
        if self.out is None:
            return
        write_benchmark(self.out, ROOT, report, table, self.git, workload)
        print(f"wrote {self.out}/results.json, table.md, meta.json, command.txt", file=sys.stderr)
