"""The summary of a sweep: one row per point, an aggregate over seeds, a plot of the primary metric.

Pure functions over the points' records (files in, files out; no Hydra, no Ray), so that a finished
sweep can be summarised again and the tables are testable on their own. ``pipeline/tools/sweep.py``
finds the points and calls ``write_report`` when a multirun ends.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

# Columns every summary has (blank where a point has no value), then the methods' own diagnostics
# (each column only when some point logged it): the metric name is ``<prefix>/<suffix>``, and the
# prefix differs between methods (sdar/gate_mean, opd/gate_mean, adrs/gate_mean).
FINAL = ["val/success", "rollout/reward", "rollout/success"]
BEST = "best val/success"
BASE_COLUMNS = ["val/success", BEST, "rollout/reward", "rollout/success", "steps", "wall_s"]
DIAGNOSTICS = {
    "gate_mean": "/gate_mean",
    "retire_step": "/retire_step",
    "privilege_gap": "val/privilege_gap",
    "shaping_abs_mean": "/shaping_abs_mean",
}


@dataclass
class Point:
    """One point of a sweep as its directory recorded it."""

    name: str  # its directory's name
    values: dict[str, str]  # swept key -> its value in this point
    status: str  # done | failed | running | stopped (from its record) | unfinished (no summary)
    overrides: list[str] = field(default_factory=list)
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Settings:
    metric: str = "val/success"
    goal: str = "max"
    aggregate: Sequence[str] = ("trainer.seed",)


# ----- one run's numbers -------------------------------------------------------------------------


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, one row per step. A resumed run logs again the steps after its checkpoint:
    the later row of a step wins."""
    path = run_dir / "metrics.jsonl"
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip():
            row = json.loads(line)
            by_step.setdefault(row["step"], {}).update(row)
    return [by_step[s] for s in sorted(by_step)]


def final_split_success(row: dict[str, Any]) -> dict[str, float]:
    """{split: success} of the trainer.final_val_splits a metrics row holds (``final/<split>/success``)."""
    return {
        k.split("/")[1]: v
        for k, v in row.items()
        if k.startswith("final/") and k.count("/") == 2 and k.endswith("/success")
    }


def run_metrics(rows: list[dict[str, Any]], metric: str) -> dict[str, float]:
    """Final values (the last logged), the best val/success, the last step, the diagnostics."""

    def final(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return vals[-1] if vals else None

    out: dict[str, float | None] = {k: final(k) for k in (metric, *FINAL)}
    val = [r["val/success"] for r in rows if r.get("val/success") is not None]
    out[BEST] = max(val) if val else None
    out["steps"] = rows[-1]["step"] if rows else None
    for col, suffix in DIAGNOSTICS.items():
        keys = sorted({k for r in rows for k in r if k.endswith(suffix)})
        out[col] = final(keys[0]) if keys else None
    return {k: v for k, v in out.items() if v is not None}


# ----- names and order ---------------------------------------------------------------------------


def column_names(keys: Sequence[str]) -> dict[str, str]:
    """A column per swept key: its last component (``method.beta`` -> ``beta``), the whole key
    where two swept keys end alike."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: short if last.count(short) == 1 else k for k, short in zip(keys, last)}


def _value_order(v: str) -> tuple:
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def _job_order(name: str) -> tuple:
    head = name.split("_", 1)[0]
    return (0, int(head), name) if head.isdigit() else (1, 0, name)


def metric_columns(points: Sequence[Point], metric: str) -> list[str]:
    present = {c for p in points for c in p.metrics}
    cols = [metric] + [c for c in BASE_COLUMNS if c != metric]
    return cols + [c for c in DIAGNOSTICS if c in present and c != metric]


# ----- aggregation -------------------------------------------------------------------------------


@dataclass
class Group:
    """The points that share the values of every swept key but the aggregated ones (seeds)."""

    values: dict[str, str]
    points: list[Point]

    @property
    def done(self) -> list[Point]:
        return [p for p in self.points if p.status == "done"]

    def stats(self, col: str) -> tuple[float, float, int] | None:
        """Mean, sample standard deviation and count over the finished points that have ``col``."""
        vals = [p.metrics[col] for p in self.done if col in p.metrics]
        if not vals:
            return None
        return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)


def aggregate(points: Sequence[Point], keys: Sequence[str], over: Sequence[str]) -> list[Group]:
    """One group per combination of the swept keys not in ``over``, in the order of their values."""
    others = [k for k in keys if k not in over]
    groups: dict[tuple, Group] = {}
    for p in points:
        combo = tuple(p.values.get(k, "") for k in others)
        groups.setdefault(combo, Group(dict(zip(others, combo)), [])).points.append(p)
    return [groups[c] for c in sorted(groups, key=lambda c: [_value_order(v) for v in c])]


def rank(items: list, score, goal: str) -> list:
    """Sorted best first by ``score`` (None last)."""

    def key(item) -> tuple[bool, float]:
        s = score(item)
        return s is None, 0.0 if s is None else (-s if goal == "max" else s)

    return sorted(items, key=key)


def _group_mean(metric: str):
    return lambda g: (g.stats(metric) or (None,))[0]


# ----- tables ------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e6 else f"{v:.4g}"
    return str(v)


def _mean_std(s: tuple[float, float, int] | None) -> str:
    if s is None:
        return ""
    mean, std, n = s
    return _fmt(mean) if n == 1 else f"{mean:.4g} ± {std:.2g}"


def points_table(points: Sequence[Point], keys: Sequence[str], settings: Settings) -> list[dict[str, str]]:
    """The per-point table in job order; ``best`` marks the best finished point."""
    names = column_names(keys)
    cols = metric_columns(points, settings.metric)
    ordered = sorted(points, key=lambda p: _job_order(p.name))
    done = [p for p in ordered if p.status == "done" and settings.metric in p.metrics]
    best = rank(done, lambda p: p.metrics[settings.metric], settings.goal)[:1]
    rows = []
    for p in ordered:
        row = {"best": "*" if p in best else "", "job": p.name}
        row.update({names[k]: p.values.get(k, "") for k in keys})
        row["status"] = p.status
        row.update({c: _fmt(p.metrics.get(c)) for c in cols})
        row["error"] = p.error
        rows.append(row)
    return rows


def groups_table(
    groups: Sequence[Group], keys: Sequence[str], settings: Settings, points: Sequence[Point]
) -> list[dict[str, str]]:
    """The aggregate table: mean ± std and n per group, best first."""
    names = column_names(keys)
    cols = metric_columns(points, settings.metric)
    ordered = rank(list(groups), _group_mean(settings.metric), settings.goal)
    rows = []
    for i, g in enumerate(ordered):
        row = {"best": "*" if i == 0 and g.stats(settings.metric) else ""}
        row.update({names[k]: v for k, v in g.values.items()})
        row["n"] = str(len(g.done))
        row["failed"] = str(len(g.points) - len(g.done))
        row.update({c: _mean_std(g.stats(c)) for c in cols})
        rows.append(row)
    return rows


def _markdown(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    keys = list(rows[0])
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)] + [
        "| " + " | ".join(esc(r[k]) for k in keys) + " |" for r in rows
    ]


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        w.writerows(rows)


@dataclass
class Report:
    markdown: Path
    points: int
    failed: int
    plot: Path | None


def write_report(
    sweep_dir: Path,
    points: Sequence[Point],
    keys: Sequence[str],
    settings: Settings,
    common: Sequence[str] = (),
    sweeps: Sequence[str] = (),
) -> Report:
    """``sweep_summary.md``, ``sweep_summary.csv`` (one row per point, with its full overrides),
    when a key of ``settings.aggregate`` is swept ``sweep_summary_aggregate.csv``, and
    ``sweep_summary.png``. ``common``: the overrides every point shares; ``sweeps``: the sweep's
    own (``method.beta=1,10``)."""
    over = [k for k in settings.aggregate if k in keys]
    groups = aggregate(points, keys, over)
    failed = sum(p.status != "done" for p in points)
    better = "higher" if settings.goal == "max" else "lower"
    md = [
        f"# Sweep {sweep_dir.name}",
        "",
        f"{len(points)} points, {len(points) - failed} done, {failed} not done. Primary metric: "
        f"the final `{settings.metric}` ({better} is better).",
        "",
    ]
    if common:
        md += ["Every point: `" + " ".join(common) + "`", ""]
    if sweeps:
        md += ["Swept: " + " ".join(f"`{s}`" for s in sweeps), ""]
    if over:
        table = groups_table(groups, keys, settings, points)
        md += [f"## Over {', '.join(over)}: mean ± std over n finished points", "", *_markdown(table), ""]
        _write_csv(sweep_dir / "sweep_summary_aggregate.csv", _aggregate_csv(groups, keys, settings, points))
    rows = points_table(points, keys, settings)
    md += ["## Points", "", *_markdown(rows), ""]
    by_name = {p.name: p for p in points}
    if keys:
        md += ["## The swept values of each point", ""]
        md += [f"- `{r['job']}`: `{' '.join(f'{k}={v}' for k, v in by_name[r['job']].values.items())}`" for r in rows]
        md.append("")
    for r in rows:
        r["overrides"] = " ".join(by_name[r["job"]].overrides)
    _write_csv(sweep_dir / "sweep_summary.csv", rows)
    out = sweep_dir / "sweep_summary.md"
    out.write_text("\n".join(md))
    plot = plot_sweep(sweep_dir / "sweep_summary.png", points, keys, settings)
    return Report(out, len(points), failed, plot)


def _aggregate_csv(groups, keys, settings, points) -> list[dict[str, Any]]:
    names = column_names(keys)
    rows = []
    for g in rank(list(groups), _group_mean(settings.metric), settings.goal):
        row: dict[str, Any] = {names[k]: v for k, v in g.values.items()}
        row.update(n=len(g.done), failed=len(g.points) - len(g.done))
        for c in metric_columns(points, settings.metric):
            s = g.stats(c)
            row[f"{c} mean"], row[f"{c} std"] = (s[0], s[1]) if s else ("", "")
        rows.append(row)
    return rows


# ----- the plot ----------------------------------------------------------------------------------


def _axis(values: Sequence[str]) -> tuple[list[float], bool] | None:
    """Numeric x positions and whether a log axis suits them (positive, spanning 10x), or None."""
    try:
        xs = [float(v) for v in values]
    except ValueError:
        return None
    log = all(x > 0 for x in xs) and max(xs) >= 10 * min(xs)
    return xs, log


def plot_sweep(path: Path, points: Sequence[Point], keys: Sequence[str], settings: Settings) -> Path | None:
    """The primary metric against each swept key (the aggregated ones excepted): one line per
    combination of the other keys, error bars the std over the aggregated points. None when no
    point has the metric."""
    over = [k for k in settings.aggregate if k in keys]
    xkeys = [k for k in keys if k not in over]
    if not xkeys:  # only seeds were swept: the metric of each point against its seed
        xkeys, over = list(keys), []
    groups = aggregate(points, keys, over)
    if not xkeys or not any(g.stats(settings.metric) for g in groups):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = column_names(keys)
    fig, axes = plt.subplots(1, len(xkeys), figsize=(4.5 * len(xkeys), 3.4), squeeze=False)
    for ax, xk in zip(axes.flat, xkeys):
        rest = [k for k in xkeys if k != xk]
        xvals = sorted({g.values.get(xk, "") for g in groups}, key=_value_order)
        axis = _axis(xvals)
        pos = dict(zip(xvals, axis[0] if axis else range(len(xvals))))
        lines: dict[tuple, list[Group]] = {}
        for g in groups:
            lines.setdefault(tuple(g.values.get(k, "") for k in rest), []).append(g)
        for combo, gs in sorted(lines.items(), key=lambda kv: [_value_order(v) for v in kv[0]]):
            pts = sorted(
                ((pos[g.values.get(xk, "")], g.stats(settings.metric)) for g in gs if g.stats(settings.metric)),
                key=lambda t: t[0],
            )
            if not pts:
                continue
            label = " ".join(f"{names[k]}={v}" for k, v in zip(rest, combo)) or settings.metric
            ax.errorbar(
                [x for x, _ in pts],
                [s[0] for _, s in pts],
                yerr=[s[1] for _, s in pts],
                marker="o",
                capsize=3,
                label=label,
            )
        if axis and axis[1]:
            ax.set_xscale("log")
        if not axis:
            ax.set_xticks(range(len(xvals)), xvals)
        ax.set_xlabel(names[xk])
        ax.set_ylabel(settings.metric)
        ax.legend(fontsize=7)
    if over:
        fig.suptitle(f"{settings.metric}: mean ± std over {', '.join(names[k] for k in over)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
