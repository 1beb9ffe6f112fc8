"""Command-line entry: Hydra composes ``conf/``, the typed config is validated, the run starts.

``python scripts/train.py [overrides]`` (or ``privy-train``) trains; ``-m`` sweeps;
``--check [overrides]`` (``make doctor``) checks the config and this machine and trains nothing
(``pipeline/tools/preflight.py``).

Before Hydra makes a run dir and before Ray starts, the command line is composed as Hydra would
and checked (``preflight``): a Hydra error, an unknown key or method option, a bad value, an
engine missing from this venv, a model directory that will not load end in ONE line on stderr,
``privy-rl: <kind>: ...``, naming the key, file or address, and exit status 2. A failure once the
run has started ends in one line too (Ray's wrapped errors by their root cause) with status 1; a
run that fails before its first trained step leaves no run dir behind. PRIVY_DEBUG=1 shows the
full traceback instead.

In a sweep (``-m``) a misspelt key or option stops the sweep before its first point; any other
error goes into the point's record and the sweep goes on; a point that finished in an earlier run
of the same sweep is skipped, one with a checkpoint resumed (pipeline/tools/sweep.py).

A run's console lines (the ``privy-rl: ...`` messages, warnings, errors, the final ``done:``) are
kept in ``cli.log`` in its run dir (``Console``); a long phase announced by a line ending in
``...`` (a validation, the warm start, the final test) gets a line every
``$PRIVY_HEARTBEAT_S`` seconds (30) saying how long it has run.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

from pipeline.core.config import CONF_DIR as _CONF
from pipeline.core.errors import first_line
from pipeline.tools.sweep import PointRecord  # and registers ${privy_point_dir:...} (hydra.sweep.subdir)

CONF_DIR = str(_CONF)


def method_options(overrides: list[str]) -> list[str]:
    """``method.x=v`` as ``++method.x=v``: a preset lists only what differs from its parts'
    defaults (conf/method/), so an option left at its default is not in the composed config for
    Hydra to override; added instead, it is checked by the method itself, which refuses an option
    it does not have with the nearest name (pipeline/methods/options.py)."""
    return ["++" + o if re.match(r"method\.[\w.]+=", o) else o for o in overrides]


def compose(overrides: list[str] | None = None):
    """The typed, validated config for ``overrides`` (tests and tools; no Hydra run dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.core.config import register_schema, to_config

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        dcfg = hydra_compose(config_name="config", overrides=method_options(list(overrides or [])))
    return to_config(dcfg)


def _fail(kind: str, err: BaseException, point=None) -> None:
    if os.environ.get("PRIVY_DEBUG"):
        raise err
    first = first_line(err)
    print(f"privy-rl: {kind}: {first}", file=sys.stderr)
    if point is not None:  # the sweep goes on to its next point; its summary shows this error
        point.end("failed", f"{kind}: {first}")
        return
    sys.exit(2 if kind == "config error" else 1)


def _stop(point, sweep_dir: str, signum: int = 2) -> None:
    """Ctrl-C (or SIGTERM) ends a sweep too; rerunning it into the same dir resumes this point. The
    exit status is the shell's for the signal: 130 for SIGINT, 143 for SIGTERM."""
    if point is not None:
        point.end("stopped")
        print(f"privy-rl: to continue the sweep, rerun it with hydra.sweep.dir={sweep_dir}", file=sys.stderr)
    sys.exit(128 + signum)


def train_from_hydra(dcfg) -> None:
    """One run (or sweep point) in the dir Hydra made for it, its console kept in ``cli.log``;
    a single run that fails before its first step leaves no dir behind."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    point = PointRecord(hc.runtime.output_dir) if hc.mode == RunMode.MULTIRUN else None
    if point is not None:
        if point.finished():
            print(f"privy-rl: sweep point {point.dir.name} finished in an earlier run: skipped", file=sys.stderr)
            return
        point.start()
    output_dir = Path(hc.runtime.output_dir)
    run_dir = Path(dcfg.trainer.run_dir or output_dir)
    made = [output_dir] + ([run_dir] if not run_dir.exists() else [])  # this run's to remove if it never trained
    finished = False
    try:
        with Console(run_dir / "cli.log"):
            _train(dcfg, point, hc)
            finished = True
    finally:
        if point is None and not finished:  # a failed or stopped run: its dir goes if it holds no step
            discard_untrained(made)


def _train(dcfg, point, hc) -> None:
    from pipeline.core.config import ConfigError, to_config
    from pipeline.orchestration.controller import Aborted
    from pipeline.orchestration.run import RunStopped, run_training
    from pipeline.tools.doctor import check_run
    from pipeline.tools.preflight import Refused

    try:
        cfg = to_config(dcfg)
        run_dir = cfg.trainer.run_dir or hc.runtime.output_dir
        if point is not None:  # a single run was checked before Hydra made its dir (main)
            check_run(cfg)
        if point is not None and cfg.trainer.resume is None and point.resumable():
            cfg.trainer.resume = str(point.dir)
            print(f"privy-rl: sweep point {point.dir.name}: resuming from its checkpoint", file=sys.stderr)
        history = run_training(cfg, run_dir)
    except Refused as e:
        _fail(e.kind, e, point)
    except ConfigError as e:
        _fail("config error", e, point)
    except FileNotFoundError as e:
        _fail("missing file", e, point)
    except RunStopped as e:
        print(f"privy-rl: {e}", file=sys.stderr)
        _stop(point, hc.sweep.dir, e.signum)
    except (Aborted, KeyboardInterrupt) as e:
        print(f"privy-rl: interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        _stop(point, hc.sweep.dir, getattr(e, "signum", 2))
    except Exception as e:  # Ray wraps actor errors; show the root cause in one line
        cause = getattr(e, "cause", None) or e
        _fail(type(cause).__name__, cause, point)
    else:
        if point is not None:
            point.end("done")
        from pipeline.tools.plotting import try_plot

        try_plot(run_dir)
        print(summary_line(history, run_dir))


def summary_line(history: list[dict], run_dir) -> str:
    """The run's last line: its last train step, then held-out success at every validation (read
    from metrics.jsonl, which holds the step-0 validation too), the number that says it learned."""
    from pipeline.tools.sweep_report import final_split_success, read_rows  # one row per step, also after a resume

    last = history[-1] if history else {}
    line = f"privy-rl: done: {len(history)} steps in {run_dir}"
    if "rollout/success" in last:
        line += (
            f"; last train reward {last.get('rollout/reward', float('nan')):.3f}, success {last['rollout/success']:.3f}"
        )
    rows = read_rows(Path(run_dir))
    val = [(r["step"], r["val/success"]) for r in rows if r.get("val/success") is not None]
    if val:
        line += "; held-out success " + " -> ".join(f"{v:.3f} (step {s})" for s, v in val)
    final = {split: v for r in rows for split, v in final_split_success(r).items()}
    line += "".join(f"; {split} success {v:.3f}" for split, v in sorted(final.items()))
    return line


# What a run dir holds before its first trained step (run_training writes these first; a sweep
# point's record, metrics, checkpoints and events are not among them).
PRE_TRAINING = frozenset({".hydra", "cli.log", "config.yaml", "hardware.json", "warm_start.json"})


def discard_untrained(dirs: list[Path]) -> None:
    """Remove each dir that holds nothing but what a run writes before training, and the parents
    Hydra made for it (``runs/<date>/``) that are left empty, up to the working directory."""
    cwd = Path.cwd().resolve()
    for d in dict.fromkeys(p.resolve() for p in dirs):
        if not d.is_dir() or not {p.name for p in d.iterdir()} <= PRE_TRAINING:
            continue
        shutil.rmtree(d, ignore_errors=True)
        for parent in d.parents:
            if parent == cwd or cwd not in parent.parents:
                break
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (Ray's actor prefixes): not for a file


class Console:
    """Keeps a run's console in its ``cli.log``: every complete line written through this
    process's ``sys.stdout`` / ``sys.stderr`` while it is entered (the ``privy-rl:`` lines,
    warnings, errors, the actors' lines Ray forwards) goes to the terminal as before and is
    appended to the file. A progress bar's redraws (``\r``) are not lines: only the text after the
    last ``\r`` of a line is kept (a bar's final state, a line tqdm wrote above its bar).

    A line ``privy-rl: ...`` ending in ``...`` opens a phase (a validation, the warm start, the
    final test); until the next ``privy-rl:`` line, a line every ``every_s`` seconds says how long
    it has run, so that a terminal whose bar stands still for minutes shows the run is alive."""

    HEARTBEAT = "privy-rl: still "

    def __init__(self, path: str | Path, every_s: float | None = None):
        self.path = Path(path)
        self.every_s = float(os.environ.get("PRIVY_HEARTBEAT_S", 30)) if every_s is None else every_s
        self.lock = threading.RLock()
        self.pending: dict[int, str] = {}
        self.phase: tuple[str, float] | None = None  # (its line, when it began)
        self.stop = threading.Event()

    def __enter__(self) -> Console:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)
        self.beat = threading.Thread(target=self._heartbeat, name="privy-heartbeat", daemon=True)
        self.beat.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.beat.join(timeout=5)
        with self.lock:
            sys.stdout, sys.stderr = self.saved
            for text in self.pending.values():
                self._line(text)
            self.pending.clear()
            self.file.close()

    def feed(self, stream: _Tee, text: str) -> None:
        with self.lock:
            buf = self.pending.get(id(stream), "") + text
            *lines, rest = buf.split("\n")
            self.pending[id(stream)] = rest.rsplit("\r", 1)[-1]  # a bar's redraws: only the last stays
            for line in lines:
                self._line(line)

    def _line(self, line: str) -> None:
        line = ANSI.sub("", line.rsplit("\r", 1)[-1]).rstrip()
        if not line or self.file.closed:
            return
        self.file.write(line + "\n")
        self.file.flush()
        if line.startswith("privy-rl: ") and not line.startswith(self.HEARTBEAT):
            self.phase = (line, time.monotonic()) if line.endswith("...") else None

    def _heartbeat(self) -> None:
        current, beats = None, 0
        while not self.stop.wait(min(1.0, self.every_s)):
            with self.lock:
                phase = self.phase
            if phase is not current:
                current, beats = phase, 0
            if phase is None:
                continue
            line, since = phase
            elapsed = time.monotonic() - since
            if elapsed < (beats + 1) * self.every_s:
                continue
            beats = int(elapsed // self.every_s)
            minutes, seconds = divmod(int(elapsed), 60)
            # outside the lock: tqdm takes its own lock, and the main thread may hold it while it writes
            _write_above_bars(f"{self.HEARTBEAT}{line[len('privy-rl: ') :].rstrip('.')}: {minutes}m{seconds:02d}s")


def _write_above_bars(line: str) -> None:
    """A line on stderr above any live tqdm bar (which redraws below it)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


class _Tee:
    """A text stream that writes through to ``stream`` and hands the text to ``console``."""

    def __init__(self, stream, console: Console):
        self.stream, self.console = stream, console

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        self.console.feed(self, text)
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the terminal's
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> None:
    """``scripts/train.py`` / ``privy-train``: check what the command line asks for, then hand it
    to Hydra (``--check``: only check)."""
    import hydra
    from hydra._internal.utils import get_args_parser

    from pipeline.core.config import register_schema
    from pipeline.core.runtime_env import set_process_env

    set_process_env()  # before anything imports Ray, DeepSpeed or wandb
    register_schema()
    argv = list(sys.argv[1:] if argv is None else argv)
    check, describe = "--check" in argv, "--describe" in argv
    argv = method_options([a for a in argv if a not in ("--check", "--describe")])
    args = get_args_parser().parse_args(argv)
    shows = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    if describe:
        _describe(args)
    if check or not shows:  # Hydra's own --help, --cfg, --info: as Hydra shows them
        _preflight(args, check)
    sys.argv = [sys.argv[0], *argv]
    hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(train_from_hydra)()


def _describe(args) -> None:
    """``--describe``: the method the command line selects, in words (its parts, options,
    formulas), then exit; nothing is checked beyond the method, nothing runs."""
    from pipeline.methods import describe_method
    from pipeline.tools.preflight import Refused, compose_points, resolve

    try:
        cfg = resolve(compose_points(args, train_from_hydra).configs[0])
        print(describe_method(dict(cfg.method), env_name=cfg.env.name))
    except (Refused, ValueError) as e:
        print(getattr(e, "line", f"privy-rl: config error: {e}"), file=sys.stderr, flush=True)
        sys.exit(2)
    sys.exit(0)


def _preflight(args, check: bool) -> None:
    """Compose and check before Hydra makes a run dir and before Ray: one line and exit 2 on a
    problem; ``check``: the whole report, then exit."""
    from pipeline.tools.doctor import check_report, check_run
    from pipeline.tools.preflight import Refused, compose_points, resolve, sweep_names

    try:
        points = compose_points(args, train_from_hydra)
        if check:
            dirs = [Path(CONF_DIR), *([Path(args.config_dir)] if args.config_dir else [])]
            sys.exit(check_report(points, dirs))
        if points.multirun:
            sweep_names(points)
        else:
            check_run(resolve(points.configs[0]))
    except Refused as e:
        if os.environ.get("PRIVY_DEBUG"):
            raise
        print(e.line, file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
