"""The typed configuration's schema: one dataclass per section of ``conf/config.yaml``, each
field with its default and a comment saying what it does. Checked by ``pipeline.core.config``
(``validate``), which also re-exports every class here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"  # smollm2_135m | gemma3_270m | tiny | tiny_bytes | any label when `path` is set
    path: str | None = None  # an HF causal-LM directory; overrides `name`
    cache_dir: str | None = None  # where converted models live (default $PRIVY_CACHE or ~/.cache/privy-rl)
    # Chat template for a tokenizer that has none (base models) or to replace its own: a named
    # template (chatml | llama3 | qwen2 | gemma, pipeline/core/chat_templates.py) or a Jinja file path.
    chat_template: str | None = None


PROMPT_FORMATS = ("template", "chat")  # env.prompt_format


@dataclass
class EnvConfig:
    name: str = "alfworld"  # a registered env (envs/__init__.py)
    history_length: int = 2  # earlier (observation, action) pairs shown in the prompt, >= 0
    # template: each turn re-renders the task and the last history_length turns (the papers');
    # chat: the conversation grows by turns, token in, token out (pipeline/context/student_prompts.py)
    prompt_format: str = "template"
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
    # Continuous batching (actors/continuous_batcher.py): each turn joins the running batch at the
    # engine's next step; false = one generate call at a time (actors/turn_batcher.py).
    continuous: bool = False


@dataclass
class RolloutConfig:
    engine: str = "hf"  # hf | vllm
    num_workers: int = 1  # rollout actors, >= 1
    # A worker lost for good (its node gone, no node with room): the run goes on while at least
    # this many remain, and takes the worker back when Ray can place it again (a node joins).
    # null = num_workers: the run waits for a lost worker (up to 900 s), then stops with a checkpoint.
    min_workers: int | None = None
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
    # Each row its own micro-batch, cut to its length: no padding, and no attention mask, so
    # attention runs SDPA's causal kernel, which keeps no [T, T] matrix per head (a SmolLM2 step on
    # CPU: docs/performance.md). false: rows right-padded into micro-batches of micro_batch_tokens
    # (many short rows on a GPU). The loss and its gradient are the same either way.
    unpadded: bool = True
    # With unpadded: rows that share a prefix (a group's first prompt, the template, episodes that
    # acted alike) go through one forward for the prefix, their micro-batch holding at most
    # shared_tokens tokens so counted (pipeline/algorithm/shared_prefix.py); 0: one row each.
    shared_tokens: int = 1024
    micro_batch_tokens: int = 4096  # with unpadded=false: token budget of one micro-batch (padded prompt + response)
    mini_batches: int = 1  # optimizer steps per training step (each over a slice of the groups)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 3.0  # dual-clip c for negative advantages (> 1)
    entropy_coef: float = 0.001  # methods may override per step (ADRS)
    kl_coef: float = 0.0  # k3 KL to the frozen initial policy; 0 = no reference model
    correction: str = "decoupled"  # off-policy correction: decoupled | tis | none
    behaviour_cap: float = 2.0  # truncation of the behaviour importance weight
    # each decoder layer recomputed in backward: with shared_tokens, layer by layer on the kept KV
    # caches (pipeline/algorithm/layer_checkpoint.py, Llama decoders); else HF's own
    gradient_checkpointing: bool = False
    # > 0: the LM head, its float32 log-softmax and entropy over at most this many response tokens
    # at a time, each chunk recomputed in backward (one chunk's [tokens, vocab] tensors at once)
    head_chunk_tokens: int = 0
    # > 0: DeepSpeed's bf16 update (ZeRO-0) converts and steps the gradients this many MB of fp32
    # at a time instead of all at once (actors/learner_setup.py chunk_the_bf16_step); the same update
    optimizer_chunk_mb: float = 0.0
    # torch's fused AdamW: one pass over each element, 8x faster than the loop (false) at 135M
    # parameters, which allocates two fp32 copies of the master weights at every update
    fused_optimizer: bool = True
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
    """The teacher scorer (methods with a teacher: sdar, adrs, retire_opd, ...)."""

    # Where the teacher's forward runs: actor = an actor of its own holding a copy of the teacher
    # (synced like a rollout worker for a self-teacher); engine = a self-teacher scored by the
    # rollout workers' own engines (HF), which hold the policy already: no actor, no extra copy,
    # no extra sync. precision and num_gpus are the actor's; on the engine route the rollout's.
    placement: str = "actor"
    # The actor's forward: hf = a no-grad HF forward; vllm = prompt_logprobs on a vLLM engine of
    # the actor's own (rollout.vllm's settings; temperature 1 only): a frozen teacher (RetireOPD's
    # phase 2, OPD from a checkpoint) served as on an inference server, never sent weights.
    engine: str = "hf"
    precision: str = "auto"  # teacher weights: auto (bf16 where native) | fp32 | bf16
    num_gpus: float = 0.0  # Ray GPUs of the scorer actor (its model goes to cuda when > 0)
    # Ray CPUs of the scorer actor. 0 (the default): it reserves none and shares a node with the
    # others (it works while the learner waits for it); > 0 reserves them, so that with a node of
    # its own it is placed there (and, lost with that node, placed again where they are free).
    num_cpus: float = 0.0
    # None: each row its own forward, unpadded (SDPA's causal kernel, as learner.unpadded); a number:
    # rows right-padded into forwards of this many tokens
    micro_batch_tokens: int | None = None
    # A score call slower than this means the scorer hangs: Ray kills and restarts it and the
    # groups are scored again. 0 = never.
    timeout_s: float = 3600.0
    # The noise floor: every scored row is also scored with empty privileged context (the
    # student's own prompt) and the gap statistics of both are logged side by side (teacher/gap_*,
    # noise/gap_*), so a gate or a shaping is read against the numerics of the two engines.
    # Costs one more forward per scored row.
    noise_floor: bool = True
    # The first step with scored rows stops the run, before any update, when that floor (mean
    # |lpT - lp| on the student's own prompt) exceeds this fraction of the signal (the same with
    # the privileged context). null: never refuse. Needs noise_floor.
    max_noise_ratio: float | None = 1.0


@dataclass
class TrainerConfig:
    total_steps: int = 20  # 0: evaluate the starting model only (val_at_start, final_val_splits)
    groups_per_step: int = 2  # complete groups per training step
    max_policy_lag: int = 0  # 0 = synchronous on-policy; k = groups up to k versions old are used
    val_every: int = 10  # 0 = never
    val_tasks: int = 8  # held-out tasks per validation
    val_at_start: bool = False  # validate once before the first step too (logged as step 0)
    # When a method with a teacher plays the validation tasks once more with its privileged context
    # (val/privilege_gap): "every" validation and final split, or "ends": the validations at step 0
    # and at the last step only, never the final splits. A privileged play costs a plain one or
    # more (longer prompts: with Search-QA's skills, SDAR's step-0 validation took over 3.5x
    # GRPO's). A method whose schedule reads SR_T at every validation (a retirement rule whose
    # teacher learns) gets it at every validation either way.
    privileged_val: str = "every"
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
    # Wall seconds from the start of the run (this process): the first step that ends past them
    # is the last one, and is validated, evaluated on final_val_splits and checkpointed as step
    # total_steps would have been (logged trainer/time_limited = 1). A scheduler's time limit, or
    # methods compared at equal time (scripts/bench/learning.py --time-budget-s). null: none.
    time_limit_s: float | None = None
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
    # The actors' malloc (pipeline/core/runtime_env.py): jemalloc = the one Ray ships, preloaded (glibc's
    # kept each step's freed activations: a learner climbed 2 GB over 16 steps; docs/results/learner_rss_growth);
    # system = the C library's own
    allocator: str = "jemalloc"
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
    # system | user | user_front, as the teacher's method.placement; None = no such episodes). A hints teacher
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
