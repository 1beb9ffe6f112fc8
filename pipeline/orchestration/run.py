"""Run training: launch (``pipeline/orchestration/launch.py``), the phases before it
(``phases.py``), then drive the controller, stop on a signal, write the results.

``run_training(cfg, run_dir)`` is what ``scripts/train.py`` (Hydra) calls; tests call it directly
with a composed config.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.core.provenance import source
from pipeline.core.runtime_env import set_process_env
from pipeline.orchestration.launch import (
    build_actors,
    check_launch,
    check_model,
    free_actors,
    init_weight_sync,
    start_ray,
)
from pipeline.orchestration.phases import auto_resume, resume_phases, run_prerequisite, supersede_metrics
from pipeline.orchestration.signals import RunStopped, StopSignals, abort_line, ask_to_stop

__all__ = ["Progress", "RunStopped", "run_training"]


class Progress:
    """A tqdm bar over training steps with live reward / success / valid-action rate."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True, file=sys.stderr)

    def __call__(self, step: int, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        self.bar.update(step - self.bar.n)
        post = {
            "reward": m.get("rollout/reward"),
            "success": m.get("rollout/success"),
            "valid": m.get("rollout/valid_action_rate"),
            "val": m.get("val/success"),
        }
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in post.items() if v is not None})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_training(cfg: PrivyConfig, run_dir: str | Path) -> list[dict[str, float]]:
    """Train; returns the per-step metrics. Raises ConfigError for a bad config, RunStopped when
    a signal stopped the run (``signals.py``: at any moment, the start-up included)."""
    started_at = time.monotonic()  # trainer.time_limit_s counts from here: a run's wall time, startup included
    with StopSignals() as signals:
        return _run(cfg, Path(run_dir), signals, started_at)


def _run(cfg: PrivyConfig, run_dir: Path, signals: StopSignals, started_at: float) -> list[dict[str, float]]:
    code = source()  # the commit and tree this run imports, read before it trains (the tree may move)
    set_process_env()
    run_dir.mkdir(parents=True, exist_ok=True)
    method, resume_state, ckpt = _prepare(cfg, run_dir, signals)
    model_path = _model(cfg, run_dir, signals)
    signals.during("Ray and the actors' start-up")
    print("privy-rl: starting Ray and the actors...", file=sys.stderr, flush=True)  # closed by the precision line
    with signals.ray_starting():
        start_ray(cfg)
    learner, workers, scorer, actors = build_actors(cfg, model_path, method, run_dir)
    controller = None
    try:
        init_weight_sync(cfg, learner, workers, scorer, actors)
        controller = _controller(cfg, run_dir, method, resume_state, ckpt, (learner, workers, scorer), started_at)
        t0 = time.time()
        history = _drive(controller, signals, cfg, run_dir)
    finally:
        if controller is not None:
            controller.progress.close()
            controller.logger.close()
            controller.events.close()
        free_actors(actors)
    part = {**code, "steps": controller.state.step, "seconds": time.time() - t0}
    _write_summary(
        run_dir, controller, history, _parts(run_dir, resume_state is not None, part), cfg.trainer.total_steps
    )
    _say_if_stopped(cfg, run_dir, controller, signals)
    return history


def _prepare(cfg: PrivyConfig, run_dir: Path, signals: StopSignals):
    """The checks, a first phase, and the state a resume starts from: (method, state, ckpt)."""
    from pipeline.orchestration.checkpoint import load_state, resolve_checkpoint

    method, _ = check_launch(cfg)
    with signals.deferred():  # may set metrics lines aside: written whole or not at all
        if cfg.trainer.resume == "auto":
            cfg.trainer.resume = auto_resume(method, run_dir)
    signals.during("the resume's checks")
    if cfg.trainer.resume:  # may first finish a first phase that died, then start this one fresh
        resume = resume_phases(cfg, method, run_dir, run_training)
    else:
        resume = None
        run_prerequisite(cfg, method, run_dir, run_training)
    if not resume:
        return method, None, None
    try:
        ckpt = resolve_checkpoint(resume, set_aside=True)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    state = load_state(ckpt)
    method.load_state_dict(state["method"])  # before the actors: it may name a teacher
    with signals.deferred():
        supersede_metrics(run_dir, state["controller"]["step"])
    return method, state, ckpt


def _model(cfg: PrivyConfig, run_dir: Path, signals: StopSignals) -> str:
    """The model the actors load (built or read from the cache; the warm start's clone), and the
    run's config written beside it."""
    from omegaconf import OmegaConf

    from pipeline.models import resolve_model

    signals.during("the model's preparation")
    model_path = str(resolve_model(cfg.model.path or cfg.model.name, cache_dir=cfg.model.cache_dir))
    check_model(cfg, model_path)
    if cfg.warm_start.enabled:  # built once per config, then read from the cache
        from pipeline.orchestration.warm_start import ensure_warm_start

        signals.during("the warm start")
        model_path = str(ensure_warm_start(cfg, model_path))
        with signals.deferred():  # which clone the run started from (its rows, NLL, seconds, cache key)
            _write(run_dir / "warm_start.json", (Path(model_path) / "privy_model.json").read_text())
    with signals.deferred():
        _write(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return model_path


def _write(path: Path, text: str) -> None:
    """``path`` whole or not at all (written beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _controller(cfg: PrivyConfig, run_dir: Path, method, resume_state, ckpt, actors, started_at: float):
    """The controller over the started actors, a resume's state loaded into them."""
    from omegaconf import OmegaConf

    from pipeline.orchestration.checkpoint import Checkpointer
    from pipeline.orchestration.controller import Controller, ControllerState
    from pipeline.orchestration.logging import EventLog, OutcomeLog, make_logger

    learner, workers, scorer = actors
    state = buffer_state = wandb_id = None
    if resume_state is not None:
        asyncio.run(learner.load(str(ckpt)))
        state = ControllerState(**resume_state["controller"])
        buffer_state, wandb_id = resume_state["buffer"], resume_state.get("wandb_id")
    logger = make_logger(cfg.logger, run_dir, OmegaConf.to_container(OmegaConf.structured(cfg)), wandb_id)
    extra = {"wandb_id": getattr(logger.sinks[-1], "run_id", None) if logger.sinks else None}
    controller = Controller(
        cfg,
        learner=learner,
        workers=workers,
        method=method,
        logger=logger,
        checkpointer=Checkpointer(run_dir, cfg.trainer.keep_checkpoints, extra),
        scorer=scorer,
        progress=Progress(cfg.trainer.total_steps, state.step if state else 0, cfg.logger.progress),
        state=state,
        buffer_state=buffer_state,
        events=EventLog(run_dir / "events.jsonl"),
        outcomes=OutcomeLog(run_dir / "outcomes"),
        started_at=started_at,
    )
    if resume_state is not None:
        # Rollout workers (and a self-teacher) start from the initial weights: sync them first.
        asyncio.run(learner.publish(controller.state.step, workers, scorer))
    return controller


def _drive(controller, signals: StopSignals, cfg: PrivyConfig, run_dir: Path) -> list[dict[str, float]]:
    """Run the controller, signals turned into stop requests; a third one aborts (``Aborted``),
    said as what it loses."""
    from pipeline.orchestration.controller import Aborted

    async def main():
        def on_stop(signum: int, n: int) -> None:
            ask_to_stop(controller, cfg.trainer.stop_grace_s, signum, n)

        with signals.controller(asyncio.get_running_loop(), on_stop):
            return await controller.run()

    try:
        return asyncio.run(main())
    except Aborted:
        raise RunStopped(abort_line(controller, run_dir, cfg.trainer.total_steps), signum=signals.first) from None


def _parts(run_dir: Path, resumed: bool, this: dict) -> list[dict]:
    """The invocations a run is made of: a run resumed from its own checkpoint keeps what the
    summary of its earlier parts says (their commit, tree state, last step and seconds), then this
    one; a run started afresh is one part."""
    earlier = run_dir / "summary.json"
    if not resumed or not earlier.exists():
        return [this]
    old = json.loads(earlier.read_text())
    keep = ("commit", "clean", "steps", "seconds")
    return [*(old.get("parts") or [{k: old.get(k) for k in keep}]), this]


def _write_summary(run_dir: Path, controller, history: list, parts: list[dict], total_steps: int) -> None:
    done = controller.state.step >= total_steps or controller.time_limited
    summary = {
        "steps": controller.state.step,
        # False: a signal stopped it before its last step or its final validation; a rerun of
        # scripts/bench/learning.py resumes such a run instead of taking it as a result
        "finished": done and controller.state.val_pending is None,  # (a skipped final split is pending too)
        "time_limited": controller.time_limited,  # ended by trainer.time_limit_s before total_steps
        "seconds": sum(p["seconds"] or 0.0 for p in parts),  # every part's, a resumed run's too
        "first": history[0] if history else {},
        "last": history[-1] if history else {},
        # "commit", "clean": of this (the last) part; "parts": each invocation's, first to last
        # (scripts/results.py check reads every part's commit)
        "commit": parts[-1].get("commit"),
        "clean": parts[-1].get("clean"),
        "parts": parts,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=float))


def _say_if_stopped(cfg: PrivyConfig, run_dir: Path, controller, signals: StopSignals) -> None:
    """A run a signal stopped ends with RunStopped: which step is saved (or that none is) and how
    to go on; the exit status follows the first signal."""
    total = cfg.trainer.total_steps
    if not controller.stopping or (controller.state.step >= total and not controller.final_skipped):
        return
    step, saved = controller.state.step, controller.saver.saved_step
    pending = controller.state.val_pending
    if pending is not None and pending == step and saved == step:
        what = "its validation and the final splits" if controller.final_skipped else "its validation"
        then = f"step {step} is saved, {what} put off; continue with trainer.resume={run_dir} (they run first)"
    elif step == 0:
        then = "no step was trained, nothing is saved: start the run again"
    elif saved == step:
        then = f"step {step} is saved; continue with trainer.resume={run_dir}"
    else:
        then = f"step {step} could not be saved (last saved: {saved or 'none'}); see the error above"
    raise RunStopped(f"stopped after step {step} of {total}; {then}", signum=signals.first)
