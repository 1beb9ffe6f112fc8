"""Command-line entry: Hydra composes ``conf/``, the typed config is validated, the run starts.

``python scripts/train.py [overrides]`` (or ``privy-train``) trains; ``-m`` sweeps. A bad config,
a missing model or an env failure ends with one line on stderr and a non-zero exit, not a stack of
Ray tracebacks (set PRIVY_DEBUG=1 for the full traceback). In a sweep that line goes into the
point's record instead and the sweep goes on; a point that finished in an earlier run of the same
sweep is skipped, one with a checkpoint resumed (pipeline/tools/sweep.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.core.config import CONF_DIR as _CONF
from pipeline.core.errors import first_line
from pipeline.tools.sweep import PointRecord  # and registers ${privy_point_dir:...} (hydra.sweep.subdir)

CONF_DIR = str(_CONF)


def compose(overrides: list[str] | None = None):
    """The typed, validated config for ``overrides`` (tests and tools; no Hydra run dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.core.config import register_schema, to_config

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        dcfg = hydra_compose(config_name="config", overrides=list(overrides or []))
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
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from pipeline.core.config import ConfigError, to_config
    from pipeline.orchestration.controller import Aborted
    from pipeline.orchestration.run import RunStopped, run_training

    hc = HydraConfig.get()
    point = PointRecord(hc.runtime.output_dir) if hc.mode == RunMode.MULTIRUN else None
    if point is not None:
        if point.finished():
            print(f"privy-rl: sweep point {point.dir.name} finished in an earlier run: skipped", file=sys.stderr)
            return
        point.start()
    try:
        cfg = to_config(dcfg)
        run_dir = cfg.trainer.run_dir or hc.runtime.output_dir
        if point is not None and cfg.trainer.resume is None and point.resumable():
            cfg.trainer.resume = str(point.dir)
            print(f"privy-rl: sweep point {point.dir.name}: resuming from its checkpoint", file=sys.stderr)
        history = run_training(cfg, run_dir)
    except ConfigError as e:
        _fail("config error", e, point)
    except FileNotFoundError as e:
        _fail("missing file", e, point)
    except RunStopped as e:
        print(f"privy-rl: {e}", file=sys.stderr)
        _stop(point, hc.sweep.dir, e.signum)
    except (Aborted, KeyboardInterrupt) as e:
        print(f"privy-rl: interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        _stop(point, hc.sweep.dir)
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


def main() -> None:
    import hydra

    from pipeline.core.config import register_schema
    from pipeline.core.runtime_env import set_process_env

    set_process_env()  # before anything imports Ray, DeepSpeed or wandb

    register_schema()
    hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(train_from_hydra)()


if __name__ == "__main__":
    main()
