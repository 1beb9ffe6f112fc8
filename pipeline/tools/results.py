"""Stored results: the folders behind every learning number in README.md and docs/.

A result folder ``docs/results/<name>/`` holds what a reader needs to recompute its tables:

- ``meta.json``: the command line, the commit (and whether the tree was dirty), the machine (CPU
  model, ``avx512_bf16`` or AVX2 only, cores), the date, the preset and its overrides;
- ``runs/<method>_s<seed>[_r<k>]/``: each training run's ``metrics.jsonl``, ``summary.json``,
  ``config.yaml``, ``events.jsonl``, ``hardware.json`` (each actor's precision and threads),
  ``warm_start.json`` (the clone it started from: rows, NLL per epoch, seconds) and ``outcomes/``
  (one line per validation task: ``pipeline.orchestration.logging.OutcomeLog``); checkpoints are
  never kept;
- ``table``, ``summary`` (its headline columns), ``pairs`` and, when a seed was run twice,
  ``repeats``, each as ``.json`` and ``.md``:
  computed from ``runs/`` by ``learning_tables``, never edited by hand.

A doc quotes a table between ``<!-- results: <name>/<table> -->`` and ``<!-- /results -->``;
``scripts/results.py rebuild`` recomputes every folder's tables from its runs and rewrites those
blocks, ``scripts/results.py check`` (and ``tests/unit/test_results_tables.py``) fails when a
stored table does not follow from its runs or a doc's block differs from its folder's table.

A point named ``start_s<seed>`` is the starting model evaluated without training
(``trainer.total_steps=0``: the warm start's clone): the "test - start" column is the gain over it.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.tools.stats import mean_interval, paired_interval, task_bootstrap_interval

RUN_FILES = ("metrics.jsonl", "summary.json", "config.yaml", "events.jsonl", "hardware.json", "warm_start.json")
POINT = re.compile(r"^(?P<method>.+)_s(?P<seed>\d+)(?:_r(?P<repeat>\d+))?$")
BLOCK = re.compile(r"(<!-- results: (?P<ref>[\w.-]+/[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.DOTALL)
START = "start"  # the point name of the starting model evaluated without training
TEST_SPLIT = "test"


# ----- a stored run --------------------------------------------------------------------------------
@dataclass
class Run:
    method: str
    seed: int
    repeat: int  # 1 = the first run of (method, seed); 2, 3... = the same seed run again
    rows: list[dict]
    seconds: float | None
    steps: int | None = None  # training steps done (summary.json): fewer than asked when time-limited
    outcomes: dict[str, list[float]] = field(default_factory=dict)  # outcome file stem -> won per task

    def last(self, key: str) -> float | None:
        vals = [r[key] for r in self.rows if r.get(key) is not None]
        return vals[-1] if vals else None

    def run_mean(self, key: str) -> float | None:
        vals = [r[key] for r in self.rows if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    def val_curve(self) -> dict[int, float]:
        return {r["step"]: r["val/success"] for r in self.rows if r.get("val/success") is not None}

    def test_outcomes(self, split: str = TEST_SPLIT) -> list[float] | None:
        """Won (1/0) per task of the last evaluation of ``split`` at the first validation temperature."""
        stems = sorted(s for s in self.outcomes if s.startswith(f"final_{split}_step"))
        if not stems:
            return None
        last_step = stems[-1].split("_step")[1][:4]
        stems = [s for s in stems if s.split("_step")[1][:4] == last_step]
        success = self.last(f"final/{split}/success")
        for s in stems:  # the first temperature's file is the one final/<split>/success was read from
            won = self.outcomes[s]
            if success is not None and abs(sum(won) / len(won) - success) < 1e-9:
                return won
        return None


def load_run(path: Path) -> Run:
    m = POINT.match(path.name)
    if m is None:
        raise ValueError(f"{path}: a run folder is named <method>_s<seed>[_r<k>]")
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else {}
    outcomes = {}
    for f in sorted((path / "outcomes").glob("*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        outcomes[f.stem] = [float(x["won"]) for x in sorted(lines, key=lambda x: x["task"])]
    return Run(
        m["method"], int(m["seed"]), int(m["repeat"] or 1), rows, summary.get("seconds"), summary.get("steps"), outcomes
    )


def load_runs(folder: Path) -> list[Run]:
    return [load_run(p) for p in sorted((folder / "runs").iterdir()) if p.is_dir()]


# ----- the tables ------------------------------------------------------------------------------------
def _fmt(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _mean(vals: list[float | None]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def _paired_columns(name: str, runs: list[Run], base: dict[int, Run], split: str) -> dict[str, str]:
    """Seed-paired test difference to a baseline's runs: t interval over seeds, bootstrap over tasks."""
    pairs = [(r, base[r.seed]) for r in runs if r.seed in base]
    a = [r.last(f"final/{split}/success") for r, _ in pairs]
    b = [s.last(f"final/{split}/success") for _, s in pairs]
    ok = [(x, y, r, s) for x, y, (r, s) in zip(a, b, pairs) if x is not None and y is not None]
    if not ok:
        return {f"test - {name}": "", f"test - {name}, by task": "", f"seeds +/=/- {name}": ""}
    d = paired_interval([x for x, *_ in ok], [y for _, y, *_ in ok])
    p = (
        ""
        if d.p_value is None
        else (" p<0.001" if d.p_value < 0.001 else f" p={d.p_value:.3f}" if d.p_value < 0.01 else f" p={d.p_value:.2f}")
    )
    oa = [r.test_outcomes(split) for *_, r, _ in ok]
    ob = [s.test_outcomes(split) for *_, s in ok]
    by_task = ""
    if all(o is not None for o in oa + ob) and len({len(o) for o in oa + ob}) == 1:
        by_task = task_bootstrap_interval(oa, ob).text()
    signs = [x - y for x, y, *_ in ok]
    wins = f"{sum(s > 0 for s in signs)}/{sum(s == 0 for s in signs)}/{sum(s < 0 for s in signs)}"
    return {f"test - {name}": d.text() + p, f"test - {name}, by task": by_task, f"seeds +/=/- {name}": wins}


def learning_tables(runs: list[Run], baseline: str = "grpo", split: str = TEST_SPLIT) -> dict[str, list[dict]]:
    """``table``: one row per method (first runs of each seed only), ``summary`` its headline
    columns; ``pairs``: the seed-paired
    test difference of every two trained methods; ``repeats``: the seeds run twice, beside the
    spread over seeds. ``split``: the split evaluated once at the end
    (``trainer.final_val_splits``). Every cell is a string, formatted here once."""
    key = f"final/{split}/success"
    first = [r for r in runs if r.repeat == 1]
    methods = list(
        dict.fromkeys(
            [START] * any(r.method == START for r in first)
            + [baseline] * any(r.method == baseline for r in first)
            + [r.method for r in first]
        )
    )
    by_method = {m: sorted((r for r in first if r.method == m), key=lambda r: r.seed) for m in methods}
    base = {r.seed: r for r in by_method.get(baseline, [])}
    start = by_method.get(START, [])
    table = []
    for m in methods:
        rs = by_method[m]
        tests = [r.last(key) for r in rs]
        row = {
            "method": m,
            "runs": str(len(rs)),
            f"{split} success": mean_interval([t for t in tests if t is not None]).clipped(0.0, 1.0).text()
            if any(t is not None for t in tests)
            else "",
        }
        if m not in (baseline, START) and base:
            row.update(_paired_columns(baseline, rs, base, split))
        elif base:
            row.update({f"test - {baseline}": "", f"test - {baseline}, by task": "", f"seeds +/=/- {baseline}": ""})
        if start and m != START:
            s = start[0]  # the start is one model: its evaluation is the same for every seed
            row.update(_paired_columns(START, rs, {r.seed: s for r in rs}, split))
        elif start:
            row.update({f"test - {START}": "", f"test - {START}, by task": "", f"seeds +/=/- {START}": ""})
        curves = [r.val_curve() for r in rs]
        row["valid: start -> end"] = (
            (f"{_fmt(_mean([c[min(c)] for c in curves if c]))} -> {_fmt(_mean([c[max(c)] for c in curves if c]))}")
            if any(curves)
            else ""
        )
        row["teacher |gap|"] = _fmt(_mean([r.run_mean("teacher/gap_abs_mean") for r in rs]))
        row["noise |gap|"] = _fmt(_mean([r.run_mean("noise/gap_abs_mean") for r in rs]))
        row["teacher / noise negative-gap fraction"] = (
            " / ".join(
                _fmt(_mean([r.run_mean(f"{p}/negative_gap_fraction") for r in rs]), 2) for p in ("teacher", "noise")
            )
            if any(r.run_mean("teacher/negative_gap_fraction") is not None for r in rs)
            else ""
        )
        row["privilege gap (valid)"] = _fmt(_mean([r.run_mean("val/privilege_gap") for r in rs]))
        row["distill KL"] = _fmt(_mean([_suffix_mean(r, "/kl") for r in rs]), 4)
        steps = sorted(r.steps for r in rs if r.steps is not None)
        # runs under a time limit (learning.py --time-budget-s) may stop at different steps
        row["steps"] = "" if not steps else str(steps[0]) if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"
        row["minutes per run"] = _fmt(_mean([r.seconds / 60 if r.seconds else None for r in rs]), 1)
        table.append(row)
    pairs = []  # every two methods trained at the same seeds, the later in the table minus the earlier
    trained = [m for m in methods if m != START]
    for i, b in enumerate(trained):
        for a in trained[i + 1 :]:
            cols = _paired_columns("b", by_method[a], {r.seed: r for r in by_method[b]}, split)
            if cols["test - b"]:
                pairs.append(
                    {
                        "a": a,
                        "b": b,
                        f"{split}: a - b": cols["test - b"],
                        "by task": cols["test - b, by task"],
                        "seeds +/=/-": cols["seeds +/=/- b"],
                    }
                )
    repeats = []
    for r2 in (r for r in runs if r.repeat > 1):
        r1 = next((r for r in first if r.method == r2.method and r.seed == r2.seed), None)
        t1, t2 = (r1.last(key) if r1 else None), r2.last(key)
        if t1 is None or t2 is None:
            continue
        seeds = [t for r in by_method.get(r2.method, []) if (t := r.last(key)) is not None]
        repeats.append(
            {
                "method": r2.method,
                "seed": str(r2.seed),
                "test, run 1": _fmt(t1),
                f"test, run {r2.repeat}": _fmt(t2),
                "same-seed difference": _fmt(abs(t1 - t2)),
                "std over seeds": _fmt(statistics.stdev(seeds)) if len(seeds) > 1 else "",
            }
        )
    keep = ("method", "runs", f"{split} success", f"test - {baseline}", f"seeds +/=/- {baseline}", f"test - {START}")
    summary = [{k: v for k, v in row.items() if k in keep} for row in table]
    return {"table": table, "summary": summary, "pairs": pairs, "repeats": repeats}


def _suffix_mean(run: Run, suffix: str) -> float | None:
    keys = sorted({k for r in run.rows for k in r if k.endswith(suffix) and not k.startswith(("val", "final"))})
    return run.run_mean(keys[0]) if keys else None


def render_md(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def write_tables(folder: Path, tables: dict[str, list[dict]]) -> None:
    for name, rows in tables.items():
        if not rows:
            for ext in ("json", "md"):
                (folder / f"{name}.{ext}").unlink(missing_ok=True)
            continue
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
        (folder / f"{name}.md").write_text(render_md(rows))


# ----- a folder ----------------------------------------------------------------------------------------
def machine() -> dict:
    """What the numbers were measured on (a learning or speed number means little without it)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set(re.search(r"^flags\s*:\s*(.*)$", info, re.M).group(1).split()) if "flags" in info else set()
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    kind = (
        "avx512_bf16"
        if "avx512_bf16" in flags
        else "AVX-512 without bf16"
        if "avx512f" in flags
        else "AVX2 only"
        if "avx2" in flags
        else "unknown"
    )
    return {
        "cpu_model": model.group(1).strip() if model else "unknown",
        "cpu_kind": kind,
        "amx_bf16": "amx_bf16" in flags,
        "cores": info.count("processor\t:") or None,
    }


def git_commit(root: Path) -> dict:
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


def store_run(run_dir: Path, folder: Path) -> Path:
    """Copy a finished run's small files (never its checkpoints) into ``folder/runs/<name>``."""
    dest = folder / "runs" / run_dir.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in RUN_FILES:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    if (run_dir / "outcomes").is_dir():
        shutil.copytree(run_dir / "outcomes", dest / "outcomes")
    return dest


def write_meta(folder: Path, root: Path, git: dict | None = None, **fields) -> None:
    """``git``: the commit the runs used, read when they started (default: read now)."""
    meta = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), **(git or git_commit(root)), "machine": machine(), **fields}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def write_benchmark(
    out: Path, root: Path, report: dict, table: list[dict], git: dict, workload: list[str] | None = None
) -> None:
    """A benchmark's result folder: its whole report, the command that made it, where it ran (the
    commit read before the runs started) and its table, so docs can quote the table and
    ``check`` can tell a hand-edited one."""
    out.mkdir(parents=True, exist_ok=True)
    command = report["command"]
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "command.txt").write_text(f"cd {root} && {command}\n")
    extra = {"workload": workload} if workload is not None else {}
    write_meta(out, root, git=git, kind="benchmark", command=command, **extra)
    write_tables(out, {"table": table})


def folder_tables(folder: Path) -> dict[str, list[dict]]:
    """The tables a learning folder's runs give (its baseline and split from ``meta.json``)."""
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    return learning_tables(load_runs(folder), meta.get("baseline", "grpo"), meta.get("split", TEST_SPLIT))


def rebuild_folder(folder: Path) -> dict[str, list[dict]]:
    tables = folder_tables(folder)
    write_tables(folder, tables)
    return tables


# ----- docs ------------------------------------------------------------------------------------------
def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _table_text(results: Path, ref: str) -> str | None:
    path = results / f"{ref}.md"
    return path.read_text() if path.exists() else None


def rewrite_blocks(text: str, results: Path) -> str:
    def sub(m: re.Match) -> str:
        body = _table_text(results, m["ref"])
        if body is None:
            raise FileNotFoundError(f"results block {m['ref']}: no {results / (m['ref'] + '.md')}")
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(sub, text)


def check(root: Path) -> list[str]:
    """Every problem found: a stored table that its runs do not give, a doc block that differs from
    its folder's table, a block naming no folder."""
    results = root / "docs" / "results"
    problems = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        if not (folder / "meta.json").exists():
            problems.append(f"{folder}: no meta.json (command, commit, machine)")
        if (folder / "runs").is_dir():
            for name, rows in folder_tables(folder).items():
                stored = folder / f"{name}.json"
                if rows and (not stored.exists() or json.loads(stored.read_text()) != rows):
                    problems.append(f"{stored}: does not follow from {folder / 'runs'} (scripts/results.py rebuild)")
                if rows and (folder / f"{name}.md").read_text() != render_md(rows):
                    problems.append(f"{folder / name}.md: not the rendering of {name}.json")
        elif (folder / "table.json").exists():  # a benchmark's table: its markdown follows from its json
            if (folder / "table.md").read_text() != render_md(json.loads((folder / "table.json").read_text())):
                problems.append(f"{folder / 'table.md'}: not the rendering of table.json")
    for doc in doc_files(root):
        for m in BLOCK.finditer(doc.read_text()):
            body = _table_text(results, m["ref"])
            if body is None:
                problems.append(f"{doc}: block {m['ref']} names no table in docs/results")
            elif m["body"] != body:
                problems.append(f"{doc}: block {m['ref']} differs from docs/results/{m['ref']}.md")
    return problems
