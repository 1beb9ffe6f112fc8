"""``signal`` parts: how the teacher's log-probs enter training.

- ``none``: they do not (the advantages alone).
- ``aux``: an auxiliary loss term ``lam * scale * L`` the learner adds (``pipeline.algorithm.aux_losses``),
  one ``AuxTerm(name=<prefix>)``:

  * ``estimator: sampled_surrogate``: ``token_mean(w * (lpT - lp))`` on the sampled tokens (SDAR);
  * ``estimator: k3_is``: ``token_mean(w * rho * k3)``, ``rho = exp(lp - lp_prox)`` (RetireOPD's OPD,
    Skill-SD; targeted guidance "sampled");
  * ``estimator: full_kl``: the exact reverse KL over the vocabulary to a learner-side teacher
    forward with the current weights on the privileged prompt (targeted guidance "full"; needs
    ``teacher: self``; no scorer).
  * ``estimator: topk_rkl``: the reverse KL on the student's support, ``sum_{v in S_t} p(v) (log
    p(v) - log q(v))`` over the student's ``topk`` most likely tokens S_t, with the teacher's
    log-probs at S_t from the scorer (actor or rollout engine, HF): no learner-side teacher
    forward (needs ``teacher: self``: the same weights on the plain prompt give S_t).

  ``weight: gate`` makes ``w = sg(sigmoid(beta * (lpT - lp)))`` (SDAR's gate, computed in the loss
  from the current log-probs; ``beta = 0`` is the constant 0.5 of grpo_opsd); ``weight: none``
  makes ``w = 1``. ``pg_coef`` scales the policy loss (OPSD: 0). With ``select: failed_turns``
  the term carries a ``distill_mask``; a step with no selected token carries no term.
- ``null`` (a control, no teacher): the null baseline of "Does OPD Really Distill?" (arXiv
  2608.31046): in place of a teacher's per-token signal, a fixed negative advantage
  ``-lam * scale * gap`` on every sampled token, i.e. ``A_t = A_row - lam * gap``. Whatever a
  teacher method gains over GRPO that this also gains is not the teacher's information.
- ``imitate`` (a control, no teacher): the equal-information baseline. Each training group also
  gets the env's hinted expert's episode on the same task (``TextEnv.hinted_expert_response``: the
  expert told what a hints teacher is told), under the student's own prompts, without the hint;
  its rows join the batch as demonstrations (``EpisodeGroup.demonstrations``: outside the group's
  statistics and the policy term) and the step adds ``lam * scale * NLL`` per demonstration token
  (``AuxTerm(kind="nll")`` over a ``distill_mask`` of those rows, its coefficient rescaled so that
  the term is the mean over demonstration tokens, not over every token of the batch). So "distil
  from a teacher told the answer" can be set beside "be shown the answer".
- ``shaping`` (ADRS): per-token advantages ``A_t = A_row + clip(eta * scale * Z_t, -c_g, c_g)``
  from centred teacher scores and the TVA gate (``pipeline.algorithm.adrs.adrs_advantages``);
  ``level: L2`` on a ``grpo`` advantage (unit = row), ``L3`` on ``gigpo`` (unit = anchor step).
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.algorithm.adrs import adrs_advantages
from pipeline.algorithm.aux_losses import ESTIMATORS, LOSSES
from pipeline.core.types import AuxTerm, TeacherNeeds
from pipeline.methods.options import require
from pipeline.methods.parts.base import Part

WEIGHTS = ("none", "gate")


class Signal(Part, slot="signal"):
    """What the method asks of any signal part (the defaults are "no signal")."""

    needs_teacher = True  # False: a control, trained without a teacher
    learner_side = False  # True: the learner runs the teacher forward (no scorer)
    support_k = 0  # > 0: the scorer also scores the teacher on the student's top-k (topk_rkl)

    def teacher_needs(self) -> TeacherNeeds:
        """What this signal needs the scorer to compute beside the sampled tokens' log-probs."""
        return TeacherNeeds(support_k=self.support_k, asked_by=f"signal {self.kind}")

    def coef(self) -> float:
        """The signal's strength (0: off, the teacher is never asked)."""
        return 0.0

    def apply(self, job) -> None:
        """Add the signal to ``job.credit`` (``job``: a ``pipeline.methods.method.CreditJob``)."""

    def check(self, advantage: Part, teacher: Part) -> None:
        """Raise when the method's other parts cannot carry this signal."""
        require(
            not self.needs_teacher or teacher.present,
            f"method={self.setting.method}: signal {self.kind} needs a teacher (parts.teacher=self or frozen)",
        )


class NoSignal(Signal, kind="none"):
    """The teacher does not enter training: the advantages alone."""

    needs_teacher = False


class AuxLoss(Signal, kind="aux"):
    """An auxiliary loss term of one estimator (SDAR, RetireOPD, targeted guidance)."""

    @dataclasses.dataclass
    class Options:
        estimator: str = "sampled_surrogate"  # sampled_surrogate | k3_is | full_kl | topk_rkl
        topk: int = 64  # topk_rkl: the size of the student's support S_t (docs/results/topk_kl)
        lam: float = 0.01  # coefficient of the term, >= 0
        weight: str = "none"  # none | gate (SDAR's sigmoid gate)
        beta: float = 5.0  # gate sharpness (weight: gate); 0 = constant gate 0.5
        pg_coef: float = 1.0  # policy-loss coefficient (OPSD: 0 = the distillation term alone)

        def validate(self, method: str) -> None:
            require(
                self.estimator in ESTIMATORS,
                f"method={method}: method.estimator={self.estimator!r}; choose one of {list(ESTIMATORS)}",
            )
            require(self.lam >= 0.0, f"method={method}: method.lam={self.lam} must be >= 0")
            require(
                self.weight in WEIGHTS, f"method={method}: method.weight={self.weight!r}; choose one of {list(WEIGHTS)}"
            )
            require(
                math.isfinite(self.beta) and self.beta >= 0.0,
                f"method={method}: method.beta={self.beta} must be a finite number >= 0",
            )
            require(self.pg_coef >= 0.0, f"method={method}: method.pg_coef={self.pg_coef} must be >= 0")
            require(
                not (self.weight == "gate" and not LOSSES[self.estimator].gated),
                f"method={method}: method.weight=gate is for the gated estimators "
                f"{[k for k in ESTIMATORS if LOSSES[k].gated]}; {self.estimator} takes no gate",
            )
            require(self.topk >= 1, f"method={method}: method.topk={self.topk} must be >= 1")

    @property
    def learner_side(self) -> bool:
        return LOSSES[self.opts.estimator].teacher_forward

    @property
    def support_k(self) -> int:
        """The size of the student's support the scorer must score the teacher on (topk_rkl), else 0."""
        return self.opts.topk if LOSSES[self.opts.estimator].teacher_support else 0

    def coef(self) -> float:
        return self.opts.lam

    def teacher_needs(self) -> TeacherNeeds:
        return TeacherNeeds(support_k=self.support_k, asked_by=f"method.estimator={self.opts.estimator}")

    def check(self, advantage: Part, teacher: Part) -> None:
        require(
            not self.support_k or teacher.follows_policy,
            f"method={self.setting.method}: estimator topk_rkl takes the student's support from the "
            "teacher's weights on the plain prompt: it needs parts.teacher=self",
        )
        require(
            not self.learner_side or teacher.follows_policy,
            f"method={self.setting.method}: estimator full_kl runs the teacher in the learner with "
            "the current weights: it needs parts.teacher=self",
        )
        super().check(advantage, teacher)

    def apply(self, job) -> None:
        o, credit = self.opts, job.credit
        credit.policy_loss_coef = o.pg_coef
        if job.scale <= 0.0:
            return  # off this step: no term, no teacher needed
        beta = float(o.beta) if o.weight == "gate" else None
        term = AuxTerm(name=self.setting.prefix, kind=o.estimator, coef=o.lam * job.scale, gate_beta=beta)
        d = credit.distill
        if self.learner_side:
            masks = job.token_masks()
            if not any(any(m) for m in masks):
                return
            d.distill_mask = masks
            credit.teacher_prompt_ids = job.teacher_prompts()
        else:
            teacher, masks = job.teacher_logprobs()
            if masks is not None:
                if not any(any(m) for m in masks):
                    return
                d.distill_mask = masks
            d.teacher_logprobs = teacher
            if self.support_k:
                d.topk_ids, d.topk_teacher_logprobs = job.teacher_support(self.support_k)
        credit.aux_terms = [term]


class NullAdvantage(Signal, kind="null"):
    """The null baseline: a fixed negative per-token advantage in place of the teacher gap."""

    needs_teacher = False

    @dataclasses.dataclass
    class Options:
        lam: float = 0.1  # as the compared teacher method's lam
        gap: float = 1.0  # the fixed per-token "teacher gap" it stands for (> 0: a negative advantage)

        def validate(self, method: str) -> None:
            require(self.lam >= 0.0, f"method={method}: method.lam={self.lam} must be >= 0")
            require(math.isfinite(self.gap) and self.gap > 0.0, f"method={method}: method.gap={self.gap} must be > 0")

    def coef(self) -> float:
        return self.opts.lam

    def apply(self, job) -> None:
        shift = self.opts.lam * self.opts.gap * job.scale
        job.credit.metrics[f"{self.setting.prefix}/advantage_shift"] = -shift
        if shift > 0.0:
            job.credit.advantages = [[a - shift for a in row] for row in job.credit.advantages]


class Imitate(Signal, kind="imitate"):
    """The equal-information control: NLL on the hinted expert's demonstrations."""

    needs_teacher = False
    demonstrations = True  # the controller asks the rollout workers for the hinted expert's episode

    @dataclasses.dataclass
    class Options:
        lam: float = 0.1  # coefficient of the per-token NLL of the demonstrations, >= 0

        def validate(self, method: str) -> None:
            require(self.lam >= 0.0, f"method={method}: method.lam={self.lam} must be >= 0")

    def coef(self) -> float:
        return self.opts.lam

    def apply(self, job) -> None:
        credit = job.credit
        policy = credit.distill.policy_mask or []  # the learner's rows: 1 = the policy's, 0 = demonstrations
        mask = [[1.0 - x for x in row] for row in policy]
        n_demo, n_all = sum(map(sum, mask)), sum(map(len, mask))
        credit.metrics[f"{self.setting.prefix}/demo_token_fraction"] = n_demo / max(n_all, 1)
        if job.scale <= 0.0 or n_demo == 0:
            return
        credit.distill.distill_mask = mask
        # the nll term is a token sum over the batch's tokens: rescaled, it is lam x the mean NLL
        # per demonstration token (exact at learner.mini_batches=1; per step otherwise)
        credit.aux_terms = [
            AuxTerm(name=self.setting.prefix, kind="nll", coef=self.opts.lam * job.scale * n_all / n_demo)
        ]


LEVELS = ("L2", "L3")
TVA_APPLY = ("paper", "after_whitening")
STD_MODES = ("per_seq", "global")


class Shaping(Signal, kind="shaping"):
    """The teacher shapes the advantages (ADRS's TVA) instead of adding a loss."""

    UNIT_OF_LEVEL = {"L2": ("row", "grpo"), "L3": ("anchor", "gigpo")}  # shaped unit, the advantage that has it

    @dataclasses.dataclass
    class Options:
        level: str = "L2"  # L2 on a grpo advantage (unit = row) | L3 on gigpo (unit = anchor step)
        tva_apply: str = "paper"  # paper (gate inside the whitening) | after_whitening
        std_mode: str = "per_seq"  # centring std of qhat: per_seq (scripts) | global (code default)
        tau: float = 2.0  # gate sharpness m = sigmoid(tau * TVA), >= 0
        T: float = 1.0  # TVA alignment temperature alpha = sigmoid((lbar - mean) / T), > 0
        clip: float | None = 0.2  # shaping clip c (scaled per group if adaptive_clip); null = no clip
        adaptive_clip: bool = True
        eta: float = 0.02  # shaping coefficient while the schedule is on, >= 0

        def validate(self, method: str) -> None:
            require(self.level in LEVELS, f"method={method}: method.level={self.level!r}; choose one of {list(LEVELS)}")
            require(
                self.tva_apply in TVA_APPLY,
                f"method={method}: method.tva_apply={self.tva_apply!r}; choose one of {list(TVA_APPLY)}",
            )
            require(
                self.std_mode in STD_MODES,
                f"method={method}: method.std_mode={self.std_mode!r}; choose one of {list(STD_MODES)}",
            )
            require(self.tau >= 0.0, f"method={method}: method.tau={self.tau} must be >= 0")
            require(self.T > 0.0, f"method={method}: method.T={self.T} must be > 0")
            require(
                self.clip is None or self.clip > 0.0,
                f"method={method}: method.clip={self.clip} must be > 0, or null for no clip",
            )
            require(self.eta >= 0.0, f"method={method}: method.eta={self.eta} must be >= 0")

    def coef(self) -> float:
        return self.opts.eta

    def check(self, advantage: Part, teacher: Part) -> None:
        unit, kind = self.UNIT_OF_LEVEL[self.opts.level]
        require(
            advantage.unit == unit,
            f"method={self.setting.method}: method.level={self.opts.level} shapes a {kind} "
            f"advantage; set method.parts.advantage={kind}",
        )
        super().check(advantage, teacher)

    def apply(self, job) -> None:
        o = self.opts
        eta_s = o.eta * job.scale
        job.credit.metrics[f"{self.setting.prefix}/eta_s"] = eta_s
        if eta_s <= 0.0:
            return
        teacher, _ = job.teacher_logprobs()
        per_token, m = adrs_advantages(
            job.rows,
            teacher,
            job.base,
            eta_s=eta_s,
            level=o.level,
            tva_apply=o.tva_apply,
            std_mode=o.std_mode,
            temperature=o.T,
            tau=o.tau,
            clip=o.clip,
            adaptive_clip=o.adaptive_clip,
            invalid_penalty=self.setting.invalid_action_penalty,
            gamma=job.step_options.gamma,
            similarity_threshold=job.step_options.similarity_threshold,
        )
        job.credit.advantages = [t.tolist() for t in per_token]
        job.credit.metrics.update(m)


__all__ = ["Signal"]
