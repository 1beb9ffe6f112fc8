"""Typed configuration: Hydra composes YAML in ``conf/``; the dataclasses of
``pipeline/core/schema.py`` carry it (re-exported here).

The schema is registered in Hydra's ConfigStore as ``privy_schema`` so a typo in a YAML key or an
override fails at composition. ``validate()`` then checks values and cross-field rules once, before
any heavy work, raising ``ConfigError`` with a message that says what to change. Nothing is
silently fixed after parsing. Each actor receives only its own slice (``RolloutConfig``,
``LearnerConfig``, ...).

``method`` and ``env.options`` are open mappings here: each method class and each env validates
its own options against its own dataclass (see ``pipeline.methods`` and ``envs``), so adding a
method never touches this file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from pipeline.core.hardware import PRECISIONS
from pipeline.core.schema import (
    PROMPT_FORMATS,
    ClusterConfig,
    EnvConfig,
    LearnerConfig,
    LoggerConfig,
    ModelConfig,
    PrivyConfig,
    RolloutConfig,
    ScorerConfig,
    SweepConfig,
    TrainerConfig,
    VLLMConfig,
    WarmStartConfig,
)
from pipeline.core.types import Placement

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config tree (presets: conf/method/)


class ConfigError(ValueError):
    """A configuration value is wrong; the message says which key and what to change."""


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="privy_schema", node=PrivyConfig)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _fields(cfg: PrivyConfig, *keys: str) -> list[tuple[str, object]]:
    """``(key, value)`` of each dotted key, so that one check over several fields names the one it refuses."""
    return [(key, functools.reduce(getattr, key.split("."), cfg)) for key in keys]


def _check_rollout(cfg: PrivyConfig) -> None:
    """Rollout (and the precisions, the chat template, the scorer's own limits)."""
    r = cfg.rollout
    _require(r.engine in ("hf", "vllm"), f"rollout.engine={r.engine!r}: use hf or vllm")
    _require(r.num_workers >= 1, "rollout.num_workers must be >= 1")
    _require(
        r.min_workers is None or 1 <= r.min_workers <= r.num_workers,
        f"rollout.min_workers={r.min_workers} must be in [1, rollout.num_workers={r.num_workers}] (or null: all)",
    )
    _require(r.group_size >= 1, "rollout.group_size must be >= 1")
    _require(r.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
    _require(r.max_prompt_tokens >= 64, "rollout.max_prompt_tokens must be >= 64")
    _require(
        r.temperature > 0,
        "rollout.temperature must be > 0 for training rollouts "
        "(log-probs of a greedy policy are not a sampling distribution)",
    )
    _require(0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]")
    # The engines' log-probs under a nucleus are renormalised over it; the learner's are over the
    # whole vocabulary, so the PPO ratio would start at 1/kept-mass (TRL #6789). Refused rather than
    # corrected: a corrected learner would need the engine's nucleus per token.
    _require(
        r.top_p == 1 or cfg.trainer.total_steps == 0,
        f"rollout.top_p={r.top_p}: a training run samples from the whole vocabulary (use 1.0): under a "
        "nucleus the engine's log-probs are renormalised over the kept tokens and the learner's are not, "
        "so every importance ratio would be off by the kept mass",
    )
    for key, value in _fields(cfg, "rollout.precision", "learner.precision", "scorer.precision"):
        _require(value in PRECISIONS, f"{key}={value!r}: use one of {', '.join(PRECISIONS)}")
    m = cfg.scorer.max_noise_ratio
    _require(m is None or m > 0, f"scorer.max_noise_ratio={m} must be > 0 (or null: never refuse)")
    _require(cfg.scorer.placement in ("actor", "engine"), f"scorer.placement={cfg.scorer.placement!r}: actor | engine")
    _require(cfg.scorer.engine in ("hf", "vllm"), f"scorer.engine={cfg.scorer.engine!r}: hf | vllm")
    _require(
        cfg.scorer.engine == "hf" or cfg.scorer.placement == "actor",
        "scorer.engine is the scorer actor's engine; with scorer.placement=engine the rollout engine "
        "scores (rollout.engine): drop scorer.engine or use scorer.placement=actor",
    )
    _require(
        cfg.scorer.engine != "vllm" or r.temperature == 1.0,
        f"scorer.engine=vllm scores at temperature 1 (vLLM's prompt log-probs skip the sampler), and "
        f"rollout.temperature={r.temperature}: set rollout.temperature=1.0, or scorer.engine=hf",
    )
    # vLLM's prompt log-probs come from the raw logits (they skip the sampler), so a vLLM
    # teacher scores at temperature 1 while the scorer actor scores at rollout.temperature.
    _require(
        cfg.scorer.placement != "engine" or r.engine != "vllm" or r.temperature == 1.0,
        f"scorer.placement=engine with rollout.engine=vllm scores at temperature 1 (vLLM's prompt "
        f"log-probs skip the sampler), and rollout.temperature={r.temperature}: set rollout.temperature=1.0, "
        "or scorer.placement=actor",
    )
    _require(
        cfg.scorer.micro_batch_tokens is None or cfg.scorer.micro_batch_tokens >= 64,
        "scorer.micro_batch_tokens must be >= 64 (or null: each row its own forward, unpadded)",
    )
    if cfg.model.chat_template is not None:
        from pipeline.core.chat_templates import TEMPLATES

        ct = cfg.model.chat_template
        _require(
            ct in TEMPLATES or Path(ct).expanduser().is_file(),
            f"model.chat_template={ct!r}: name one of {', '.join(sorted(TEMPLATES))} or an existing Jinja file",
        )
    _require(all(v >= 0 for v in r.val_temperatures), f"rollout.val_temperatures={r.val_temperatures} must be >= 0")
    _require(r.max_batch >= 1, "rollout.max_batch must be >= 1")
    _require(
        r.max_batch_tokens >= r.max_prompt_tokens + r.max_new_tokens,
        f"rollout.max_batch_tokens={r.max_batch_tokens} must fit one sequence: >= rollout.max_prompt_tokens + "
        f"rollout.max_new_tokens = {r.max_prompt_tokens + r.max_new_tokens}",
    )
    _require(r.batch_wait_s >= 0, "rollout.batch_wait_s must be >= 0")
    _require(r.env_workers >= 1, "rollout.env_workers must be >= 1")
    _require(r.env_timeout_s > 0, "rollout.env_timeout_s must be > 0")
    _require(r.group_timeout_s >= 0, f"rollout.group_timeout_s={r.group_timeout_s} must be >= 0 (0 = never)")
    _require(cfg.scorer.timeout_s >= 0, f"scorer.timeout_s={cfg.scorer.timeout_s} must be >= 0 (0 = never)")


def _check_learner(cfg: PrivyConfig) -> None:
    """learner."""
    r, lr, t = cfg.rollout, cfg.learner, cfg.trainer
    _require(lr.num_learners >= 1, "learner.num_learners must be >= 1")
    _require(lr.zero_stage in (0, 1, 2, 3), f"learner.zero_stage={lr.zero_stage}: use 0, 1, 2 or 3")
    _require(lr.lr > 0, f"learner.lr={lr.lr} must be > 0")
    _require(lr.weight_decay >= 0, f"learner.weight_decay={lr.weight_decay} must be >= 0")
    _require(lr.warmup_steps >= 0, f"learner.warmup_steps={lr.warmup_steps} must be >= 0")
    _require(lr.grad_clip >= 0, f"learner.grad_clip={lr.grad_clip} must be >= 0 (0 = no clipping)")
    _require(lr.lr_schedule in ("constant", "cosine"), "learner.lr_schedule: use constant or cosine")
    _require(len(lr.betas) == 2 and all(0 <= b < 1 for b in lr.betas), "learner.betas: two values in [0, 1)")
    _require(lr.micro_batch_tokens >= 64, "learner.micro_batch_tokens must be >= 64")
    _require(lr.shared_tokens >= 0, "learner.shared_tokens must be >= 0 (0: one row per micro-batch)")
    _require(lr.head_chunk_tokens >= 0, "learner.head_chunk_tokens must be >= 0 (0: the whole micro-batch at once)")
    _require(lr.optimizer_chunk_mb >= 0, "learner.optimizer_chunk_mb must be >= 0 (0: every gradient at once)")
    _require(lr.mini_batches >= 1, "learner.mini_batches must be >= 1")
    _require(
        lr.mini_batches <= t.groups_per_step,
        f"learner.mini_batches={lr.mini_batches} > trainer.groups_per_step={t.groups_per_step}: "
        "a mini-batch holds whole groups",
    )
    _require(
        r.group_size * t.groups_per_step >= lr.mini_batches * lr.num_learners,
        "every learner rank needs rows in every mini-batch: raise rollout.group_size or "
        "trainer.groups_per_step, or lower learner.mini_batches / learner.num_learners",
    )
    _require(lr.clip_low > 0, f"learner.clip_low={lr.clip_low} must be > 0")
    _require(lr.clip_high > 0, f"learner.clip_high={lr.clip_high} must be > 0")
    _require(lr.dual_clip > 1, "learner.dual_clip must be > 1 (verl's c = 3.0)")
    _require(lr.correction in ("decoupled", "tis", "none"), "learner.correction: decoupled | tis | none")
    _require(lr.behaviour_cap >= 1, "learner.behaviour_cap must be >= 1")
    _require(lr.kl_coef >= 0, f"learner.kl_coef={lr.kl_coef} must be >= 0")
    _require(lr.call_timeout_s >= 0, f"learner.call_timeout_s={lr.call_timeout_s} must be >= 0 (0 = never)")
    _require(lr.entropy_coef >= 0, f"learner.entropy_coef={lr.entropy_coef} must be >= 0")


def _check_trainer(cfg: PrivyConfig) -> None:
    """trainer."""
    lr, t = cfg.learner, cfg.trainer
    _require(t.total_steps >= 0, "trainer.total_steps must be >= 0 (0 = evaluate only)")
    _require(
        t.total_steps or t.val_at_start or t.final_val_splits,
        "trainer.total_steps=0 evaluates only: set trainer.val_at_start=true or trainer.final_val_splits",
    )
    _require(t.groups_per_step >= 1, "trainer.groups_per_step must be >= 1")
    _require(t.max_policy_lag >= 0, "trainer.max_policy_lag must be >= 0 (0 = synchronous)")
    _require(
        t.max_policy_lag == 0 or lr.correction != "none",
        "trainer.max_policy_lag > 0 needs learner.correction=decoupled or tis",
    )
    _require(t.val_every >= 0, f"trainer.val_every={t.val_every} must be >= 0 (0 = never)")
    _require(t.privileged_val in ("every", "ends"), f"trainer.privileged_val={t.privileged_val!r}: use every or ends")
    _require(t.ckpt_every >= 0, f"trainer.ckpt_every={t.ckpt_every} must be >= 0 (0 = only the final checkpoint)")
    _require(t.keep_checkpoints >= 1, f"trainer.keep_checkpoints={t.keep_checkpoints} must be >= 1")
    _require(
        t.resume != "auto" or bool(t.run_dir),
        "trainer.resume=auto needs trainer.run_dir: a fixed directory the job finds again when it is started "
        "again (the default run dir is a new timestamp each time)",
    )
    _require(t.stop_grace_s > 0, f"trainer.stop_grace_s={t.stop_grace_s} must be > 0 (seconds from SIGTERM to SIGKILL)")
    _require(
        t.time_limit_s is None or t.time_limit_s > 0,
        f"trainer.time_limit_s={t.time_limit_s} must be > 0 seconds (or null: no limit)",
    )
    _require(
        t.val_tasks >= 1 or not (t.val_every or t.val_at_start or t.final_val_splits),
        "trainer.val_tasks must be >= 1 when validating",
    )


def _check_vllm_and_resources(cfg: PrivyConfig) -> None:
    """Rollout.vllm, Ray resources per actor, env, learner offload."""
    r, lr, t = cfg.rollout, cfg.learner, cfg.trainer
    v = r.vllm
    _require(v.tensor_parallel_size >= 1, "rollout.vllm.tensor_parallel_size must be >= 1")
    _require(0 < v.gpu_memory_utilization <= 1, "rollout.vllm.gpu_memory_utilization must be in (0, 1]")
    _require(
        v.max_model_len is None or v.max_model_len >= r.max_prompt_tokens + r.max_new_tokens,
        f"rollout.vllm.max_model_len={v.max_model_len} < rollout.max_prompt_tokens + "
        f"rollout.max_new_tokens={r.max_prompt_tokens + r.max_new_tokens}: raise it or set null",
    )
    _require(
        v.tensor_parallel_size == 1 or not v.in_process,
        "rollout.vllm.tensor_parallel_size > 1 needs rollout.vllm.in_process=false",
    )
    _require(v.kv_cache_gb > 0, "rollout.vllm.kv_cache_gb must be > 0")
    _require(
        not v.enable_sleep_mode or t.max_policy_lag == 0,
        "rollout.vllm.enable_sleep_mode=true needs trainer.max_policy_lag=0 (engines sleep while "
        "the learner trains; at lag > 0 they are sampling then)",
    )
    actors = ("rollout", "learner", "scorer")
    for key, value in _fields(cfg, *(f"{a}.num_{kind}" for kind in ("gpus", "cpus") for a in actors)):
        _require(value >= 0, f"{key}={value} must be >= 0 (Ray resources per actor)")
    e = cfg.env
    _require(
        e.invalid_action_penalty is None or e.invalid_action_penalty >= 0,
        f"env.invalid_action_penalty={e.invalid_action_penalty} must be >= 0 (or null: the env's default)",
    )
    _require(lr.offload_params is False or lr.zero_stage == 3, "learner.offload_params needs learner.zero_stage=3")
    _require(
        lr.offload_optimizer is False or lr.zero_stage in (1, 2, 3),
        "learner.offload_optimizer needs learner.zero_stage >= 1",
    )


def _check_cluster(cfg: PrivyConfig) -> None:
    """Cluster, and env / logger / method / sweep."""
    c = cfg.cluster
    _require(c.placement in ("none", "pack", "spread"), f"cluster.placement={c.placement!r}: none | pack | spread")
    _require(not c.colocate or c.placement != "none", "cluster.colocate=true needs cluster.placement=pack or spread")
    _require(c.placement_timeout_s > 0, "cluster.placement_timeout_s must be > 0")
    _require(c.allocator in ("jemalloc", "system"), f"cluster.allocator={c.allocator!r}: jemalloc | system")
    _require(
        c.weight_sync in ("object_store", "collective"),
        f"cluster.weight_sync={c.weight_sync!r}: object_store | collective",
    )
    _require(c.sync_backend in ("auto", "gloo", "nccl"), f"cluster.sync_backend={c.sync_backend!r}: auto | gloo | nccl")
    _require(c.sync_bucket_mb >= 1, "cluster.sync_bucket_mb must be >= 1")
    _require(c.sync_timeout_s > 0, f"cluster.sync_timeout_s={c.sync_timeout_s} must be > 0")
    _require(
        cfg.trainer.max_skipped_steps >= 0, f"trainer.max_skipped_steps={cfg.trainer.max_skipped_steps}: must be >= 0"
    )
    _require(c.num_cpus is None or c.num_cpus >= 1, f"cluster.num_cpus={c.num_cpus} must be >= 1 (or null: all)")
    _require(
        c.threads_per_actor is None or c.threads_per_actor >= 1,
        f"cluster.threads_per_actor={c.threads_per_actor} must be >= 1 (or null: chosen per actor)",
    )
    _require(c.max_restarts >= 0, f"cluster.max_restarts={c.max_restarts}: must be >= 0")
    _require(
        not (c.colocate and c.weight_sync == "collective" and c.sync_backend != "gloo"),
        "cluster.colocate=true puts learner rank 0 and rollout engine 0 on one GPU, and NCCL "
        "refuses two ranks of a group on one device: use cluster.weight_sync=object_store or "
        "cluster.sync_backend=gloo",
    )
    _require(cfg.env.history_length >= 0, "env.history_length must be >= 0")
    _require(
        cfg.env.prompt_format in PROMPT_FORMATS,
        f"env.prompt_format={cfg.env.prompt_format!r}: choose one of {list(PROMPT_FORMATS)}",
    )
    _require(
        cfg.logger.wandb_mode in ("offline", "online", "disabled"), "logger.wandb_mode: offline | online | disabled"
    )
    _require(
        isinstance(cfg.method, dict) and "name" in cfg.method,
        "method must name a method: method=grpo (see conf/method/)",
    )
    validate_sweep(cfg.sweep)


def _check_warm_start(cfg: PrivyConfig) -> None:
    """warm_start."""
    w = cfg.warm_start
    _require(w.tasks >= 1, "warm_start.tasks must be >= 1")
    _require(w.epochs >= 1, "warm_start.epochs must be >= 1")
    _require(w.lr > 0, "warm_start.lr must be > 0")
    _require(w.batch_rows >= 1, "warm_start.batch_rows must be >= 1")
    _require(w.lr_schedule in ("constant", "cosine"), f"warm_start.lr_schedule={w.lr_schedule!r}: constant | cosine")
    _require(w.precision in PRECISIONS, f"warm_start.precision={w.precision!r}: one of {', '.join(PRECISIONS)}")
    places = [p.value for p in Placement]
    _require(
        w.hint_placement is None or w.hint_placement in places,
        f"warm_start.hint_placement={w.hint_placement!r}: null or one of {', '.join(places)}",
    )


def validate(cfg: PrivyConfig) -> None:
    """Check every value and cross-field rule; raise ConfigError saying what to change."""
    _check_rollout(cfg)
    _check_learner(cfg)
    _check_trainer(cfg)
    _check_vllm_and_resources(cfg)
    _check_cluster(cfg)
    _check_warm_start(cfg)


def validate_sweep(s: SweepConfig) -> None:
    """The ``sweep`` section alone: a multirun checks it before its first point."""
    _require(
        bool(s.name) and not Path(s.name).is_absolute(),
        f"sweep.name={s.name!r}: a relative name under multirun/ (for any other place set hydra.sweep.dir)",
    )
    _require(bool(s.metric), "sweep.metric must name a logged metric, e.g. val/success")
    _require(s.goal in ("max", "min"), f"sweep.goal={s.goal!r}: max | min")
    _require(all(s.aggregate), "sweep.aggregate: a list of config keys, e.g. [trainer.seed]")


def to_config(dict_cfg: Any) -> PrivyConfig:
    """Convert a composed DictConfig (or plain dict) to the typed config and validate it."""
    from omegaconf import OmegaConf

    base = OmegaConf.structured(PrivyConfig)
    if not isinstance(dict_cfg, dict):
        dict_cfg = OmegaConf.to_container(dict_cfg, resolve=True)
    dict_cfg = {k: v for k, v in dict_cfg.items() if k != "hydra"}
    try:
        merged = OmegaConf.merge(base, dict_cfg)
    except Exception as e:  # omegaconf's errors name the key; keep only the first line
        raise ConfigError(str(e).splitlines()[0]) from None
    cfg: PrivyConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    cfg.method = dict(cfg.method)
    cfg.env.options = dict(cfg.env.options)
    validate(cfg)
    return cfg


__all__ = [
    "ClusterConfig",
    "ConfigError",
    "EnvConfig",
    "LearnerConfig",
    "LoggerConfig",
    "ModelConfig",
    "PrivyConfig",
    "RolloutConfig",
    "ScorerConfig",
    "SweepConfig",
    "TrainerConfig",
    "VLLMConfig",
    "WarmStartConfig",
    "MISSING",
    "register_schema",
    "to_config",
    "validate",
    "validate_sweep",
]
