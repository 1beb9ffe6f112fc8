"""Compare the metrics of the same fixed-seed run at two commits, step by step.

``python compare.py <out> [after]`` reads ``<out>/before/<method>/metrics.jsonl`` and
``<out>/<after>/<method>/metrics.jsonl`` (what ``run.sh`` writes; ``after`` defaults to
``after``), prints per method which metrics are equal at every step and the largest relative
difference of the others, and writes ``<out>/comparison.json`` (``comparison_<after>.json``).
Timing keys are left out: they differ between any two runs of any code.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TIMING = re.compile(r"(seconds|_s$|time|per_s|throughput|memory|rss|peak|wait|idle|latency|step_fraction)")
METHODS = ("grpo", "sdar", "targeted_guidance")
EPISODES = ("rollout/reward", "rollout/success", "rollout/response_tokens")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def compare(a: list[dict], b: list[dict]) -> dict:
    assert [r["step"] for r in a] == [r["step"] for r in b], "the runs trained different steps"
    keys = set().union(*a) & set().union(*b)
    common = sorted(k for k in keys if not TIMING.search(k) and k != "step")
    equal = [k for k in common if all(ra.get(k) == rb.get(k) for ra, rb in zip(a, b))]
    rel: dict[str, float] = {}
    for k in common:
        for ra, rb in zip(a, b):
            va, vb = ra.get(k), rb.get(k)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va != vb:
                rel[k] = max(rel.get(k, 0.0), abs(va - vb) / max(abs(va), abs(vb), 1e-12))
    return {"compared": len(common), "equal": equal, "max_relative_difference": rel}


def main() -> None:
    root, after = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "after")
    out = {}
    for m in METHODS:
        a, b = rows(root / "before" / m / "metrics.jsonl"), rows(root / after / m / "metrics.jsonl")
        out[m] = c = compare(a, b)
        episodes = [k for k in EPISODES if k in c["equal"]]
        print(f"{m}: {c['compared']} metrics x {len(a)} steps; {len(c['equal'])} equal at every step ({episodes})")
        for k, r in sorted(c["max_relative_difference"].items(), key=lambda x: -x[1]):
            print(f"   {k}: max relative difference {r:.2e}")
    name = "comparison.json" if after == "after" else f"comparison_{after}.json"
    (root / name).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
