"""Hydra multirun: short point directories, skip and resume on rerun, and the sweep's summary.

- ``SweepSummary`` (a Hydra callback, conf/config.yaml) writes ``sweep.json`` into the sweep dir when
  the sweep starts: the command's overrides and the keys it sweeps. Rerunning a sweep into a dir
  that holds another command's sweep fails there, before any point runs.
- ``${privy_point_dir:...}`` (the sweep's ``subdir``) names each point ``<job>_<key>=<value>_...``
  after the swept keys only (``3_beta=10_lam=0.01_seed=1``), sanitised, with a hash once too long.
- ``PointRecord`` (``sweep_point.json``, kept by ``pipeline/tools/cli.py``) says whether a point
  finished, failed (its one-line error) or stopped, and its seconds over all attempts: a rerun
  skips finished points and resumes those with a checkpoint.
- When the sweep ends the callback writes ``sweep_summary.md`` / ``.csv`` / ``.png``
  (``pipeline/tools/sweep_report.py``) and exits 1 if a point did not finish.

``python -m pipeline.tools.sweep DIR`` summarises run dirs that were not one multirun (one
``scripts/submit.sh`` job per point under DIR): the swept keys are then the config values that
differ between the runs.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import yaml
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from pipeline.tools.sweep_report import Point, Settings, column_names, read_rows, run_metrics, write_report

MANIFEST = "sweep.json"
RECORD = "sweep_point.json"
MAX_NAME = 80  # characters of a point's directory name (file systems allow 255 bytes)
UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


# ----- swept keys and point names ----------------------------------------------------------------


def _parse(overrides: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def _key(override: str) -> str:
    return _parse([override])[0].key_or_group


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """The keys a sweep command varies (``method.beta=1,10``, ``range(..)``, ``choice(..)``), in order."""
    return [o.key_or_group for o in _parse(overrides) if o.is_sweep_override()]


def point_values(overrides: Sequence[str], keys: Sequence[str]) -> dict[str, str]:
    """Each swept key's value among one point's overrides (``method.beta=10`` -> ``'10'``)."""
    found = {o.key_or_group: o.get_value_element_as_str() for o in _parse(overrides) if not o.is_delete()}
    return {k: found.get(k, "") for k in keys}


def sanitize(text: str) -> str:
    """Letters, digits and ``. _ + -`` only: every other run of characters becomes one ``-``."""
    return UNSAFE.sub("-", text)


def point_dirname(num: int, values: dict[str, str]) -> str:
    """``<num>_<column>=<value>_...``; past MAX_NAME characters cut and ended by a hash of the
    values, so that it stays unique and the same on every rerun."""
    names = column_names(list(values))
    name = "_".join([str(num), *(f"{sanitize(names[k])}={sanitize(v)}" for k, v in values.items())])
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - len(digest) - 1]}-{digest}"


def _point_subdir(sweep_dir: str, num: Any, overrides: Sequence[str]) -> str:
    manifest = Path(sweep_dir) / MANIFEST
    keys = json.loads(manifest.read_text())["swept"] if manifest.exists() else []
    return point_dirname(int(num), point_values(list(overrides), keys))


# Registered on import: the driver imports this module through the CLI, and each joblib worker
# when it unpickles this callback, before either resolves a point's ``hydra.sweep.subdir``.
OmegaConf.register_new_resolver("privy_point_dir", _point_subdir, replace=True)


# ----- the sweep's manifest ----------------------------------------------------------------------


def sweep_overrides(config) -> list[str]:
    """The task overrides of the sweep command, and the sweeper's ``params`` (sweeps declared in
    config) as overrides."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    return [*config.hydra.overrides.task, *(f"{k}={v}" for k, v in params.items())]


def _compared(overrides: Sequence[str]) -> list[str]:
    """The overrides a rerun must repeat: where the points run (``cluster``) does not change what
    they compute, so a rerun may move a sweep onto a cluster."""
    return [o for o in overrides if _key(o).split(".")[0] != "cluster" and _key(o) != "trainer.resume"]


def check_manifest(sweep_dir: Path, overrides: list[str]) -> list[str]:
    """Write ``sweep.json`` for a new sweep dir, or check a rerun's command against it. Returns the
    swept keys; raises ValueError naming the difference when the dir holds another sweep."""
    path = sweep_dir / MANIFEST
    if path.exists():
        old, now = _compared(json.loads(path.read_text())["overrides"]), _compared(overrides)
        if old != now:
            gone = " ".join(o for o in old if o not in now)
            new = " ".join(o for o in now if o not in old)
            diff = "; ".join(([f"its command had {gone}"] if gone else []) + ([f"this one has {new}"] if new else []))
            raise ValueError(
                f"hydra.sweep.dir={sweep_dir} holds another sweep "
                f"({diff or 'its command had the same overrides in another order'}): rerun its "
                f"command ({MANIFEST} there), or name a new sweep (sweep.name=...)"
            )
    keys = swept_keys(overrides)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"overrides": overrides, "swept": keys}, indent=1))
    return keys


# ----- one point's record ------------------------------------------------------------------------


class PointRecord:
    """``sweep_point.json`` of a point's directory: status (running | done | failed | stopped),
    its one-line error, attempts and seconds over all of them."""

    def __init__(self, point_dir: str | Path):
        self.dir = Path(point_dir)
        self.path = self.dir / RECORD
        self.state: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    @property
    def status(self) -> str:
        return self.state.get("status", "")

    def finished(self) -> bool:
        return self.status == "done"

    def resumable(self) -> bool:
        """A checkpoint of the point's run (or of its first phase, for RetireOPD) exists."""
        from pipeline.orchestration.checkpoint import resolve_checkpoint
        from pipeline.orchestration.phases import PHASE1_DIR

        try:
            resolve_checkpoint(self.dir)
            return True
        except FileNotFoundError:
            return (self.dir / PHASE1_DIR).is_dir()

    def start(self) -> None:
        self._t0 = time.time()
        self._write(status="running", error="", attempts=self.state.get("attempts", 0) + 1)

    def end(self, status: str, error: str = "") -> None:
        seconds = self.state.get("seconds", 0.0) + time.time() - self._t0
        self._write(status=status, error=error, seconds=seconds)

    def _write(self, **changes: Any) -> None:
        self.state.update(changes)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.state, indent=1))


# ----- collecting the points ---------------------------------------------------------------------


def _overrides_of(point_dir: Path) -> list[str]:
    path = point_dir / ".hydra" / "overrides.yaml"
    return list(yaml.safe_load(path.read_text()) or []) if path.exists() else []


def collect(sweep_dir: Path, keys: Sequence[str], metric: str) -> list[Point]:
    """The points of a multirun: the directories with a record."""
    points = []
    for record in sorted(sweep_dir.glob(f"*/{RECORD}")):
        d = record.parent
        state = json.loads(record.read_text())
        overrides = _overrides_of(d)
        metrics = run_metrics(read_rows(d), metric)
        if "seconds" in state:
            metrics["wall_s"] = state["seconds"]
        points.append(
            Point(
                d.name,
                point_values(overrides, keys),
                state.get("status", ""),
                overrides,
                state.get("error", ""),
                metrics,
            )
        )
    return points


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return out


IGNORED_DIFFS = {"trainer.run_dir", "trainer.resume", "sweep.name"}  # differ between any two runs


def collect_runs(root: Path, metric: str) -> tuple[list[str], list[Point]]:
    """Run dirs under ``root`` that are not one multirun: the swept keys are the config values
    that differ between their config.yaml files; a run without summary.json is unfinished."""
    runs = sorted(d for d in root.iterdir() if (d / "config.yaml").is_file())
    flat = {
        d: {
            k: v for k, v in _flatten(yaml.safe_load((d / "config.yaml").read_text())).items() if k not in IGNORED_DIFFS
        }
        for d in runs
    }
    all_keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    keys = [k for k in all_keys if len({f.get(k, "") for f in flat.values()}) > 1]
    points = []
    for d in runs:
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else None
        metrics = run_metrics(read_rows(d), metric)
        if summary is not None:
            metrics["wall_s"] = summary["seconds"]
        points.append(
            Point(
                d.name,
                {k: flat[d].get(k, "") for k in keys},
                "done" if summary is not None else "unfinished",
                metrics=metrics,
            )
        )
    return keys, points


# ----- the callback ------------------------------------------------------------------------------


def _settings(config) -> Settings:
    from pipeline.core.config import SweepConfig, validate_sweep

    s: SweepConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweepConfig), config.sweep))
    validate_sweep(s)
    return Settings(s.metric, s.goal, list(s.aggregate))


def _exit(message: str, code: int) -> None:
    print(f"privy-rl: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class SweepSummary(Callback):
    # Hydra turns an exception of a callback into a warning: what must stop the sweep exits.
    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            _settings(config)
            check_manifest(Path(config.hydra.sweep.dir), sweep_overrides(config))
        except ValueError as e:  # ConfigError of the sweep section, or another sweep's dir
            _exit(f"config error: {e}", 2)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        settings = _settings(config)
        manifest = json.loads((sweep_dir / MANIFEST).read_text())
        keys = manifest["swept"]
        parsed = _parse(manifest["overrides"])
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        common = [o.input_line for o in parsed if not o.is_sweep_override()]
        points = collect(sweep_dir, keys, settings.metric)
        report = write_report(sweep_dir, points, keys, settings, common, sweeps)
        print(f"privy-rl: sweep summary of {report.points} points: {report.markdown}", flush=True)
        if report.failed:
            _exit(
                f"sweep: {report.failed} of {report.points} points did not finish (their errors are in "
                f"{report.markdown})",
                1,
            )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pipeline.tools.sweep DIR [METRIC]``: the summary of the run dirs under DIR."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _exit("usage: python -m pipeline.tools.sweep DIR [METRIC]", 2)
    root = Path(args[0])
    settings = Settings(metric=args[1]) if len(args) > 1 else Settings()
    keys, points = collect_runs(root, settings.metric)
    report = write_report(root, points, keys, settings)
    print(f"privy-rl: sweep summary of {report.points} runs: {report.markdown}")


if __name__ == "__main__":
    main()
