"""Launching a run: what is checked before heavy work, Ray, the actors and their weight sync.

``check_launch`` fails at launch naming the field; ``build_actors`` reserves the placement plan
and starts the learner group, the rollout workers and the teacher scorer as Ray actors, each
wrapping its plain class; ``free_actors`` gives their resources back.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.core.runtime_env import allocator_env, set_process_env
from pipeline.orchestration.resources import actor_threads, report_hardware, rollout_concurrency


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
    spec = method.teacher_spec()
    if cfg.scorer.placement == "engine" and spec is not None and not spec.follows_policy:
        raise ConfigError(
            f"scorer.placement=engine scores on the rollout engine, which holds the policy; "
            f"method={method.name}'s teacher has weights of its own: use scorer.placement=actor"
        )
    vllm_scores = (cfg.scorer.placement == "engine" and cfg.rollout.engine == "vllm") or (
        cfg.scorer.placement == "actor" and cfg.scorer.engine == "vllm"
    )
    if spec is not None and spec.needs.whole_distribution and vllm_scores:
        raise ConfigError(
            f"method={method.name}: {spec.needs.asked_by} needs the teacher's whole distribution (a top-k "
            "support or a channel), and vLLM's prompt log-probs give the sampled tokens' only: score with HF "
            "(scorer.placement=actor scorer.engine=hf, or scorer.placement=engine rollout.engine=hf)"
        )
    from pipeline.distributed.placement import check_launch_gpus, plan_placement

    check_launch_gpus(cfg, plan_placement(cfg, with_scorer=scorer_actor(cfg, method)))
    need = cfg.rollout.num_workers * cfg.rollout.num_cpus + cfg.learner.num_learners * cfg.learner.num_cpus
    need += cfg.scorer.num_cpus if scorer_actor(cfg, method) else 0.0
    have = cfg.cluster.num_cpus or os.cpu_count() or 1
    if cfg.cluster.address is None and need > have:
        raise ConfigError(
            f"the actors ask for {need:g} CPUs but the local Ray has {have}: lower "
            "rollout.num_cpus / learner.num_cpus / scorer.num_cpus (fractions are fine) or the actor counts"
        )
    return method, penalty


def scorer_actor(cfg: PrivyConfig, method) -> bool:
    """Whether the run has a teacher scorer actor (a teacher scored outside the learner, not on
    the rollout engines)."""
    return method.teacher_spec() is not None and cfg.scorer.placement == "actor"


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
    """Learner ranks, rollout workers and (if the method has a teacher) the scorer, in one
    placement reservation. Returns (learner group, worker handles, scorer or None, every Ray
    handle to free at the end, the reservation last)."""
    n_threads = actor_threads(cfg)
    env = {"OMP_NUM_THREADS": str(n_threads), "MKL_NUM_THREADS": str(n_threads), **allocator_env(cfg.cluster.allocator)}
    placement = _reserve(cfg, method)
    ranks = _start_learner_ranks(cfg, model_path, placement, env, n_threads)
    workers = _start_rollout_workers(cfg, model_path, placement, env, n_threads)
    prompts = _teacher_prompts(cfg, model_path)
    method.attach(prompts)
    scorer = _start_scorer(cfg, model_path, method.teacher_spec(), prompts, placement, env, n_threads)
    scorer_actor = scorer.route.actor if scorer is not None else None
    handles = [*ranks, *(w.actor for w in workers), *([scorer_actor] if scorer_actor is not None else [])]
    handles.append(placement)  # last: free_actors removes the placement group after the actors
    try:
        learner = _set_up_learner(cfg, ranks, prompts.tok)
    except BaseException:
        free_actors(handles)
        raise
    if run_dir is not None:
        _report_actors(run_dir, ranks, workers, scorer_actor)
    return learner, workers, scorer, handles


def _reserve(cfg: PrivyConfig, method):
    """One placement group for the whole run (cluster.placement=none: none, Ray places each actor)."""
    from pipeline.distributed.placement import check_launch_gpus, plan_placement, reserve

    plan = plan_placement(cfg, with_scorer=scorer_actor(cfg, method))
    check_launch_gpus(cfg, plan)  # Ray is up now: the cluster's GPUs are known
    return reserve(plan, cfg.cluster.placement_timeout_s)


def _start_learner_ranks(cfg: PrivyConfig, model_path: str, placement, env: dict, n_threads: int) -> list:
    import ray

    from actors.learner_actor import LearnerActor

    if cfg.learner.num_gpus > 0:
        env = {**env, "DS_ACCELERATOR": "cuda"}
    learner_cls = ray.remote(LearnerActor)
    return [
        learner_cls.options(**placement.learner(r), runtime_env={"env_vars": env}).remote(
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


def _start_rollout_workers(cfg: PrivyConfig, model_path: str, placement, env: dict, n_threads: int) -> list:
    """A rollout worker whose process dies is restarted by Ray (its constructor runs again); the
    controller replays what it lost and gives it the current weights."""
    import ray

    from actors.handles import RayRollout
    from actors.rollout import RolloutWorker

    rollout_cls = ray.remote(max_concurrency=rollout_concurrency(cfg))(RolloutWorker)
    opts = {"runtime_env": {"env_vars": env}, "max_restarts": cfg.cluster.max_restarts}
    return [
        RayRollout(
            rollout_cls.options(**placement.rollout(i), **opts).remote(
                cfg.rollout, cfg.env, model_path, worker_id=i, threads=n_threads, chat_template=cfg.model.chat_template
            ),
            name=f"rollout worker {i}",
            group_timeout_s=cfg.rollout.group_timeout_s,
        )
        for i in range(cfg.rollout.num_workers)
    ]


def _teacher_prompts(cfg: PrivyConfig, model_path: str):
    """The driver's prompt builder for privileged prompts: they may exceed the student's budget by
    the privileged text, never the model's positions."""
    from pipeline.context.prompts import TeacherPrompts
    from pipeline.models import load_tokenizer

    tok = load_tokenizer(model_path, cfg.model.chat_template)
    return TeacherPrompts(tok, int(getattr(_model_config(model_path), "max_position_embeddings", 8192)))


def _start_scorer(cfg: PrivyConfig, model_path: str, spec, prompts, placement, env: dict, n_threads: int):
    """The teacher scorer of ``spec`` (None: no teacher, or one the learner runs) and its route:
    the rollout engines (``scorer.placement=engine``, checked at launch to hold the policy) or an
    actor of its own with ``scorer.num_cpus`` / ``num_gpus`` (none by default: it shares a node)."""
    if spec is None:
        return None
    import ray

    from actors.scorer import ActorRoute, EngineRoute, TeacherScorer, TeacherScorerWorker

    sc = cfg.scorer
    mbt = sc.micro_batch_tokens  # None: each row its own forward, unpadded
    if sc.placement == "engine":
        route = EngineRoute(micro_batch_tokens=mbt, timeout_s=sc.timeout_s)
    else:
        actor = (
            ray.remote(TeacherScorerWorker)
            .options(**placement.scorer(), runtime_env={"env_vars": env}, max_restarts=cfg.cluster.max_restarts)
            .remote(
                spec.weights_path or model_path,
                temperature=cfg.rollout.temperature,
                micro_batch_tokens=mbt,
                precision=sc.precision,
                device="cuda" if sc.num_gpus > 0 else "cpu",
                threads=n_threads,
                engine=sc.engine,
                vllm=cfg.rollout.vllm,
                chat_template=cfg.model.chat_template,
            )
        )
        route = ActorRoute(actor, follows_policy=spec.follows_policy, precision=sc.precision, timeout_s=sc.timeout_s)
    return TeacherScorer(route, spec, prompts, noise_floor=sc.noise_floor)


def _set_up_learner(cfg: PrivyConfig, ranks: list, tok):
    """The ranks meet at rank 0's node (its IP: ranks may sit on several nodes), at the store it
    binds there; every rank blocks in setup until all have joined."""
    import ray

    from actors.handles import LearnerGroup

    master = ray.get(ranks[0].node_address.remote(), timeout=900)
    ray.get([rk.setup.remote(*master) for rk in ranks], timeout=900)
    ray.get([rk.ping.remote() for rk in ranks], timeout=900)  # surface setup errors now
    node_ids = ray.get([rk.node_id.remote() for rk in ranks], timeout=900)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return LearnerGroup(ranks, pad_id, cfg.learner.call_timeout_s, node_ids)


def _report_actors(run_dir: Path, ranks: list, workers: list, scorer_actor) -> None:
    import ray

    infos = {f"learner{r}": info for r, info in enumerate(ray.get([rk.hardware.remote() for rk in ranks], timeout=900))}
    hw = ray.get([w.actor.hardware.remote() for w in workers], timeout=900)
    infos.update({f"rollout{i}": info for i, info in enumerate(hw)})
    if scorer_actor is not None:
        infos["scorer"] = ray.get(scorer_actor.hardware.remote(), timeout=900)
    report_hardware(run_dir, infos)


def _model_config(model_path: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


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
        free_actors(actors)
        raise


def free_actors(actors: list) -> None:
    """Free the actors' CPU reservations (a following phase needs them)."""
    import ray

    from pipeline.distributed.placement import Reservation

    for a in actors:
        try:
            if isinstance(a, Reservation):
                a.remove()
            else:
                ray.kill(a)
        except Exception:  # already dead
            pass


# ----- the same parts in this process (the warm start, feedback selection): launch is the one door --------
def local_env(env_cfg, split: str):
    """The run's env on ``split``, in this process."""
    from envs import make_env

    return make_env(env_cfg.name, env_cfg.options, split)


def local_learner(learner_cfg, model_path: str, *, total_steps: int, seed: int, temperature: float = 1.0):
    """A learner of one rank in this process, set up (its own single-rank process group)."""
    from actors.learner import LearnerWorker
    from actors.learner_setup import init_process_group_env
    from pipeline.distributed.rendezvous import host_store

    init_process_group_env(0, 1, "127.0.0.1", host_store(60.0))
    learner = LearnerWorker(learner_cfg, model_path, temperature=temperature, total_steps=total_steps, seed=seed)
    learner.setup()
    return learner


def save_local_learner(learner, out: str | Path, model_path: str) -> None:
    """The learner's model as an HF directory, with ``model_path``'s tokenizer."""
    from actors.learner_setup import copy_tokenizer

    learner.module.save_pretrained(str(out), state_dict=learner.state_dict_for_sync(), safe_serialization=True)
    copy_tokenizer(model_path, Path(out))


def local_rollout_worker(rollout_cfg, env_cfg, model_path: str, engine=None):
    """A rollout worker in this process (``engine=None``: its HF engine at ``rollout_cfg.precision``)."""
    from actors.rollout import RolloutWorker

    return RolloutWorker(rollout_cfg, env_cfg, model_path, engine=engine)
