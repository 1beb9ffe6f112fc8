"""The process environment every process of a run needs, defined once.

``set_process_env()`` is called by the CLI, by ``run_training`` and by the test session before
Ray, DeepSpeed or wandb are imported; the same values go to every Ray actor through the run's
runtime env. Users can still override any of them in their environment (only unset ones are set).
"""

from __future__ import annotations

import os
from pathlib import Path


def runtime_env_defaults() -> dict[str, str]:
    out = {
        "RAY_AUTH_MODE": "disabled",  # Ray 2.60 turns token auth on by default
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",  # no hub: models come from the cache (pipeline.models)
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "TOKENIZERS_PARALLELISM": "false",  # tokenizers threads would fight the actors' torch threads
        "RAY_DEDUP_LOGS": "0",
        # glibc gives every thread that allocates its own malloc arena; a rollout worker plays each
        # group in a thread of its own, and its memory grew 0.25 MB per step over 1000 steps with
        # the default (flat with 2: docs/reliability.md, scripts/bench/memory.py).
        "MALLOC_ARENA_MAX": "2",
    }
    # DS_ACCELERATOR=cpu only where this process sees no CUDA (CPU machines, CI): it spares
    # DeepSpeed's accelerator probing there; forced on a CUDA machine it would put every learner
    # on the CPU. Learner actors that ask for GPUs get DS_ACCELERATOR=cuda from the run assembly,
    # whatever the driver has (a CPU-only head driving GPU workers).
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            out["DS_ACCELERATOR"] = "cpu"
    return out


KEYS = (
    "RAY_AUTH_MODE",
    "WANDB_MODE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS",
    "TOKENIZERS_PARALLELISM",
    "RAY_DEDUP_LOGS",
    "MALLOC_ARENA_MAX",
    "DS_ACCELERATOR",
)


def allocator_env(allocator: str) -> dict[str, str]:
    """The environment that gives a new process ``cluster.allocator``: for ``jemalloc``, the
    jemalloc Ray ships with its wheel (``ray/core/libjemalloc.so``, what its own object store
    runs on) in ``LD_PRELOAD``, so no system package is needed; nothing where Ray has none (a
    source build, macOS) or for ``system``. An actor's torch frees a step's activations in many
    sizes; glibc's malloc keeps most of them (a learner's private memory climbed from 5.1 to 7.7 GB
    over 16 steps with 1.9 GB of tensors held), jemalloc returns them."""
    if allocator != "jemalloc":
        return {}
    import ray

    lib = Path(ray.__file__).parent / "core" / "libjemalloc.so"
    if not lib.exists():
        return {}
    preload = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p]  # what the user preloads stays
    return {"LD_PRELOAD": ":".join(preload if str(lib) in preload else [str(lib), *preload])}


def set_process_env() -> dict[str, str]:
    """Set the unset defaults in this process; returns the values in effect (for the actors)."""
    for k, v in runtime_env_defaults().items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in KEYS if k in os.environ}
