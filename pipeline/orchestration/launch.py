"""Launching a run: what is checked before heavy work, Ray, the actors and their weight sync.

``check_launch`` fails at launch naming the field; ``build_actors`` reserves the placement plan
and starts the learner group, the rollout workers and the teacher scorer as Ray actors, each
wrapping its plain class; ``free_actors`` gives their resources back.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
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
    spec = method.teacher_spec()
    if cfg.scorer.placement == "engine" and spec is not None and spec.source != "self":
        raise ConfigError(
            f"scorer.placement=engine scores on the rollout engine, which holds the policy; "
            f"method={method.name}'s teacher is a {spec.source} checkpoint: use scorer.placement=actor"
        )
    vllm_scores = (cfg.scorer.placement == "engine" and cfg.rollout.engine == "vllm") or (
        cfg.scorer.placement == "actor" and cfg.scorer.engine == "vllm"
    )
    if spec is not None and spec.support_k and vllm_scores:
        raise ConfigError(
            f"method={method.name}: estimator topk_rkl scores the teacher at the student's top-k token ids, "
            "and vLLM's prompt log-probs give the teacher's own top-k: score with HF (scorer.placement=actor "
            "scorer.engine=hf, or scorer.placement=engine rollout.engine=hf)"
        )
    from pipeline.distributed.placement import check_launch_gpus, plan_placement

    check_launch_gpus(cfg, plan_placement(cfg, with_scorer=scorer_actor(cfg, method)))
    need = cfg.rollout.num_workers * cfg.rollout.num_cpus + cfg.learner.num_learners * cfg.learner.num_cpus
    have = cfg.cluster.num_cpus or os.cpu_count() or 1
    if cfg.cluster.address is None and need > have:
        raise ConfigError(
            f"the actors ask for {need:g} CPUs but the local Ray has {have}: lower "
            "rollout.num_cpus / learner.num_cpus (fractions are fine) or the actor counts"
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
    from actors.learner_actor import LearnerActor
    from actors.rollout import RolloutWorker
    from actors.scorer import TeacherScorer, TeacherScorerWorker
    from pipeline.context.prompts import TeacherPrompts
    from pipeline.distributed.placement import check_launch_gpus, plan_placement, reserve
    from pipeline.models import load_tokenizer

    n_threads = actor_threads(cfg)
    threads = {"env_vars": {"OMP_NUM_THREADS": str(n_threads), "MKL_NUM_THREADS": str(n_threads)}}
    # One placement group for the whole run (cluster.placement=none: none, Ray places each actor).
    plan = plan_placement(cfg, with_scorer=scorer_actor(cfg, method))
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
    if spec is not None and not scorer_actor(cfg, method):  # the rollout engines score (checked at launch)
        scorer = TeacherScorer(
            None,
            spec,
            prompts,
            timeout_s=cfg.scorer.timeout_s,
            noise_floor=cfg.scorer.noise_floor,
            micro_batch_tokens=cfg.scorer.micro_batch_tokens or cfg.learner.micro_batch_tokens,
        )
    elif spec is not None:
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
                engine=cfg.scorer.engine,
                vllm=cfg.rollout.vllm,
                chat_template=cfg.model.chat_template,
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
        free_actors(actors)
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
        if scorer is not None and scorer.actor is not None:
            infos["scorer"] = ray.get(scorer.actor.hardware.remote(), timeout=900)
        report_hardware(run_dir, infos)
    node_ids = ray.get([rk.node_id.remote() for rk in ranks], timeout=900)
    return LearnerGroup(ranks, pad_id, cfg.learner.call_timeout_s, node_ids), workers, scorer, actors


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
