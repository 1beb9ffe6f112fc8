"""Where a learner rank's memory goes, logged every step as ``learner/memory/*`` (GB).

The tensors a DeepSpeed engine holds, each storage counted once: the module's parameters and
their gradients, the torch optimizer's state (Adam's two moments), and DeepSpeed's own buffers
(the bf16 optimizer's fp32 master copy and gradient accumulators, ZeRO's flat partitions). What the
process holds beyond them at its peak (``rss_peak``, the largest resident size it ever had) is the
step's transient memory: activations saved for backward, the logits at the response positions,
allocator slack, and the Python and library overhead a process has anyway (``rss_start``: before
the first step, with the model loaded). Resident size also counts the shared pages the process has
touched (``rss_shmem``): under ``cluster.weight_sync=object_store`` the weight packets it wrote
into Ray's object store, a packet a step until the store reuses its space (0.33 GB each for
SmolLM2-135M in bf16); they are the store's memory, counted once for the node.
"""

from __future__ import annotations

import resource

import torch

GB = 1e9


def _tensors(obj, depth: int = 0):
    """The tensors in an attribute value: a tensor, or lists / tuples / dicts of them."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth + 1)


def rss_peak_gb() -> float:
    """The largest resident size this process has had (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def status_gb(field: str) -> float | None:
    """A size field of this process's ``/proc/self/status`` now (``RssAnon``, ``RssShmem``,
    ``VmRSS``...), in GB; None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return None


def memory_breakdown(engine) -> dict[str, float]:
    """GB by kind of tensor the engine holds (see the module docstring)."""
    seen: set[int] = set()

    def size(tensors) -> float:
        total = 0
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if t.device.type == "meta" or key in seen or key == 0:
                continue
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return total / GB

    module = engine.module
    out = {"parameters": size(module.parameters())}
    out["gradients"] = size(p.grad for p in module.parameters() if p.grad is not None)
    wrapper = engine.optimizer
    inner = getattr(wrapper, "optimizer", wrapper)  # DeepSpeed's wrappers hold the torch optimizer
    out["optimizer"] = size(t for state in getattr(inner, "state", {}).values() for t in _tensors(state))
    out["deepspeed"] = size(t for name, value in vars(wrapper).items() if name != "optimizer" for t in _tensors(value))
    out["rss_peak"] = rss_peak_gb()
    shmem = status_gb("RssShmem")  # the shared pages resident now
    if shmem is not None:
        out["rss_shmem"] = shmem
    return out
