"""``signal: entropy_gate``: a distillation term that trusts the teacher where the context made it sure.

The teacher's entropy at each response position, ``H_t = -sum_v q_t(v) log q_t(v)`` over its
whole distribution under the privileged prompt (at the rollout temperature), is a channel the
scorer computes beside lpT (``TeacherNeeds.channels``: the HF forward, on the scorer actor or the
rollout engine). The term of a sampled ``estimator`` (``sampled_surrogate`` or ``k3_is``,
``pipeline.algorithm.aux_losses``) is weighed per token by::

    w_t = sigmoid(-sharpness * (H_t - h0))          (data: no gradient flows through it)
    L   = L_RL + lam * token_mean(w * l_t)

so that tokens where the teacher is confident (``H_t < h0`` nats) teach more than those where it
is unsure. With ``sharpness = 0`` every weight is 0.5: the plain estimator at half its ``lam``.
It is ours, not a paper's: the example of a signal that needs teacher data the pipeline did not
compute before (docs/extending.md), and one config away from any context or select part.
Metrics: ``<prefix>/teacher_entropy_mean``, ``<prefix>/entropy_gate_mean`` (over the tokens
the term touches), and the estimator's own.
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.algorithm.aux_losses import LOSSES
from pipeline.core.types import AuxTerm, TeacherChannel, TeacherNeeds
from pipeline.methods.options import require
from pipeline.methods.parts.signal import Signal


def teacher_entropy(log_q):
    """``H_t`` from the teacher's log-softmax at a row's response positions ``[n, V]`` -> ``[n]``."""
    return -(log_q.exp() * log_q).sum(-1)


ENTROPY = TeacherChannel("entropy", teacher_entropy)
SAMPLED = tuple(k for k, s in LOSSES.items() if s.estimator and not s.needs_logits)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class EntropyGate(Signal, kind="entropy_gate"):
    """A sampled estimator weighed per token by how sure the teacher is (its entropy)."""

    @dataclasses.dataclass
    class Options:
        estimator: str = "k3_is"  # a sampled estimator: sampled_surrogate | k3_is
        lam: float = 0.1  # coefficient of the term, >= 0
        h0: float = 2.0  # the teacher entropy (nats) where a token weighs 0.5
        sharpness: float = 2.0  # how fast the weight falls with the entropy, >= 0

        def validate(self, method: str) -> None:
            require(
                self.estimator in SAMPLED,
                f"method={method}: method.estimator={self.estimator!r}; choose one of {list(SAMPLED)}",
            )
            require(self.lam >= 0.0, f"method={method}: method.lam={self.lam} must be >= 0")
            # an entropy is >= 0 nats: a threshold below it would weigh every token under one half
            require(math.isfinite(self.h0) and self.h0 >= 0.0, f"method={method}: method.h0={self.h0} must be >= 0")
            require(self.sharpness >= 0.0, f"method={method}: method.sharpness={self.sharpness} must be >= 0")

    def coef(self) -> float:
        return self.opts.lam

    def teacher_needs(self) -> TeacherNeeds:
        return TeacherNeeds(channels=(ENTROPY,), asked_by=f"signal {self.kind}")

    def apply(self, job) -> None:
        o, prefix = self.opts, self.setting.prefix
        if job.scale <= 0.0:
            return
        teacher, masks = job.teacher_logprobs()
        entropy = job.teacher_channel(ENTROPY.name)
        weights = [[_sigmoid(-o.sharpness * (h - o.h0)) for h in row] for row in entropy]
        if masks is not None:
            weights = [[w * m for w, m in zip(ws, ms)] for ws, ms in zip(weights, masks)]
        touched = [(h, w) for hs, ws in zip(entropy, weights) for h, w in zip(hs, ws) if w > 0]
        job.credit.metrics[f"{prefix}/teacher_entropy_mean"] = sum(h for h, _ in touched) / max(len(touched), 1)
        job.credit.metrics[f"{prefix}/entropy_gate_mean"] = sum(w for _, w in touched) / max(len(touched), 1)
        if not touched:
            return
        job.credit.distill.teacher_logprobs, job.credit.distill.distill_mask = teacher, weights
        job.credit.aux_terms = [AuxTerm(name=prefix, kind=o.estimator, coef=o.lam * job.scale)]
