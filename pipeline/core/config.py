"""Typed configuration: Hydra composes YAML in ``conf/``; these dataclasses carry it.

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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from pipeline.core.hardware import PRECISIONS
from pipeline.core.types import Placement

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config tree (presets: conf/method/)


class ConfigError(ValueError):
    """A configuration value is wrong; the message says which key and what to change."""


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"  # smollm2_135m | gemma3_270m | tiny | tiny_bytes | any label when `path` is set
    path: str | None = None  # an HF causal-LM directory; overrides `name`
    cache_dir: str | None = None  # where converted models live (default $PRIVY_CACHE or ~/.cache/privy-rl)
    # Chat template for a tokenizer that has none (base models) or to replace its own: a named
    # template (chatml | llama3 | qwen2 | gemma, pipeline/core/chat_templates.py) or a Jinja file path.
    chat_template: str | None = None


@dataclass
class EnvConfig:
    name: str = "alfworld"  # a registered env (envs/__init__.py)
    history_length: int = 2  # earlier (observation, action) pairs shown in the prompt, >= 0
    train_split: str = "train"
    val_split: str = "valid_seen"
    invalid_action_penalty: float | None = None  # None = the env's own default (0.1 ALFWorld)
    options: dict[str, Any] = field(default_factory=dict)  # env-specific, validated by the env


@dataclass
class VLLMConfig:
    """Options of ``rollout.engine=vllm`` (actors/engines/vllm.py); ignored by the HF engine."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5  # fraction of each GPU for weights + KV cache
    max_model_len: int | None = None  # None = rollout.max_prompt_tokens + rollout.max_new_tokens
    enforce_eager: bool = True  # no CUDA graphs: faster start, slower decode
    enable_sleep_mode: bool = False  # free the KV cache while the colocated learner trains (CUDA)
    in_process: bool = True  # engine core in the actor's process (TP=1); False = vLLM's own processes
    kv_cache_gb: float = 2.0  # CPU backend only: VLLM_CPU_KVCACHE_SPACE


@dataclass
class RolloutConfig:
    engine: str = "hf"  # hf | vllm
    num_workers: int = 1  # rollout actors, >= 1
    group_size: int = 4  # G episodes per task (one GRPO group), >= 2 for GRPO statistics
    max_new_tokens: int = 96  # per assistant turn
    max_prompt_tokens: int = 1536  # history is cut (oldest first) to fit; the task is never cut
    temperature: float = 1.0  # sampling temperature; the learner scores with the same one
    top_p: float = 1.0
    precision: str = "auto"  # engine weights: auto (bf16 where native, pipeline/core/hardware.py) | fp32 | bf16
    val_temperatures: list[float] = field(default_factory=lambda: [0.4, 0.0])
    num_cpus: float = 1.0  # Ray CPUs per rollout actor
    num_gpus: float = 0.0  # Ray GPUs per rollout actor (vLLM: tensor_parallel_size; < 1 when colocated)
    # One generate call takes every pending turn of every group in flight, up to these:
    max_batch: int = 64  # sequences per generate call, >= 1
    max_batch_tokens: int = 65536  # padded tokens (sequences x (longest prompt + max_new_tokens)) per call
    # ...after waiting up to this long for the turns of episodes whose env call is under way
    # (so that groups in lockstep share calls instead of alternating), >= 0
    batch_wait_s: float = 1.0
    env_workers: int = 4  # threads stepping thread-safe envs (others: one thread), >= 1
    env_timeout_s: float = 300.0  # an env reset / step slower than this fails its episode, > 0
    # A group slower than this means its worker hangs (a generate that never returns, a stopped
    # process): Ray kills and restarts the worker and the group is played again. 0 = never.
    group_timeout_s: float = 3600.0
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class LearnerConfig:
    num_learners: int = 1  # DeepSpeed data-parallel ranks
    zero_stage: int = 0  # 0-3
    precision: str = "auto"  # auto (bf16 where native, pipeline/core/hardware.py) | fp32 | bf16 (fp32 master weights)
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    lr_schedule: str = "constant"  # constant | cosine
    grad_clip: float = 1.0
    micro_batch_tokens: int = 4096  # token budget of one micro-batch (padded prompt + response)
    mini_batches: int = 1  # optimizer steps per training step (each over a slice of the groups)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 3.0  # dual-clip c for negative advantages (> 1)
    entropy_coef: float = 0.001  # methods may override per step (ADRS)
    kl_coef: float = 0.0  # k3 KL to the frozen initial policy; 0 = no reference model
    correction: str = "decoupled"  # off-policy correction: decoupled | tis | none
    behaviour_cap: float = 2.0  # truncation of the behaviour importance weight
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False  # ZeRO-2/3: optimizer state in CPU memory
    offload_params: bool = False  # ZeRO-3: parameters in CPU memory
    num_cpus: float = 1.0  # Ray CPUs per learner actor
    num_gpus: float = 0.0  # Ray GPUs per learner actor (1 on a GPU cluster; < 1 when colocated)
    # A training step, weight publish (object-store route) or checkpoint save or load with no answer
    # in this long stops the run with an error naming the call and who did not answer, instead of
    # hanging it. 0 = never.
    call_timeout_s: float = 3600.0


@dataclass
class ScorerConfig:
    """The teacher scorer actor (methods with a teacher: sdar, adrs, retire_opd, ...)."""

    precision: str = "auto"  # teacher weights: auto (bf16 where native) | fp32 | bf16
    num_gpus: float = 0.0  # Ray GPUs of the scorer actor (its model goes to cuda when > 0)
    micro_batch_tokens: int | None = None  # forward token budget; None = learner.micro_batch_tokens
    # A score call slower than this means the scorer hangs: Ray kills and restarts it and the
    # groups are scored again. 0 = never.
    timeout_s: float = 3600.0
    # The noise floor: every scored row is also scored with empty privileged context (the
    # student's own prompt) and the gap statistics of both are logged side by side (teacher/gap_*,
    # noise/gap_*), so a gate or a shaping is read against the numerics of the two engines.
    # Costs one more forward per scored row.
    noise_floor: bool = True


@dataclass
class TrainerConfig:
    total_steps: int = 20  # 0: evaluate the starting model only (val_at_start, final_val_splits)
    groups_per_step: int = 2  # complete groups per training step
    max_policy_lag: int = 0  # 0 = synchronous on-policy; k = groups up to k versions old are used
    val_every: int = 10  # 0 = never
    val_tasks: int = 8  # held-out tasks per validation
    val_at_start: bool = False  # validate once before the first step too (logged as step 0)
    # Splits validated once more after the last step, beside env.val_split, logged as
    # final/<split>/... (ALFWorld: [valid_unseen], floor plans never trained or validated on).
    final_val_splits: list[str] = field(default_factory=list)
    ckpt_every: int = 10  # 0 = only the final checkpoint
    keep_checkpoints: int = 2
    # Seconds from SIGTERM to SIGKILL that the run may count on (`ray job stop`'s
    # RAY_JOB_STOP_WAIT_TIME_S, a preemption notice): the step in progress is finished only if it
    # can still be checkpointed within them, else abandoned and the last completed step saved
    # (pipeline/orchestration/stopping.py). Validations are skipped once SIGTERM came.
    stop_grace_s: float = 30.0
    # Training steps in a row whose update was discarded for non-finite gradients that stop the
    # run, with a checkpoint and a message (0: never stop).
    max_skipped_steps: int = 3
    # Leave out of the learner's batch the rows whose advantage is 0 (all-fail and all-win GRPO
    # groups) when no aux term or reference KL reads them: the same gradient, less learner time
    # (orchestration/batches.py, drop_silent_rows). The entropy bonus then covers the kept rows.
    skip_zero_advantage_rows: bool = False
    seed: int = 0
    # A checkpoint dir (…/checkpoints/step_N), a run dir (its latest), or "auto": continue from the
    # newest complete checkpoint in trainer.run_dir if there is one, else start fresh (a job a
    # scheduler starts again after a preemption or a node loss).
    resume: str | None = None
    run_dir: str | None = None  # default: Hydra's output directory


@dataclass
class ClusterConfig:
    address: str | None = None  # None = start a local Ray; "auto" = join the running cluster
    num_cpus: int | None = None  # for a local Ray; None = all
    dashboard: bool = False
    threads_per_actor: int | None = None  # torch threads per actor; None = all cores at lag 0, else shared
    # Placement (pipeline/distributed/placement.py): none = let Ray place each actor; pack | spread = one
    # placement group with a bundle per actor; colocate = learners and rollout engines share bundles.
    placement: str = "none"  # none | pack | spread
    colocate: bool = False
    placement_timeout_s: float = 300.0  # wait this long for the placement group, then fail
    # Weight sync (pipeline/distributed/weight_sync.py): object_store = packets through Ray's object store (CPU
    # default); collective = bucketed broadcast from learner rank 0 over a torch.distributed group.
    weight_sync: str = "object_store"  # object_store | collective
    sync_backend: str = "auto"  # auto (nccl with CUDA, else gloo) | gloo | nccl
    sync_bucket_mb: int = 256  # bytes per broadcast bucket, in MiB
    sync_timeout_s: float = 600.0  # collective route: a member silent this long fails the sync
    # Restarts of each rollout worker and of the teacher scorer after its process dies (Ray's
    # max_restarts); the groups it was playing are replayed from their task seeds. 0: a death
    # stops the run (resume it from its last checkpoint).
    max_restarts: int = 3


@dataclass
class LoggerConfig:
    jsonl: bool = True
    wandb: bool = False
    wandb_mode: str = "offline"  # offline | online | disabled
    project: str = "privy-rl"
    progress: bool = True


@dataclass
class WarmStartConfig:
    """Behaviour cloning of the env's expert before RL (pipeline/orchestration/warm_start.py).

    The expert's episodes on train tasks 0..tasks-1 are rendered with the rollout's own prompt
    builder and cloned by the DeepSpeed learner (an NLL term); the result is an HF checkpoint
    cached under $PRIVY_CACHE/warm_start, keyed by every input, that the run starts from."""

    enabled: bool = False
    tasks: int = 32  # train-split tasks (seeds 0..tasks-1) whose expert episodes are cloned
    epochs: int = 2  # passes over the expert rows
    lr: float = 1.0e-4
    batch_rows: int = 8  # expert rows per optimizer step
    lr_schedule: str = "cosine"  # constant | cosine (over all warm-start steps)
    seed: int = 0  # shuffles the rows
    precision: str = "auto"  # of the cloning learner; auto = bf16 where native
    cache_dir: str | None = None  # where clones live; None = <model cache>/warm_start
    # Also clone each task as played by the expert that knows the env's privileged hint
    # (TextEnv.hinted_expert_response), the hint in its prompts at this placement (raw_prefix |
    # system | user, as the teacher's method.placement; None = no such episodes). A hints teacher
    # (method=sdar_hints) has something to distil only once the policy acts on a hint.
    hint_placement: str | None = None


@dataclass
class SweepConfig:
    """A Hydra multirun (``-m``): where it goes and what its summary ranks (pipeline/tools/sweep.py)."""

    # The sweep's directory is multirun/<name>; rerunning a command with the same name skips the
    # points that finished and resumes those with a checkpoint. The default is a fresh timestamp.
    name: str = "${now:%Y-%m-%d}/${now:%H-%M-%S}"
    metric: str = "val/success"  # the primary metric (its final value) of the summary and its plot
    goal: str = "max"  # max | min: which end of the metric is best
    aggregate: list[str] = field(default_factory=lambda: ["trainer.seed"])  # swept keys averaged over


@dataclass
class PrivyConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    method: dict[str, Any] = field(default_factory=lambda: {"name": "grpo"})
    experiment: str = ""  # free label of the recipe that set this config
    sweep: SweepConfig = field(default_factory=SweepConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="privy_schema", node=PrivyConfig)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: PrivyConfig) -> None:
    """Check every value and cross-field rule; raise ConfigError saying what to change."""
    r, lr, t = cfg.rollout, cfg.learner, cfg.trainer
    _require(r.engine in ("hf", "vllm"), f"rollout.engine={r.engine!r}: use hf or vllm")
    _require(r.num_workers >= 1, "rollout.num_workers must be >= 1")
    _require(r.group_size >= 1, "rollout.group_size must be >= 1")
    _require(r.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
    _require(r.max_prompt_tokens >= 64, "rollout.max_prompt_tokens must be >= 64")
    _require(
        r.temperature > 0,
        "rollout.temperature must be > 0 for training rollouts "
        "(log-probs of a greedy policy are not a sampling distribution)",
    )
    _require(0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]")
    for key, value in (
        ("rollout.precision", r.precision),
        ("learner.precision", lr.precision),
        ("scorer.precision", cfg.scorer.precision),
    ):
        _require(value in PRECISIONS, f"{key}={value!r}: use one of {', '.join(PRECISIONS)}")
    _require(
        cfg.scorer.micro_batch_tokens is None or cfg.scorer.micro_batch_tokens >= 64,
        "scorer.micro_batch_tokens must be >= 64 (or null: learner.micro_batch_tokens)",
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
    _require(lr.num_learners >= 1, "learner.num_learners must be >= 1")
    _require(lr.zero_stage in (0, 1, 2, 3), f"learner.zero_stage={lr.zero_stage}: use 0, 1, 2 or 3")
    _require(lr.lr > 0, f"learner.lr={lr.lr} must be > 0")
    _require(lr.weight_decay >= 0, f"learner.weight_decay={lr.weight_decay} must be >= 0")
    _require(lr.warmup_steps >= 0, f"learner.warmup_steps={lr.warmup_steps} must be >= 0")
    _require(lr.grad_clip >= 0, f"learner.grad_clip={lr.grad_clip} must be >= 0 (0 = no clipping)")
    _require(lr.lr_schedule in ("constant", "cosine"), "learner.lr_schedule: use constant or cosine")
    _require(len(lr.betas) == 2 and all(0 <= b < 1 for b in lr.betas), "learner.betas: two values in [0, 1)")
    _require(lr.micro_batch_tokens >= 64, "learner.micro_batch_tokens must be >= 64")
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
    _require(t.ckpt_every >= 0, f"trainer.ckpt_every={t.ckpt_every} must be >= 0 (0 = only the final checkpoint)")
    _require(t.keep_checkpoints >= 1, f"trainer.keep_checkpoints={t.keep_checkpoints} must be >= 1")
    _require(
        t.resume != "auto" or bool(t.run_dir),
        "trainer.resume=auto needs trainer.run_dir: a fixed directory the job finds again when it is started "
        "again (the default run dir is a new timestamp each time)",
    )
    _require(t.stop_grace_s > 0, f"trainer.stop_grace_s={t.stop_grace_s} must be > 0 (seconds from SIGTERM to SIGKILL)")
    _require(
        t.val_tasks >= 1 or not (t.val_every or t.val_at_start or t.final_val_splits),
        "trainer.val_tasks must be >= 1 when validating",
    )
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
    for key, value in (
        ("rollout.num_gpus", r.num_gpus),
        ("learner.num_gpus", lr.num_gpus),
        ("scorer.num_gpus", cfg.scorer.num_gpus),
        ("rollout.num_cpus", r.num_cpus),
        ("learner.num_cpus", lr.num_cpus),
    ):
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
    c = cfg.cluster
    _require(c.placement in ("none", "pack", "spread"), f"cluster.placement={c.placement!r}: none | pack | spread")
    _require(not c.colocate or c.placement != "none", "cluster.colocate=true needs cluster.placement=pack or spread")
    _require(c.placement_timeout_s > 0, "cluster.placement_timeout_s must be > 0")
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
        cfg.logger.wandb_mode in ("offline", "online", "disabled"), "logger.wandb_mode: offline | online | disabled"
    )
    _require(
        isinstance(cfg.method, dict) and "name" in cfg.method,
        "method must name a method: method=grpo (see conf/method/)",
    )
    validate_sweep(cfg.sweep)
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
