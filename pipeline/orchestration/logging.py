"""Metric sinks: JSONL in the run directory, wandb (offline unless told otherwise), or nothing.

Code never branches on whether wandb is on: it calls ``MetricsLogger.log`` and the configured
sinks do their part (a disabled sink is a null object).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any


class NullSink:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink(NullSink):
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", buffering=1)

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._f.close()


class WandbSink(NullSink):
    def __init__(self, run_dir: Path, project: str, mode: str, config: dict[str, Any], resume_id: str | None):
        for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            os.environ.setdefault(var, str(run_dir / ".wandb"))
        import wandb

        self._run = wandb.init(
            project=project,
            mode=mode,
            dir=str(run_dir),
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        self.run_id = self._run.id

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log({k: _clean(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()


def _clean(v: Any) -> Any:
    v = float(v) if not isinstance(v, (str, bool)) else v
    return None if isinstance(v, float) and not math.isfinite(v) else v


class MetricsLogger:
    def __init__(self, sinks: list[NullSink]):
        self.sinks = sinks

    def log(self, metrics: dict[str, float], step: int) -> None:
        for s in self.sinks:
            s.log(metrics, step)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


class EventLog:
    """``events.jsonl`` in the run directory: one line per fault the run survived (a restart, a
    replayed group, a skipped step), each also printed as one line on stderr. ``path=None``: print
    only."""

    def __init__(self, path: Path | None):
        self._f = open(path, "a", buffering=1) if path is not None else None

    def record(self, event: str, **fields: Any) -> None:
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields}
        if self._f is not None:
            self._f.write(json.dumps(row, default=str) + "\n")
        detail = ", ".join(f"{k}={v}" for k, v in fields.items())
        print(f"privy-rl: {event}: {detail}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


class OutcomeLog:
    """``outcomes/<prefix>_step<N>_<tag>.jsonl`` in the run directory: one line per validation
    task (task id, seed, won, reward, turns, error), so that a reader can recompute a success rate,
    pair two methods task by task, or bootstrap over tasks. ``root=None``: keep nothing."""

    def __init__(self, root: Path | None):
        self.root = root

    def write(self, prefix: str, step: int, tag: str, episodes: list) -> Path | None:
        if self.root is None:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{prefix.replace('/', '_')}_step{step:04d}_{tag}.jsonl"
        with open(path, "w") as f:
            for i, e in enumerate(episodes):
                f.write(
                    json.dumps(
                        {
                            "task": i,
                            "task_id": e.task_id,
                            "seed": e.seed,
                            "won": bool(e.won),
                            "reward": float(e.reward),
                            "turns": len(e.turns),
                            "error": e.error,
                        }
                    )
                    + "\n"
                )
        return path


def make_logger(cfg, run_dir: Path, config_dict: dict, resume_id: str | None = None) -> MetricsLogger:
    """``cfg`` is a LoggerConfig."""
    sinks: list[NullSink] = []
    if cfg.jsonl:
        sinks.append(JsonlSink(run_dir / "metrics.jsonl"))
    if cfg.wandb and cfg.wandb_mode != "disabled":
        sinks.append(WandbSink(run_dir, cfg.project, cfg.wandb_mode, config_dict, resume_id))
    return MetricsLogger(sinks)
