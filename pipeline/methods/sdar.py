"""``sdar``: GRPO plus gated self-distillation towards the skill-conditioned self (SDAR, seed 001;
official code ``ZJU-REAL/SDAR`` ``verl/trainer/ppo/sdar_utils.py``).

Teacher: the policy itself at the scorer's synced weights (``source=self``), with retrieved skills
in its prompt (``context=skills``, placement ``raw_prefix`` by default, as the released code). The
scorer fills ``TurnRecord.teacher_logprobs`` (lpT) for every row. Per token::

    g      = sg(sigmoid(beta * (lpT - lp)))         (lp: the learner's current log-probs)
    L_SDAR = token_mean(g * (lpT - lp))            (kind gated_surrogate, in pipeline.algorithm.losses)
    L      = L_PPO + lam * L_SDAR  (+ entropy, + the learner's KL to reference if learner.kl_coef > 0)

Credit: GRPO row advantages broadcast to tokens; aux ``teacher_logprobs`` = lpT;
``AuxTerm(name="sdar", kind="gated_surrogate", coef=lam, params={"beta": beta})``. The gate is
computed inside the loss from the learner's current log-probs (the learner passes the term's
params through without knowing what they mean), so it follows the policy exactly as in the
official code, not the rollout engine's (possibly bf16) behaviour log-probs.

Defaults are the released scripts' beta = 5, lam = 0.01 (paper text: beta = 10, lam = 0.1:
``method.beta=10 method.lam=0.1``). The scripts also use a k3 KL to the reference
(``learner.kl_coef``, not a method option). Credit metrics (over all tokens of the step, with
the gate actually applied, reported by the loss): ``sdar/gate_mean``, ``sdar/gate_active_ratio``
(g > 0.5), ``sdar/teacher_gap_mean`` (lpT - lp), ``sdar/negative_gap_fraction`` (lpT < lp).

The baselines ``opsd`` (policy_loss_coef 0) and ``grpo_opsd`` (beta = 0, g = 0.5) are
configurations of this class in ``baselines.py``.
"""
from __future__ import annotations

import dataclasses
import math

from pipeline.orchestration.batches import Credit
from pipeline.methods.base import TeacherSpec, register_method
from pipeline.methods.common import SkillFields, check_types, require, teacher_rows
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.core.types import AuxTerm, EpisodeGroup


@register_method
class SDAR(GRPO):
    name = "sdar"
    aux_name = "sdar"  # metric prefix of the aux term (the learner's sdar/loss, ...)
    policy_loss_coef = 1.0

    @dataclasses.dataclass
    class Options(SkillFields, GRPO.Options):
        name: str = "sdar"
        beta: float = 5.0  # gate sharpness; 0 = constant gate 0.5 (grpo_opsd)
        lam: float = 0.01  # coefficient of the SDAR term, >= 0

        def validate(self) -> None:
            check_types(self)
            require(math.isfinite(self.beta) and self.beta >= 0.0,
                    f"method={self.name}: method.beta={self.beta} must be a finite number >= 0")
            require(self.lam >= 0.0, f"method={self.name}: method.lam={self.lam} must be >= 0")
            self.validate_skills(self.name)

    def teacher_spec(self) -> TeacherSpec:
        return TeacherSpec(source="self", context="skills", placement=self.opts.placement)

    def skills_for_teacher(self) -> dict:
        """Retrieval options of the teacher prompt's skills (the student sees none)."""
        return self.opts.skill_retrieval()

    def gate_beta(self) -> float:
        return self.opts.beta

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        adv = self.row_advantages(groups).advantages
        metrics = {"adv/mean": float(adv.mean()), "adv/abs_mean": float(adv.abs().mean())}
        return Credit(
            advantages=broadcast(groups, adv.tolist()),
            aux={"teacher_logprobs": teacher_rows(groups, self.name)},
            aux_terms=[AuxTerm(name=self.aux_name, kind="gated_surrogate", coef=self.opts.lam,
                               params={"beta": float(self.gate_beta())})],
            policy_loss_coef=self.policy_loss_coef,
            metrics=metrics,
        )
