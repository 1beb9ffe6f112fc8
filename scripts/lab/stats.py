"""Intervals for learning results (what a headline number and a method claim carry).

A run's test success is one number per training seed; the seeds are the replicates. So:

- ``mean_interval(values)``: the mean over seeds with its 95% Student-t interval
  (``scipy.stats.ttest_1samp(...).confidence_interval``). At 3-6 seeds a percentile bootstrap over
  seeds has only 10-462 distinct resamples and covers too little; the t interval is the textbook
  one for so few replicates, and wider.
- ``paired_interval(a, b)``: the mean of the per-seed differences ``a_s - b_s`` (the same seed,
  hence the same training tasks and sampling stream, for both) with its 95% paired-t interval
  (``scipy.stats.ttest_rel``) and p-value. This is the interval a method claim is judged by.
- ``task_bootstrap_interval(a, b)``: the same mean difference resampled over the evaluation
  *tasks* (``scipy.stats.bootstrap``, BCa, on the per-task difference averaged over seeds): how
  much the claim depends on which held-out tasks happened to be drawn. It does not replace the
  seed interval (a seed that learns fast moves every task at once); both are reported.

Inputs are plain lists; nothing here reads files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None  # None: one replicate, no interval
    high: float | None
    n: int
    p_value: float | None = None  # paired differences: two-sided t-test of mean 0

    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)

    def clipped(self, low: float, high: float) -> "Interval":
        """The interval cut to the range the quantity can take (a success rate's t interval can
        reach past 1 when the seeds are close to it)."""
        if self.low is None:
            return self
        return Interval(self.mean, max(self.low, low), min(self.high, high), self.n, self.p_value)

    def text(self, digits: int = 3) -> str:
        if self.low is None:
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def mean_interval(values: list[float]) -> Interval:
    """Mean over replicates with the 95% t interval (a zero spread gives a zero-width interval)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_interval: no values")
    if x.size == 1:
        return Interval(float(x[0]), None, None, 1)
    if np.all(x == x[0]):
        return Interval(float(x[0]), float(x[0]), float(x[0]), int(x.size))
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(CONFIDENCE)
    return Interval(float(x.mean()), _finite(ci.low), _finite(ci.high), int(x.size))


def paired_interval(a: list[float], b: list[float]) -> Interval:
    """Mean of ``a_s - b_s`` over paired replicates, 95% paired-t interval and p-value."""
    from scipy import stats

    if len(a) != len(b) or not a:
        raise ValueError(f"paired_interval: {len(a)} and {len(b)} values; pairs needed")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size == 1:
        return Interval(float(d[0]), None, None, 1)
    if np.all(d == d[0]):
        return Interval(float(d[0]), float(d[0]), float(d[0]), int(d.size), 1.0 if d[0] == 0 else 0.0)
    res = stats.ttest_rel(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    ci = res.confidence_interval(CONFIDENCE)
    return Interval(float(d.mean()), _finite(ci.low), _finite(ci.high), int(d.size), float(res.pvalue))


def task_bootstrap_interval(
    a: list[list[float]], b: list[list[float]], *, seed: int = 0, n_resamples: int = 10_000
) -> Interval:
    """``a[s][t]``, ``b[s][t]``: outcome of task t at seed s. The mean paired difference, with a 95%
    BCa bootstrap interval over tasks of the per-task difference averaged over seeds."""
    from scipy import stats

    A, B = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if A.shape != B.shape or A.ndim != 2 or A.shape[1] < 2:
        raise ValueError(
            f"task_bootstrap_interval: outcome matrices {A.shape} and {B.shape}; "
            "[seeds][tasks] of one shape, >= 2 tasks"
        )
    per_task = (A - B).mean(axis=0)
    if np.all(per_task == per_task[0]):
        m = float(per_task[0])
        return Interval(m, m, m, int(per_task.size))
    res = stats.bootstrap(
        (per_task,),
        np.mean,
        confidence_level=CONFIDENCE,
        n_resamples=n_resamples,
        method="BCa",
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Interval(float(per_task.mean()), _finite(ci.low), _finite(ci.high), int(per_task.size))
