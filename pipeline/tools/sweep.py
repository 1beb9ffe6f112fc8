"""Hydra callback writing a summary table of a multirun sweep when it ends.

Each job writes ``summary.json`` (first/last step metrics) into its own directory; at the end of
``python scripts/train.py -m ...`` this callback collects them with each job's overrides and writes
``sweep_summary.md`` and ``sweep_summary.csv`` into the sweep directory.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

COLUMNS = ["rollout/reward", "rollout/success", "val/success", "rollout/valid_action_rate",
           "policy/entropy", "opd/retired", "opd/retire_step", "sdar/gate_mean", "tg/kl",
           "adrs/shaping_abs_mean"]


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for summary in sorted(sweep_dir.glob("*/summary.json")):
        job = summary.parent
        data = json.loads(summary.read_text())
        overrides_file = job / ".hydra" / "overrides.yaml"
        overrides = ""
        if overrides_file.exists():
            lines = [x.strip()[2:] for x in overrides_file.read_text().splitlines() if x.strip().startswith("- ")]
            overrides = " ".join(lines)
        last = data.get("last", {})
        row = {"job": job.name, "overrides": overrides, "steps": data.get("steps")}
        row.update({k: last.get(k) for k in COLUMNS if k in last})
        rows.append(row)
    return rows


def write_tables(sweep_dir: Path, rows: list[dict[str, Any]]) -> Path:
    keys = ["job", "overrides", "steps"] + [c for c in COLUMNS if any(c in r for r in rows)]
    with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    out = sweep_dir / "sweep_summary.md"
    out.write_text("\n".join(lines) + "\n")
    return out


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect(sweep_dir)
        if rows:
            out = write_tables(sweep_dir, rows)
            print(f"privy-rl: sweep summary of {len(rows)} runs: {out}")
