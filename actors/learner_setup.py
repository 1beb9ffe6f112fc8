"""What a learner rank is set up with: the DeepSpeed config for our own micro-batching, the lr
schedule, DeepSpeed's process group on a store the ranks meet at, and the tokenizer files a
checkpoint's HF model carries."""

from __future__ import annotations

import math
import os
from functools import partial
from pathlib import Path

import torch

from pipeline.core.config import LearnerConfig


def ds_config(cfg: LearnerConfig, dtype: str) -> dict:
    """The DeepSpeed config for our own micro-batching (batch sizes are nominal); ``dtype`` is
    the resolved ``learner.precision`` (bf16 = bf16 compute with fp32 master weights)."""
    conf = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        conf["bf16"] = {"enabled": True}
    # ZeRO-Offload: optimizer state (ZeRO >= 1) and parameters (ZeRO-3) in pinned CPU memory.
    if cfg.offload_optimizer:
        conf["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cfg.offload_params:
        conf["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    return conf


def make_optimizer(cfg: LearnerConfig, params) -> torch.optim.Optimizer:
    """AdamW over ``params``: torch's fused kernel by default (``learner.fused_optimizer``), else
    the per-tensor loop; with ZeRO-Offload, DeepSpeed's CPU Adam (DeepSpeed refuses a client torch
    optimizer there; JIT-built once, about 30 s), the same AdamW update."""
    if cfg.offload_optimizer:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(
            params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, adamw_mode=True
        )
    # foreach=False: what torch picks on a CPU anyway, said so that the loop is the same everywhere
    impl = {"fused": True} if cfg.fused_optimizer else {"foreach": False}
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **impl)


def lr_lambda(cfg: LearnerConfig, total_steps: int):
    """The lr multiplier of optimizer step ``k`` (the scheduler steps once per mini-batch).

    ``warmup_steps`` and ``total_steps`` count training steps, each of ``learner.mini_batches``
    optimizer steps, so the schedule runs over ``total_steps * mini_batches`` optimizer steps:
    linear warmup over the first ``warmup_steps * mini_batches``, then constant or cosine to 0 at
    the last one.
    """
    per_step = cfg.mini_batches
    warmup, total = cfg.warmup_steps * per_step, total_steps * per_step

    def f(k: int) -> float:
        if warmup and k < warmup:
            return (k + 1) / warmup
        if cfg.lr_schedule == "cosine":
            span = max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (k - warmup) / span)))
        return 1.0

    return f


def copy_tokenizer(model_path: str, out: Path) -> None:
    import shutil

    for name in os.listdir(model_path):
        if name.startswith("tokenizer") or name in (
            "chat_template.jinja",
            "special_tokens_map.json",
            "generation_config.json",
        ):
            shutil.copy2(os.path.join(model_path, name), out / name)


def init_process_group_env(rank: int, world_size: int, master_addr: str, store) -> None:
    """Form DeepSpeed's process group on ``store`` (rank 0 hosts it, ``rendezvous.host_store``;
    the others joined it). Runs in the Ray shell, never in ``LearnerWorker.__init__``."""
    import deepspeed
    from deepspeed.constants import default_pg_timeout

    # DeepSpeed and its CPU shared-memory collectives still read these.
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(store.port),
        }
    )
    cuda = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    if cuda:
        # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU(s): its device is always local 0.
        torch.cuda.set_device(0)
    backend = "nccl" if cuda else "gloo"
    torch.distributed.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=default_pg_timeout
    )
    if not cuda:
        clear_stale_build_lock(_extension_dir("deepspeed_shm_comm"))
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # adopts the group


# DeepSpeed's CPU collectives JIT-build an op the first time, under torch's FileBaton lock; a
# process killed mid-build leaves the lock behind and every later learner waits on it forever
# (seen here: a machine restarted during a test run hung the next one's learner setup). The
# build takes about a minute on 2 cores, so a lock this much older has no builder left.
STALE_LOCK_S = 600.0


def _extension_dir(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def clear_stale_build_lock(build_dir: Path, *, max_age_s: float = STALE_LOCK_S, now: float | None = None) -> bool:
    """Remove ``build_dir/lock`` when it is older than ``max_age_s`` (saying so); True if removed."""
    import time

    lock = Path(build_dir) / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    print(f"privy-rl: removing {lock}, left {age:.0f} s ago by a build that never finished", flush=True)
    lock.unlink(missing_ok=True)
    return True


def chunk_the_bf16_step(optimizer, chunk_mb: float) -> bool:
    """``learner.optimizer_chunk_mb``: DeepSpeed's bf16 update of a torch optimizer
    (``FP16_UnfusedOptimizer``, bf16 at ZeRO-0) converts every gradient to fp32 at once, beside the
    bf16 ones, then steps: 0.54 GB of fp32 gradients for SmolLM2-135M, the checkpointed learner's
    peak (docs/results/learner_phases). In chunks of at most ``chunk_mb`` MB of fp32 gradients,
    each chunk's are converted, stepped and dropped (its bf16 ones with them) before the next: the
    same update (AdamW is per element; the clipping scale is computed from the whole norm first).
    Returns whether the optimizer was chunked (False: another wrapper, or ``chunk_mb`` 0)."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if chunk_mb <= 0 or not isinstance(optimizer, FP16_UnfusedOptimizer) or optimizer.fused_lamb_legacy:
        return False
    optimizer.step = partial(_chunked_step, optimizer, int(chunk_mb * 2**20))
    optimizer.chunked_steps = 0
    return True


def _chunked_step(opt, chunk_bytes: int, closure=None) -> bool:
    """``FP16_UnfusedOptimizer.step`` of DeepSpeed 0.19.8 (its non-LAMB path), the conversion and
    the update done chunk by chunk."""
    from deepspeed.moe.utils import split_params_grads_into_shared_and_expert_params
    from deepspeed.runtime.utils import get_global_norm, get_weight_norm, is_invalid_grad_norm

    opt.overflow = opt.overflow_checker.check()
    if opt.overflow:
        return opt._skip_invalid_grad_norm()
    norms = []
    for group in opt.fp16_groups:
        grads_for_norm, _ = split_params_grads_into_shared_and_expert_params(group)
        norms.append(get_weight_norm(grads_for_norm, mpu=opt.mpu) if len(grads_for_norm) > 0 else 0.0)
    opt._global_grad_norm = get_global_norm(norm_list=norms)
    if is_invalid_grad_norm(opt._global_grad_norm):
        return opt._skip_invalid_grad_norm()
    opt._update_scale(False)
    scale = opt.unscale_and_clip_grads(opt._global_grad_norm, apply_scale=False)
    for fp32_group, fp16_group in zip(opt.fp32_groups, opt.fp16_groups):
        pairs = list(zip(fp32_group, fp16_group))
        start = 0
        while start < len(pairs):
            end, size = start, 0
            while end < len(pairs) and (end == start or size + pairs[end][0].numel() * 4 <= chunk_bytes):
                size += pairs[end][0].numel() * 4
                end += 1
            chunk = pairs[start:end]
            for fp32, fp16 in chunk:
                grad = fp16.grad
                fp32.grad = torch.zeros_like(fp32) if grad is None else grad.to(fp32.dtype)
                fp16.grad = None  # read: the bf16 gradient is not needed again this step
                fp32.grad.mul_(1.0 / scale)
            opt.optimizer.step()  # AdamW steps the parameters that have a gradient: this chunk's
            for fp32, fp16 in chunk:
                fp32.grad = None
                fp16.data.copy_(fp32.data)
            start = end
    opt.chunked_steps += 1
    return opt.overflow
