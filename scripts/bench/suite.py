"""How long the test suite takes, and what it found: pytest run once, its JUnit report kept.

    python scripts/bench/suite.py --out docs/results/test_suite -- -q --ignore=tests/vllm_engine
    .venv-vllm/bin/python scripts/bench/suite.py --out DIR --part vllm -- -q tests/vllm_engine

Runs ``python -m pytest <args> --junitxml=...`` with this interpreter, times it, and writes (with
``--out``) a result folder: ``results.json`` (counts, wall seconds, the 20 slowest tests),
``table.md`` (one row per part; a second ``--part`` run adds its row to the same folder) and
``meta.json``. Run it alone on the machine: other load changes every duration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from lab.bench import ROOT, Bench, add_out


def summarise(junit: Path) -> dict:
    cases = []
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in ET.parse(junit).getroot().iter("testcase"):
        status = "passed"
        for tag, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            if case.find(tag) is not None:
                status = name
        counts[status] += 1
        cases.append((float(case.get("time", 0.0)), f"{case.get('classname')}::{case.get('name')}", status))
    cases.sort(reverse=True)
    return {**counts, "slowest": [{"test": n, "seconds": round(t, 1), "status": s} for t, n, s in cases[:20]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out(ap, help="a result folder; a part already in it is replaced")
    ap.add_argument("--part", default="main", help="the name of this run's row (main, vllm, ...)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"]
    bench = Bench.start(args.out)  # the code tested, read before it runs
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "junit.xml"
        t0 = time.time()
        rc = subprocess.call([sys.executable, "-m", "pytest", *pytest_args, f"--junitxml={junit}"], cwd=ROOT)
        seconds = time.time() - t0
        part = {"command": bench.command, "pytest_args": pytest_args, "exit_code": rc, "seconds": round(seconds, 1)}
        part.update(summarise(junit))
    print(json.dumps({k: v for k, v in part.items() if k != "slowest"}))
    if bench.out:
        out = bench.out
        report = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
        parts = {**report.get("parts", {}), args.part: part}
        rows = [
            {
                "part": name,
                "pytest arguments": " ".join(p["pytest_args"]),
                "passed": p["passed"],
                "failed": p["failed"] + p["errors"],
                "skipped": p["skipped"],
                "minutes": f"{p['seconds'] / 60:.1f}",
            }
            for name, p in parts.items()
        ]
        bench.store({"command": bench.command, "parts": parts}, rows, pytest_args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
