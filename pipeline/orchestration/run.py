"""Run training: launch (``pipeline/orchestration/launch.py``), the phases before it
(``phases.py``), then drive the controller, stop on a signal, write the results.

``run_training(cfg, run_dir)`` is what ``scripts/train.py`` (Hydra) calls; tests call it directly
with a composed config.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import time
from pathlib import Path

from pipeline.core.config import ConfigError, PrivyConfig
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
    """Train; returns the per-step metrics. Raises ConfigError for a bad config."""
    from omegaconf import OmegaConf

    from pipeline.models import resolve_model
    from pipeline.orchestration.checkpoint import Checkpointer, load_state, resolve_checkpoint
    from pipeline.orchestration.controller import Controller, ControllerState
    from pipeline.orchestration.logging import EventLog, OutcomeLog, make_logger

    started_at = time.monotonic()  # trainer.time_limit_s counts from here: a run's wall time, startup included
    set_process_env()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    method, _ = check_launch(cfg)
    if cfg.trainer.resume == "auto":
        cfg.trainer.resume = auto_resume(method, run_dir)
    if cfg.trainer.resume:  # may first finish a first phase that died, then start this one fresh
        resume = resume_phases(cfg, method, run_dir, run_training)
    else:
        resume = None
        run_prerequisite(cfg, method, run_dir, run_training)
    resume_state = None
    if resume:
        try:
            ckpt = resolve_checkpoint(resume)
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
        resume_state = load_state(ckpt)
        method.load_state_dict(resume_state["method"])  # before the actors: it may name a teacher
        supersede_metrics(run_dir, resume_state["controller"]["step"])
    model_path = str(resolve_model(cfg.model.path or cfg.model.name, cache_dir=cfg.model.cache_dir))
    check_model(cfg, model_path)
    if cfg.warm_start.enabled:  # built once per config, then read from the cache
        from pipeline.orchestration.warm_start import ensure_warm_start

        model_path = str(ensure_warm_start(cfg, model_path))
        # which clone the run started from (its rows, NLL, seconds, cache key): kept with the run
        shutil.copyfile(Path(model_path) / "privy_model.json", run_dir / "warm_start.json")
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))

    start_ray(cfg)
    learner, workers, scorer, actors = build_actors(cfg, model_path, method, run_dir)
    init_weight_sync(cfg, learner, workers, scorer, actors)
    state = None
    buffer_state = None
    if resume_state is not None:
        asyncio.run(learner.load(str(ckpt)))
        state = ControllerState(**resume_state["controller"])
        buffer_state = resume_state["buffer"]
    wandb_id = resume_state.get("wandb_id") if resume_state else None
    logger = make_logger(cfg.logger, run_dir, OmegaConf.to_container(OmegaConf.structured(cfg)), wandb_id)
    extra = {"wandb_id": getattr(logger.sinks[-1], "run_id", None) if logger.sinks else None}
    start_step = state.step if state else 0
    progress = Progress(cfg.trainer.total_steps, start_step, cfg.logger.progress)
    controller = Controller(
        cfg,
        learner=learner,
        workers=workers,
        method=method,
        logger=logger,
        checkpointer=Checkpointer(run_dir, cfg.trainer.keep_checkpoints, extra),
        scorer=scorer,
        progress=progress,
        state=state,
        buffer_state=buffer_state,
        events=EventLog(run_dir / "events.jsonl"),
        outcomes=OutcomeLog(run_dir / "outcomes"),
        started_at=started_at,
    )
    if resume_state is not None:
        # Rollout workers (and a self-teacher) start from the initial weights: sync them first.
        asyncio.run(learner.publish(start_step, workers, scorer))

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if controller.stopping:
            print(f"privy-rl: second stop request ({name}): aborting now", file=sys.stderr, flush=True)
            controller.request_stop()
        elif signum == signal.SIGTERM:  # a cluster's stop: SIGKILL follows after its grace
            grace = cfg.trainer.stop_grace_s
            print(
                f"privy-rl: SIGTERM: finishing step {controller.state.step + 1} if it can be checkpointed "
                f"within trainer.stop_grace_s={grace:g}, else keeping step {controller.state.step}; no more "
                "validation",
                file=sys.stderr,
                flush=True,
            )
            controller.request_stop(deadline=time.monotonic() + grace)
        else:
            print(
                f"privy-rl: Ctrl-C: finishing step {controller.state.step + 1}, then saving a checkpoint "
                "(Ctrl-C again aborts at once)",
                file=sys.stderr,
                flush=True,
            )
            controller.request_stop()
        stopped_by.append(signum)

    stopped_by: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):  # replaces Ray's SIGTERM handler (an exit at once)
            try:
                loop.add_signal_handler(signum, on_signal, signum)
            except (NotImplementedError, RuntimeError):  # not the main thread (e.g. under a test runner)
                pass
        return await controller.run()

    t0 = time.time()
    try:
        history = asyncio.run(main())
    finally:
        progress.close()
        logger.close()
        controller.events.close()
        free_actors(actors)
    summary = {
        "steps": controller.state.step,
        "time_limited": controller.time_limited,  # ended by trainer.time_limit_s before total_steps
        "seconds": time.time() - t0,
        "first": history[0] if history else {},
        "last": history[-1] if history else {},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    if controller.stopping and (controller.state.step < cfg.trainer.total_steps or controller.final_skipped):
        step, signum = controller.state.step, (stopped_by or [signal.SIGINT])[0]
        if controller.final_skipped:
            then = (
                f"checkpoint saved; the final validation was skipped: evaluate {run_dir}/checkpoints/"
                f"step_{step:06d}/hf with trainer.total_steps=0 model=hf_path model.path=..."
            )
        elif step == 0:
            then = "no step was trained, nothing to save: start the run again"
        else:
            then = f"checkpoint saved; continue with trainer.resume={run_dir}"
        raise RunStopped(f"stopped after step {step} of {cfg.trainer.total_steps}; {then}", signum=signum)
    return history


class RunStopped(KeyboardInterrupt):
    """The run stopped early on request (Ctrl-C, SIGTERM) after checkpointing; the message says how
    to resume. ``signum``: the signal that asked (the process exits with 128 + it)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum)
