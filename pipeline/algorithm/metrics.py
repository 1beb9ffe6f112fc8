"""Step metrics with their reduction, so that combining them never depends on their names.

Every metric a loss or the learner reports is a ``Stat``: a value and how it combines.

- ``MEAN``: a token mean. Inside a mini-batch every micro-batch reports its masked *sum* over the
  mini-batch's global token count, so micro-batches add up; mini-batches combine weighted by
  their token counts; data-parallel ranks (each normalised by the global count times the world
  size) average.
- ``MAX`` / ``MIN``: extrema (-inf / +inf where a micro-batch had no token).
- ``SUM``: counts (tokens), added everywhere.
- ``FIRST``: already global (lr, the grad norm after DeepSpeed's all-reduce): rank 0's.

Values stay detached 0-d tensors until the learner reports them (no host sync per micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor


class Reduce(StrEnum):
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    FIRST = "first"


@dataclass(slots=True)
class Stat:
    value: Tensor | float
    reduce: Reduce = Reduce.MEAN


Metrics = dict[str, Stat]


def mean(x: Tensor) -> Stat:
    return Stat(x.detach(), Reduce.MEAN)


def maximum(x: Tensor) -> Stat:
    return Stat(x.detach(), Reduce.MAX)


def minimum(x: Tensor) -> Stat:
    return Stat(x.detach(), Reduce.MIN)


def _join(a, b, op: Reduce):
    if op is Reduce.MAX:
        return torch.maximum(a, b) if isinstance(a, Tensor) else max(a, b)
    if op is Reduce.MIN:
        return torch.minimum(a, b) if isinstance(a, Tensor) else min(a, b)
    if op is Reduce.FIRST:
        return a
    return a + b  # MEAN (sums of token-normalised parts) and SUM


def reduce_micro_batches(per_micro_batch: list[Metrics]) -> Metrics:
    """The metrics of one mini-batch from those of its micro-batches."""
    out: Metrics = {}
    for metrics in per_micro_batch:
        for key, stat in metrics.items():
            out[key] = Stat(_join(out[key].value, stat.value, stat.reduce), stat.reduce) if key in out else stat
    return out


def to_report(metrics: Metrics) -> dict[str, tuple[float, str]]:
    """Plain floats with their reduction, as a learner rank returns them."""
    return {k: (float(s.value), str(s.reduce)) for k, s in metrics.items()}


def combine(
    parts: list[dict[str, tuple[float, str]]], weights: list[float] | None = None
) -> dict[str, tuple[float, str]]:
    """Reports of mini-batches (``weights`` = their token counts) or of ranks (equal weights)."""
    weights = [1.0] * len(parts) if weights is None else [float(w) for w in weights]
    out: dict[str, tuple[float, str]] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        have = [(p[key][0], w) for p, w in zip(parts, weights) if key in p]
        op = Reduce(next(p[key][1] for p in parts if key in p))
        vals = [v for v, _ in have]
        if op is Reduce.MAX:
            value = max(vals)
        elif op is Reduce.MIN:
            value = min(vals)
        elif op is Reduce.SUM:
            value = sum(vals)
        elif op is Reduce.FIRST:
            value = vals[0]
        else:
            total = sum(w for _, w in have)
            value = sum(v * w for v, w in have) / total if total > 0 else sum(vals) / len(vals)
        out[key] = (value, str(op))
    return out


def values(report: dict[str, tuple[float, str]]) -> dict[str, float]:
    return {k: v for k, (v, _) in report.items()}


__all__ = [
    "Metrics",
    "Reduce",
    "Stat",
    "combine",
    "maximum",
    "mean",
    "minimum",
    "reduce_micro_batches",
    "to_report",
    "values",
]
