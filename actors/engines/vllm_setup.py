"""What the vLLM engine needs before vLLM itself: dtype names, the CPU cores of each tensor-parallel
part, the checkpoint's tensor shapes (read from the safetensors headers). No vLLM import: the
main venv's tests run these."""

from __future__ import annotations

import os
from pathlib import Path

DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}


def cpu_bind(parts: int) -> str:
    """This process's allowed CPUs split into ``parts`` contiguous ranges, vLLM-CPU's
    ``VLLM_CPU_OMP_THREADS_BIND`` syntax: ``"0-3|4-7"``."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < parts:
        raise ValueError(f"tensor_parallel_size={parts} on CPU needs >= {parts} cores, this process has {len(cpus)}")
    size = len(cpus) // parts
    groups = [cpus[i * size : (i + 1) * size] for i in range(parts)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def checkpoint_shapes(model_path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the checkpoint, read from the safetensors headers only."""
    from safetensors import safe_open

    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path} has no *.safetensors file (vLLM loads safetensors)")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shapes[k] = tuple(h.get_slice(k).get_shape())
    return shapes
