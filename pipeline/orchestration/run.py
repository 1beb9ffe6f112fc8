"""Assemble a run: validate, start Ray and the actors, drive the controller, write the results.

``run_training(cfg, run_dir)`` is what ``scripts/train.py`` (Hydra) calls; tests call it directly
with a composed config.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.core.runtime_env import set_process_env


def check_launch(cfg: PrivyConfig):
    """Everything that can be checked before heavy work; returns (method, invalid_penalty)."""
    from envs import env_class
    from pipeline.methods import build_method

    try:
        env_cls = env_class(cfg.env.name)
        env_cls.validate_options(cfg.env.options)
    except ValueError as e:
        raise ConfigError(f"env: {e}") from None
    from envs.base import TextEnv

    if cfg.warm_start.enabled and env_cls.expert_response is TextEnv.expert_response:
        raise ConfigError(
            f"warm_start.enabled=true: env {cfg.env.name!r} has no expert to clone "
            "(TextEnv.expert_response); set warm_start.enabled=false"
        )
    _check_splits(cfg)
    penalty = (
        cfg.env.invalid_action_penalty if cfg.env.invalid_action_penalty is not None else env_cls.invalid_action_penalty
    )
    try:
        method = build_method(cfg.method, invalid_action_penalty=penalty, env_name=cfg.env.name, seed=cfg.trainer.seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    need_val = method.required_val_every()
    if need_val is not None and cfg.trainer.val_every != need_val:
        raise ConfigError(
            f"method={method.name} closes its windows on validation: set "
            f"trainer.val_every={need_val} (got {cfg.trainer.val_every})"
        )
    from pipeline.distributed.placement import check_launch_gpus, plan_placement

    check_launch_gpus(cfg, plan_placement(cfg, with_scorer=method.teacher_spec() is not None))
    need = cfg.rollout.num_workers * cfg.rollout.num_cpus + cfg.learner.num_learners * cfg.learner.num_cpus
    have = cfg.cluster.num_cpus or os.cpu_count() or 1
    if cfg.cluster.address is None and need > have:
        raise ConfigError(
            f"the actors ask for {need:g} CPUs but the local Ray has {have}: lower "
            "rollout.num_cpus / learner.num_cpus (fractions are fine) or the actor counts"
        )
    return method, penalty


def _check_splits(cfg: PrivyConfig) -> None:
    """Each split the run will play must exist now, not after hours of training (a final split)."""
    from envs import make_env

    named = [("env.train_split", cfg.env.train_split), ("env.val_split", cfg.env.val_split)]
    named += [("trainer.final_val_splits", s) for s in cfg.trainer.final_val_splits]
    for field_name, split in named:
        try:
            make_env(cfg.env.name, cfg.env.options, split).close()
        except ValueError as e:
            raise ConfigError(f"{field_name}={split!r}: {e}") from None


def actor_threads(cfg: PrivyConfig) -> int:
    """Torch threads per actor. At lag 0 rollout, scorer and learner take turns (each waits for the
    other), so each gets every core; at lag > 0 rollout workers and learner ranks run at the same
    time and split the cores, so that together they never oversubscribe them."""
    if cfg.cluster.threads_per_actor:
        return cfg.cluster.threads_per_actor
    cores = cfg.cluster.num_cpus or os.cpu_count() or 1
    if cfg.trainer.max_policy_lag == 0:
        return cores
    return max(1, cores // (cfg.rollout.num_workers + cfg.learner.num_learners))


def rollout_concurrency(cfg: PrivyConfig) -> int:
    """Actor threads per rollout worker: one per group it may have in flight (its training loops
    and, at lag > 0 at the same time, its validation tasks), plus a few so that weight calls never
    queue behind groups."""
    w = cfg.rollout.num_workers
    train = -(-(cfg.trainer.max_policy_lag + 1) * cfg.trainer.groups_per_step // w)
    val = -(-cfg.trainer.val_tasks // w)
    return train + val + 4


def check_model(cfg: PrivyConfig, model_path: str):
    """Before Ray starts: the tokenizer loads and has a chat template (its own or
    ``model.chat_template``). Returns the tokenizer."""
    from pipeline.models import has_chat_template, load_tokenizer

    tok = load_tokenizer(model_path, cfg.model.chat_template)
    if not has_chat_template(tok):
        raise ConfigError(
            f"model.chat_template: the tokenizer of {model_path} has no chat template (a base model?); "
            "set model.chat_template=chatml|llama3|qwen2|gemma or a path to a Jinja file"
        )
    return tok


def report_hardware(run_dir: Path, infos: dict[str, dict]) -> str:
    """One line naming each actor's precision and threads, with the reason; written to
    ``hardware.json`` in the run dir. Warnings (explicit bf16 without native support) follow."""
    (run_dir / "hardware.json").write_text(json.dumps(infos, indent=1))
    parts = [f"{who} {i['precision']} x{i['threads']} threads" for who, i in infos.items()]
    reasons = sorted({i["reason"] for i in infos.values()})
    line = "privy-rl: precision: " + ", ".join(parts) + " (" + "; ".join(reasons) + ")"
    print(line, file=sys.stderr, flush=True)
    for warning in sorted({i["warning"] for i in infos.values() if i.get("warning")}):
        print(f"privy-rl: warning: {warning}", file=sys.stderr, flush=True)
    return line


def start_ray(cfg: PrivyConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    env_vars = set_process_env()
    env_vars["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    )
    if cfg.cluster.address is None:
        # A run on one machine serves nothing beyond it: Ray, the rendezvous stores (which bind
        # the node's IP) and gloo's connections all stay on the loopback interface.
        if Path("/sys/class/net/lo").exists():
            env_vars.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # Ray replaces a node IP of 127.0.0.1 with the host's reachable address (and then its gRPC
        # servers listen on every interface) unless clusters are off, as on macOS; that switch is
        # read when ray is imported, so it is set in both places.
        from ray._private import ray_constants

        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(
            address="local",
            num_cpus=cfg.cluster.num_cpus or os.cpu_count(),
            include_dashboard=cfg.cluster.dashboard,
            log_to_driver=True,
            runtime_env={"env_vars": env_vars},
            _node_ip_address="127.0.0.1",
        )
    else:
        # Inside `ray job submit` the job's runtime env (its working_dir on every worker's path, its
        # env_vars) reaches every actor already, and Ray refuses a driver runtime env that repeats
        # its env var keys: add only what the job does not set.
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
        if job:
            env_vars = {k: v for k, v in env_vars.items() if k not in (job.get("env_vars") or {})}
            if job.get("working_dir"):
                env_vars.pop("PYTHONPATH", None)
        ray.init(address=cfg.cluster.address, runtime_env={"env_vars": env_vars} if env_vars else None)


def build_actors(cfg: PrivyConfig, model_path: str, method, run_dir: Path | None = None):
    """Learner ranks, rollout workers and (if the method has a teacher) the scorer."""
    import ray

    from actors.handles import LearnerGroup, RayRollout
    from actors.learner import LearnerActor
    from actors.rollout import RolloutWorker
    from actors.scorer import TeacherScorer, TeacherScorerWorker
    from pipeline.context.prompts import TeacherPrompts
    from pipeline.distributed.placement import check_launch_gpus, plan_placement, reserve
    from pipeline.models import load_tokenizer

    n_threads = actor_threads(cfg)
    threads = {"env_vars": {"OMP_NUM_THREADS": str(n_threads), "MKL_NUM_THREADS": str(n_threads)}}
    # One placement group for the whole run (cluster.placement=none: none, Ray places each actor).
    plan = plan_placement(cfg, with_scorer=method.teacher_spec() is not None)
    check_launch_gpus(cfg, plan)  # Ray is up now: the cluster's GPUs are known
    placement = reserve(plan, cfg.cluster.placement_timeout_s)
    learner_env = threads
    if cfg.learner.num_gpus > 0:
        learner_env = {"env_vars": {**threads["env_vars"], "DS_ACCELERATOR": "cuda"}}
    learner_cls = ray.remote(LearnerActor)
    ranks = [
        learner_cls.options(**placement.learner(r), runtime_env=learner_env).remote(
            cfg.learner,
            model_path,
            temperature=cfg.rollout.temperature,
            total_steps=cfg.trainer.total_steps,
            rank=r,
            world_size=cfg.learner.num_learners,
            seed=cfg.trainer.seed,
            threads=n_threads,
        )
        for r in range(cfg.learner.num_learners)
    ]
    tok = load_tokenizer(model_path, cfg.model.chat_template)
    # A rollout worker or the scorer whose process dies is restarted by Ray (its constructor runs
    # again); the controller replays what it lost and gives it the current weights.
    restarts = cfg.cluster.max_restarts
    rollout_cls = ray.remote(max_concurrency=rollout_concurrency(cfg))(RolloutWorker)
    workers = [
        RayRollout(
            rollout_cls.options(**placement.rollout(i), runtime_env=threads, max_restarts=restarts).remote(
                cfg.rollout, cfg.env, model_path, worker_id=i, threads=n_threads, chat_template=cfg.model.chat_template
            ),
            name=f"rollout worker {i}",
            group_timeout_s=cfg.rollout.group_timeout_s,
        )
        for i in range(cfg.rollout.num_workers)
    ]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    # The teacher prompt may exceed the student's budget by the privileged text, never the model.
    max_total = int(getattr(_model_config(model_path), "max_position_embeddings", 8192))
    prompts = TeacherPrompts(tok, max_total)
    method.attach(prompts)
    scorer, actors = None, [*ranks, *(w.actor for w in workers)]
    spec = method.teacher_spec()
    if spec is not None:
        path = model_path if spec.source == "self" else spec.frozen_path
        # The scorer works while the learner waits for it (or between steps): no CPU reservation.
        actor = (
            ray.remote(TeacherScorerWorker)
            .options(**placement.scorer(), runtime_env=threads, max_restarts=restarts)
            .remote(
                path,
                temperature=cfg.rollout.temperature,
                micro_batch_tokens=cfg.scorer.micro_batch_tokens or cfg.learner.micro_batch_tokens,
                precision=cfg.scorer.precision,
                device="cuda" if cfg.scorer.num_gpus > 0 else "cpu",
                threads=n_threads,
            )
        )
        scorer = TeacherScorer(actor, spec, prompts, timeout_s=cfg.scorer.timeout_s, noise_floor=cfg.scorer.noise_floor)
        actors.append(actor)
    actors.append(placement)  # last: _kill removes the placement group after the actors
    try:
        # The ranks meet at rank 0's node (its IP: ranks may sit on several nodes), at the store
        # it binds there; every rank blocks in setup until all have joined.
        master = ray.get(ranks[0].node_address.remote(), timeout=900)
        ray.get([rk.setup.remote(*master) for rk in ranks], timeout=900)
    except BaseException:
        _kill(actors)
        raise
    ray.get([rk.ping.remote() for rk in ranks], timeout=900)  # surface setup errors now
    if run_dir is not None:
        infos = {
            f"learner{r}": info for r, info in enumerate(ray.get([rk.hardware.remote() for rk in ranks], timeout=900))
        }
        infos.update(
            {
                f"rollout{i}": info
                for i, info in enumerate(ray.get([w.actor.hardware.remote() for w in workers], timeout=900))
            }
        )
        if scorer is not None:
            infos["scorer"] = ray.get(scorer.actor.hardware.remote(), timeout=900)
        report_hardware(run_dir, infos)
    node_ids = ray.get([rk.node_id.remote() for rk in ranks], timeout=900)
    return LearnerGroup(ranks, pad_id, cfg.learner.call_timeout_s, node_ids), workers, scorer, actors


def _model_config(model_path: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


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

    set_process_env()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    method, _ = check_launch(cfg)
    if cfg.trainer.resume == "auto":
        cfg.trainer.resume = _auto_resume(method, run_dir)
    if cfg.trainer.resume:  # may first finish a first phase that died, then start this one fresh
        resume = _resume_phases(cfg, method, run_dir)
    else:
        resume = None
        _run_prerequisite(cfg, method, run_dir)
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
        _kill(actors)
    summary = {
        "steps": controller.state.step,
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


def init_weight_sync(cfg: PrivyConfig, learner, workers: list, scorer, actors: list) -> None:
    """``cluster.weight_sync=collective``: form the broadcast group (learner rank 0 + consumers,
    pipeline/distributed/collective_sync.py) before the first sync. On failure the actors are freed."""
    if cfg.cluster.weight_sync != "collective":
        return
    c = cfg.cluster
    try:
        asyncio.run(
            learner.init_weight_group(
                workers, scorer, backend=c.sync_backend, bucket_mb=c.sync_bucket_mb, timeout_s=c.sync_timeout_s
            )
        )
    except BaseException:
        _kill(actors)
        raise


def _kill(actors: list) -> None:
    """Free the actors' CPU reservations (a following phase needs them)."""
    import ray

    from pipeline.distributed.placement import Placement

    for a in actors:
        try:
            if isinstance(a, Placement):
                a.remove()
            else:
                ray.kill(a)
        except Exception:  # already dead
            pass


def _phase_root(resume: str) -> Path:
    """The run directory of a resume target: a run dir, its checkpoints dir, or a checkpoint; a
    target inside a first phase (``RUN/phase1_teacher/...``) names its parent run."""
    p = Path(resume).resolve()
    for cand in (p, *p.parents):
        if cand.name == PHASE1_DIR:
            return cand.parent
    return p


def _resume_phases(cfg: PrivyConfig, method, run_dir: Path) -> str | None:
    """``trainer.resume`` of a method with a first phase (RetireOPD): the checkpoint to resume the
    second phase from, or None when it must start fresh after the first phase has been finished
    (resumed from its own last checkpoint if it died, adopted as it is if it had completed)."""
    from pipeline.orchestration.checkpoint import resolve_checkpoint

    if method.prerequisite() is None:
        return cfg.trainer.resume
    root = _phase_root(cfg.trainer.resume)
    try:
        return str(resolve_checkpoint(root))  # the second phase has a checkpoint: continue it
    except FileNotFoundError:
        pass
    phase1 = root / PHASE1_DIR
    if not phase1.is_dir():
        raise ConfigError(
            f"trainer.resume={cfg.trainer.resume}: neither a checkpoint of this run nor of its "
            f"first phase ({phase1}) exists"
        )
    _run_prerequisite(cfg, method, run_dir, resume_from=phase1)
    return None


PHASE1_DIR = "phase1_teacher"


def _auto_resume(method, run_dir: Path) -> str | None:
    """``trainer.resume=auto``: the run dir when it holds a complete checkpoint (or, for a method
    with a first phase, that phase's directory), else None: a fresh start, whose old metrics
    (a run that died before its first checkpoint) are set aside. Says which on stderr."""
    from pipeline.orchestration.checkpoint import resolve_checkpoint

    try:
        found = str(resolve_checkpoint(run_dir))
    except FileNotFoundError:
        found = (
            str(run_dir / PHASE1_DIR) if method.prerequisite() is not None and (run_dir / PHASE1_DIR).is_dir() else None
        )
    if found is None:
        print(f"privy-rl: trainer.resume=auto: no checkpoint in {run_dir}: starting fresh", file=sys.stderr, flush=True)
        supersede_metrics(run_dir, -1)
        return None
    print(f"privy-rl: trainer.resume=auto: continuing from {found}", file=sys.stderr, flush=True)
    return str(run_dir)


def supersede_metrics(run_dir: Path, step: int) -> None:
    """A resumed run trains again the steps after its checkpoint's ``step``: their lines move from
    metrics.jsonl to metrics.superseded.jsonl (kept, never mixed with the steps that count), so
    metrics.jsonl holds each step once, as an uninterrupted run's does."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep, drop = [], []
    for line in path.read_text().splitlines():
        if line.strip():
            (keep if json.loads(line).get("step", 0) <= step else drop).append(line)
    if not drop:
        return
    with open(run_dir / "metrics.superseded.jsonl", "a") as f:
        f.write("".join(x + "\n" for x in drop))
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def _run_prerequisite(cfg: PrivyConfig, method, run_dir: Path, resume_from: Path | None = None) -> None:
    """Run the phase a method depends on (RetireOPD: train its teacher with skill_grpo), then hand
    the method the phase's final model and its last validation success rate. ``resume_from``: an
    earlier run's first-phase directory, continued from its last checkpoint (or adopted whole
    when it had finished)."""
    import copy

    from pipeline.orchestration.checkpoint import resolve_checkpoint

    pre = method.prerequisite()
    if pre is None:
        return
    cfg1 = copy.deepcopy(cfg)
    cfg1.method = pre
    cfg1.trainer.total_steps = method.prerequisite_steps()
    cfg1.trainer.resume = None
    cfg1.trainer.run_dir = None
    if cfg1.trainer.val_every == 0:
        raise ConfigError(
            f"method={method.name} measures its teacher's success rate by validation: set trainer.val_every > 0"
        )
    final = f"step_{cfg1.trainer.total_steps:06d}"
    if resume_from is not None:
        try:
            ckpt = resolve_checkpoint(resume_from)
        except FileNotFoundError:
            ckpt = None  # it died before its first checkpoint: train it again
        done = method.finished_prerequisite(ckpt / "hf") if ckpt is not None and ckpt.name == final else None
        if done is not None:  # it had finished: adopt it as it is
            method.adopt_prerequisite(str(ckpt / "hf"), done)
            return
        cfg1.trainer.resume = str(ckpt) if ckpt is not None else None
    phase_dir = run_dir / PHASE1_DIR
    history = run_training(cfg1, phase_dir)
    success = [h["val/success"] for h in history if "val/success" in h]
    hf_dir = phase_dir / "checkpoints" / final / "hf"
    method.adopt_prerequisite(str(hf_dir), success[-1])
