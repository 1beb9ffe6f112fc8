"""Stored results: the folders behind every learning number in README.md and docs/.

A result folder ``docs/results/<name>/`` holds what a reader needs to recompute its tables:

- ``meta.json``: the command line, the commit (and whether the tree was dirty), the machine (CPU
  model, ``avx512_bf16`` or AVX2 only, cores), the date, the preset and its overrides;
- ``runs.tar.xz``: the runs, each as ``runs/<method>_s<seed>[_r<k>]/``: its ``metrics.jsonl``,
  ``summary.json``, ``config.yaml``, ``events.jsonl``, ``hardware.json`` (each actor's precision
  and threads), ``warm_start.json`` (the clone it started from: rows, NLL per epoch, seconds) and
  ``outcomes/`` (one line per validation task: ``pipeline.orchestration.logging.OutcomeLog``);
  checkpoints are never kept. A writer stores runs loose in ``runs/`` (``store_run``) and packs
  them (``pack_runs``, ``scripts/results.py pack``): one archive per folder, the same bytes
  whenever the same runs are packed; ``tar -xJf runs.tar.xz`` gives ``runs/`` back to read;
- ``table``, ``summary`` (its headline columns), ``pairs``, ``diagnostics`` (each method's own
  metrics: SDAR's gate, targeted guidance's distilled tokens, RetireOPD's retirement, ADRS's gate
  and shaping share, the privilege gap) and, when a seed was run twice, ``repeats``, each as
  ``.json`` and ``.md``: computed from the runs by ``learning_tables``, never edited by hand.
  ``table`` and ``summary`` end with the floors of the runs' env (``docs/results/floors``,
  ``scripts/bench/floors.py``) on the same test tasks, and their ``.md`` with a note (kept in
  ``notes.json``) naming any headline at or below a floor's interval;
- ``README.md`` (optional): what the files do not say; a line starting ``Commits:`` says why the
  runs come from different commits (each run's ``summary.json`` records its own commit and whether
  its tree was clean: ``pipeline/core/provenance.py``).

A doc quotes a table between ``<!-- results: <name>/<table> -->`` and ``<!-- /results -->``;
``scripts/results.py rebuild`` recomputes every folder's tables from its runs and rewrites those
blocks, ``scripts/results.py check`` (and ``tests/unit/test_results_tables.py``) fails when a
stored table does not follow from its runs, a doc's block differs from its folder's table, a
folder's runs are not packed, or they come from several commits with no ``Commits:`` line; runs
that record no commit (stored before runs did) are reported as unknown (``commit_notes``).

A point named ``start_s<seed>`` is the starting model evaluated without training
(``trainer.total_steps=0``: the warm start's clone): the "test - start" column is the gain over it.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import re
import shutil
import statistics
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lab.checkout import ROOT, git_commit
from lab.stats import Interval, mean_interval, paired_interval, task_bootstrap_interval

RUNS = "runs"  # a folder's runs, loose, before they are packed
RUNS_ARCHIVE = "runs.tar.xz"
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
    commit: str | None = None  # the commit the run ran (summary.json; None: not recorded, runs before it was)
    clean: bool | None = None  # whether that tree had no uncommitted change (every part's)
    parts: list[str | None] = field(default_factory=list)  # a resumed run's commits, part by part
    env: str | None = None  # the env it trained on (config.yaml's env.name; None: no config stored)

    @property
    def point(self) -> str:
        """The run's folder name: ``<method>_s<seed>[_r<k>]``."""
        return f"{self.method}_s{self.seed}" + (f"_r{self.repeat}" if self.repeat > 1 else "")

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


def _parse_run(name: str, files: Mapping[str, str]) -> Run:
    """A run from its files' texts, keyed by their path inside the run's folder."""
    m = POINT.match(name)
    if m is None:
        raise ValueError(f"{name}: a run folder is named <method>_s<seed>[_r<k>]")
    rows = [json.loads(x) for x in files["metrics.jsonl"].splitlines() if x.strip()]
    summary = json.loads(files["summary.json"]) if "summary.json" in files else {}
    outcomes = {}
    for f in sorted(f for f in files if f.startswith("outcomes/") and f.count("/") == 1 and f.endswith(".jsonl")):
        lines = [json.loads(x) for x in files[f].splitlines() if x.strip()]
        outcomes[Path(f).stem] = [float(x["won"]) for x in sorted(lines, key=lambda x: x["task"])]
    if "config.yaml" in files:  # PyYAML comes with omegaconf; imported here, as the GPU check loads runs early
        import yaml

        config = yaml.safe_load(files["config.yaml"])
    else:
        config = None
    return Run(
        m["method"],
        int(m["seed"]),
        int(m["repeat"] or 1),
        rows,
        summary.get("seconds"),
        summary.get("steps"),
        outcomes,
        commit=summary.get("commit"),
        clean=_clean([p.get("clean") for p in summary["parts"]]) if "parts" in summary else summary.get("clean"),
        parts=[p.get("commit") for p in summary.get("parts", [])],
        env=((config or {}).get("env") or {}).get("name"),
    )


def _clean(parts: list[bool | None]) -> bool | None:
    """A run's tree state over its parts: unclean if one was, unknown if one is, else clean."""
    return False if False in parts else None if None in parts else True


def load_run(path: Path) -> Run:
    """A run from its folder (a run directory, or a point of a result folder's loose ``runs/``)."""
    if POINT.match(path.name) is None:
        raise ValueError(f"{path}: a run folder is named <method>_s<seed>[_r<k>]")
    files = {"metrics.jsonl": (path / "metrics.jsonl").read_text()}
    for name in ("summary.json", "config.yaml"):
        if (path / name).exists():
            files[name] = (path / name).read_text()
    for f in (path / "outcomes").glob("*.jsonl"):
        files[f"outcomes/{f.name}"] = f.read_text()
    return _parse_run(path.name, files)


def _archived_files(folder: Path) -> dict[str, bytes]:
    """``runs/<point>/<file>`` -> its bytes, from the folder's archive (none: empty)."""
    archive = folder / RUNS_ARCHIVE
    if not archive.exists():
        return {}
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _loose_files(folder: Path) -> dict[str, bytes]:
    loose = folder / RUNS
    if not loose.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(loose.rglob("*")) if p.is_file()}


def _points(files: Mapping[str, bytes]) -> set[str]:
    return {name.split("/")[1] for name in files}


def _stored_files(folder: Path) -> dict[str, bytes]:
    """Every run file of a folder: the archive's, where a point stored loose since replaces its
    namesake whole (what packing will make of them)."""
    loose = _loose_files(folder)
    replaced = _points(loose)
    return {**{k: v for k, v in _archived_files(folder).items() if k.split("/")[1] not in replaced}, **loose}


def has_runs(folder: Path) -> bool:
    return (folder / RUNS_ARCHIVE).exists() or (folder / RUNS).is_dir()


def load_runs(folder: Path) -> list[Run]:
    """A result folder's runs, from its archive and any runs stored loose since, by point name."""
    by_point: dict[str, dict[str, str]] = {}
    for name, data in _stored_files(folder).items():
        _, point, rel = name.split("/", 2)
        by_point.setdefault(point, {})[rel] = data.decode()
    return [_parse_run(point, by_point[point]) for point in sorted(by_point)]


def pack_runs(folder: Path) -> int:
    """Fold the folder's loose ``runs/`` into its ``runs.tar.xz`` (a point stored again replaces its
    namesake) and remove them; the number of runs archived. Deterministic: members sorted by name,
    files only, no time, owner or mode of the machine, the same xz settings, so packing the same
    runs again gives the same bytes (and git sees no change)."""
    files = _stored_files(folder)
    if (folder / RUNS).is_dir():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(files):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
                tar.addfile(info, io.BytesIO(files[name]))
        tmp = folder / f".{RUNS_ARCHIVE}.tmp"
        tmp.write_bytes(lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6))
        os.replace(tmp, folder / RUNS_ARCHIVE)
        shutil.rmtree(folder / RUNS)
    return len(_points(files))


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


def learning_tables(
    runs: list[Run], baseline: str = "grpo", split: str = TEST_SPLIT, floors: list[dict] | None = None
) -> dict[str, list[dict]]:
    """``table``: one row per method (first runs of each seed only), ``summary`` its headline
    columns; ``pairs``: the seed-paired
    test difference of every two trained methods; ``repeats``: the seeds run twice, beside the
    spread over seeds. ``split``: the split evaluated once at the end
    (``trainer.final_val_splits``). Every cell is a string, formatted here once.

    ``table`` and ``summary`` end with the floor rows of the runs' env on ``split`` (``floors``:
    the entries of the floors folder's ``results.json``; None: those of this checkout's
    ``docs/results/floors``), and ``notes`` holds the note rendered under each of them, which says
    which headlines are at or below a floor's interval (``floor_note``)."""
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
    headlines: dict[str, Interval] = {}  # method -> its test success over seeds (the floor note reads them)
    for m in methods:
        rs = by_method[m]
        tests = [t for r in rs if (t := r.last(key)) is not None]
        if tests:
            headlines[m] = mean_interval(tests).clipped(0.0, 1.0)
        row = {"method": m, "runs": str(len(rs)), f"{split} success": headlines[m].text() if tests else ""}
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
    notes = []
    env_floors = run_floors(runs, split, load_floors(DEFAULT_FLOORS) if floors is None else floors)
    if table and env_floors:
        for policy, won in env_floors:
            table.append(
                {**dict.fromkeys(table[0], ""), "method": f"{FLOOR_ROW}{policy}", f"{split} success": floor_text(won)}
            )
        note = floor_note(split, env_floors, headlines)
        notes = [{"table": "table", "note": note}, {"table": "summary", "note": note}]
    keep = ("method", "runs", f"{split} success", f"test - {baseline}", f"seeds +/=/- {baseline}", f"test - {START}")
    summary = [{k: v for k, v in row.items() if k in keep} for row in table]
    diagnostics = diagnostics_table({m: by_method[m] for m in methods if m != START})
    return {
        "table": table,
        "summary": summary,
        "pairs": pairs,
        "repeats": repeats,
        "diagnostics": diagnostics,
        NOTES: notes,
    }


# Each method's own diagnostics (issue 42): (column, metric, how a run's values become one).
DIAGNOSTICS = (
    ("SDAR gate mean", "sdar/gate_mean", "mean"),
    ("SDAR gate open (g > 0.5)", "sdar/gate_active_ratio", "mean"),
    ("TG distilled-token fraction", "tg/failed_token_fraction", "mean"),
    ("OPD retire step", "opd/retire_step", "last"),
    ("OPD teacher success at retirement", "opd/retire_teacher_success", "last"),
    ("ADRS gate mean", "adrs/gate_mean", "mean"),
    ("ADRS gate open (m > 0.5)", "adrs/gate_active_ratio", "mean"),
    ("ADRS shaping share", "adrs/shaping_share", "mean"),  # mean |shaping| / mean |A_t|
    ("privilege gap (valid)", "val/privilege_gap", "mean"),
)


def diagnostics_table(by_method: dict[str, list[Run]]) -> list[dict]:
    """One row per method that logged any diagnostic, the columns some method logged: the mean over
    its runs of each run's mean over the steps that logged it; the retirement per seed (``never``:
    the teacher was never retired, -1 in the run)."""
    cols = [c for c in DIAGNOSTICS if any(r.last(c[1]) is not None for rs in by_method.values() for r in rs)]
    rows = []
    for m, rs in by_method.items():
        row = {"method": m}
        for name, key, how in cols:
            if how == "mean":
                row[name] = _fmt(_mean([r.run_mean(key) for r in rs]))
            else:  # per seed: which step, or what success, the one retirement had
                vals = [(r.seed, r.last(key)) for r in rs if r.last(key) is not None]
                row[name] = ", ".join(
                    f"s{s}: {'never' if v < 0 else _fmt(v, 0 if 'step' in key else 3)}" for s, v in vals
                )
        if any(row[name] for name, *_ in cols):
            rows.append(row)
    return rows


# ----- floors --------------------------------------------------------------------------------------
FLOORS = "floors"  # docs/results/floors: the held-out success of degenerate policies (scripts/bench/floors.py)
DEFAULT_FLOORS = ROOT / "docs" / "results" / FLOORS
FLOOR_ROW = "floor: "  # a floor row's method cell: "floor: <policy>"
NOTES = "notes"  # the notes of a learning folder's tables: [{"table": name, "note": text}]


def proportion_interval(won: list[float]) -> Interval:
    """Success over tasks (one outcome each) with its 95% Wilson score interval: a floor policy is
    one fixed policy, so the tasks are its only replicates (the interval says which tasks were
    drawn; it is defined at 0 and n wins, where a t interval collapses)."""
    from scipy import stats

    k, n = int(sum(won)), len(won)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return Interval(k / n, float(ci.low), float(ci.high), n)


def floor_text(won: list[float]) -> str:
    return f"{proportion_interval(won).text()} ({int(sum(won))}/{len(won)} tasks)"


def load_floors(folder: Path) -> list[dict]:
    """The floors of a floors folder: ``results.json``'s ``floors`` entries (``env``, ``split``,
    ``policy``, ``won`` per task 0..n-1 of the split), [] when there is none."""
    path = Path(folder) / "results.json"
    return json.loads(path.read_text()).get("floors", []) if path.exists() else []


def run_floors(runs: list[Run], split: str, floors: list[dict]) -> list[tuple[str, list[float]]]:
    """(policy, won per task) of the floors of the runs' env on ``split``, cut to the first n tasks,
    n = the runs' test task count (validation task i is task seed i, so the floors' first n tasks
    are the runs' n tasks); [] when the runs name no env (no config stored) or it has no floor."""
    envs = {r.env for r in runs if r.env}
    if len(envs) != 1:
        return []
    [env] = envs
    counts = [len(o) for r in runs if (o := r.test_outcomes(split))]
    n = max(counts) if counts else None
    return [(f["policy"], f["won"][:n]) for f in floors if f["env"] == env and f["split"] == split]


def floor_note(split: str, floors: list[tuple[str, list[float]]], headlines: dict[str, Interval]) -> str:
    """The floors in words and the headlines at (or whose interval reaches) the highest floor's interval."""
    bounds = [(proportion_interval(won), policy) for policy, won in floors]
    top, top_policy = max(bounds, key=lambda b: (b[0].high, b[0].mean))
    n = top.n
    text = f"Floors on the same {n} {split} tasks (docs/results/floors): " + "; ".join(
        f"{policy} {iv.text()}" for iv, policy in bounds
    )
    below = [m for m, iv in headlines.items() if iv.mean <= top.high]
    near = [m for m, iv in headlines.items() if iv.mean > top.high and iv.low is not None and iv.low <= top.high]
    if below:
        text += f". **At or below the floor** ({top_policy}, up to {top.high:.3f}): " + ", ".join(
            f"{m} {headlines[m].mean:.3f}" for m in below
        )
    if near:
        text += ". Interval reaching the floor's: " + ", ".join(f"{m} (from {headlines[m].low:.3f})" for m in near)
    if not below and not near:
        text += ". Every headline is above the floors' intervals"
    return text + "."


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


def render_table(name: str, tables: dict[str, list[dict]]) -> str:
    """A table's markdown, followed by its notes (``tables[NOTES]``: the floors under a learning table)."""
    notes = [n["note"] for n in tables.get(NOTES, []) if n["table"] == name]
    return render_md(tables[name]) + "".join(f"\n{note}\n" for note in notes)


def write_tables(folder: Path, tables: dict[str, list[dict]]) -> None:
    for name, rows in tables.items():
        if not rows:
            for ext in ("json", "md"):
                (folder / f"{name}.{ext}").unlink(missing_ok=True)
            continue
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
        if name != NOTES:  # the notes are rendered under their tables
            (folder / f"{name}.md").write_text(render_table(name, tables))


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


def store_run(run_dir: Path, folder: Path) -> Path:
    """Copy a finished run's small files (never its checkpoints) into ``folder/runs/<name>``, loose
    until ``pack_runs``."""
    dest = folder / RUNS / run_dir.name
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


def folder_tables(folder: Path, runs: list[Run] | None = None) -> dict[str, list[dict]]:
    """The tables a learning folder's runs give (its baseline and split from ``meta.json``, the
    floors from its sibling ``floors`` folder)."""
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    runs = load_runs(folder) if runs is None else runs
    floors = load_floors(folder.parent / FLOORS)
    return learning_tables(runs, meta.get("baseline", "grpo"), meta.get("split", TEST_SPLIT), floors)


# ----- the commits a folder's runs ran ---------------------------------------------------------------
COMMITS_LINE = "Commits:"  # a folder README's line that says why its runs come from several commits


def run_commits(runs: list[Run]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(commit -> the points that ran it, points that record no commit, points from an unclean tree)."""
    commits: dict[str, list[str]] = {}
    for r in runs:
        for c in dict.fromkeys(r.parts or [r.commit]):
            if c:
                commits.setdefault(c, []).append(r.point)
    return commits, [r.point for r in runs if not r.commit], [r.point for r in runs if r.clean is False]


def explains_commits(folder: Path) -> bool:
    """Whether the folder's README.md has a line starting with ``Commits:``."""
    readme = folder / "README.md"
    lines = readme.read_text().splitlines() if readme.exists() else []
    return any(line.lstrip().startswith(COMMITS_LINE) for line in lines)


def commit_problems(folder: Path, runs: list[Run]) -> list[str]:
    """A folder whose runs come from different commits, unless its README says why."""
    commits, _, _ = run_commits(runs)
    if len(commits) < 2 or explains_commits(folder):
        return []
    listed = ", ".join(f"{c[:8]} ({len(p)} runs)" for c, p in sorted(commits.items()))
    return [
        f"{folder}: its runs come from {len(commits)} commits ({listed}): run them again on one commit, or say why "
        f"in a line of {folder / 'README.md'} starting {COMMITS_LINE!r}"
    ]


def commit_notes(root: Path) -> list[str]:
    """What ``check`` reports without refusing: runs that record no commit (stored before runs
    recorded it: unknown), runs from an unclean tree, and folders whose README explains several commits."""
    results = root / "docs" / "results"
    notes = []
    for folder in sorted(p for p in results.iterdir() if has_runs(p)) if results.is_dir() else []:
        runs = load_runs(folder)
        commits, unknown, unclean = run_commits(runs)
        name, told = folder.relative_to(root), f"; its README.md says what is known ({COMMITS_LINE})"
        if unknown:
            notes.append(
                f"{name}: commit unknown for {len(unknown)} of {len(runs)} runs (stored before runs recorded it)"
                + (told if explains_commits(folder) else "")
            )
        if unclean:
            notes.append(f"{name}: {len(unclean)} runs from a tree with uncommitted changes: {', '.join(unclean)}")
        if len(commits) > 1 and explains_commits(folder):
            notes.append(f"{name}: runs from {len(commits)} commits" + told)
    return notes


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
        if (folder / RUNS).is_dir():
            problems.append(f"{folder / RUNS}: loose runs (scripts/results.py pack {folder})")
        if has_runs(folder):
            runs = load_runs(folder)
            problems += commit_problems(folder, runs)
            tables = folder_tables(folder, runs)
            for name, rows in tables.items():
                stored = folder / f"{name}.json"
                if rows and (not stored.exists() or json.loads(stored.read_text()) != rows):
                    problems.append(
                        f"{stored}: does not follow from {folder / RUNS_ARCHIVE} (scripts/results.py rebuild)"
                    )
                if rows and name != NOTES and (folder / f"{name}.md").read_text() != render_table(name, tables):
                    problems.append(f"{folder / name}.md: not the rendering of {name}.json and its notes")
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
