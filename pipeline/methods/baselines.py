"""The distillation baselines of the SDAR code base, as thin configurations.

All three use the self-teacher with retrieved skills (``source=self``, ``context=skills``,
placement ``raw_prefix`` by default), scored on every row.

- ``opsd``: the SDAR term alone, ``L = lam * token_mean(g * (lpT - lp))`` with
  ``g = sg(sigmoid(beta * (lpT - lp)))`` from the current log-probs (as SDAR's code); no RL loss (``policy_loss_coef = 0``; GRPO
  advantages are still computed and logged, the learner multiplies the policy loss by 0).
  Entropy bonus as configured in the learner. Options as ``sdar`` (beta 5, lam 0.01).
- ``grpo_opsd``: GRPO + the SDAR term with beta = 0, i.e. a constant gate g = 0.5 (no ``beta``
  option; use ``method=sdar method.beta=0`` for the same thing under SDAR's name). lam 0.01.
- ``skill_sd``: GRPO + lam * the K3-IS loss of ``pipeline.algorithm.losses.k3_is`` (``l = lp - lpT``,
  ``k3 = exp(min(-l, 20)) - 1 + l``, ``rho = exp(min(lp - lp_prox, 10))``, ``token_mean(rho * k3)``)
  against the self-teacher; lam = 0.001.

The gated terms keep SDAR's metric prefix ``sdar/`` (they are the SDAR term); ``skill_sd``
logs under ``skill_sd/``. The gate is computed in the loss from the learner's current log-probs.
"""
from __future__ import annotations

import dataclasses

from pipeline.orchestration.batches import Credit
from pipeline.methods.base import TeacherSpec, register_method
from pipeline.methods.common import SkillFields, check_types, require, teacher_rows
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.methods.sdar import SDAR
from pipeline.core.types import AuxTerm, EpisodeGroup


@register_method
class OPSD(SDAR):
    name = "opsd"
    policy_loss_coef = 0.0

    @dataclasses.dataclass
    class Options(SDAR.Options):
        name: str = "opsd"


@register_method
class GrpoOPSD(SDAR):
    name = "grpo_opsd"

    @dataclasses.dataclass
    class Options(SkillFields, GRPO.Options):
        name: str = "grpo_opsd"
        lam: float = 0.01  # coefficient of the constant-gate SDAR term, >= 0

        def validate(self) -> None:
            check_types(self)
            require(self.lam >= 0.0, f"method=grpo_opsd: method.lam={self.lam} must be >= 0")
            self.validate_skills("grpo_opsd")

    def gate_beta(self) -> float:
        return 0.0


@register_method
class SkillSD(GRPO):
    name = "skill_sd"

    @dataclasses.dataclass
    class Options(SkillFields, GRPO.Options):
        name: str = "skill_sd"
        lam: float = 0.001  # coefficient of the K3-IS term, >= 0

        def validate(self) -> None:
            check_types(self)
            require(self.lam >= 0.0, f"method=skill_sd: method.lam={self.lam} must be >= 0")
            self.validate_skills("skill_sd")

    def teacher_spec(self) -> TeacherSpec:
        return TeacherSpec(source="self", context="skills", placement=self.opts.placement)

    def skills_for_teacher(self) -> dict:
        return self.opts.skill_retrieval()

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        adv = self.row_advantages(groups).advantages
        return Credit(
            advantages=broadcast(groups, adv.tolist()),
            aux={"teacher_logprobs": teacher_rows(groups, self.name)},
            aux_terms=[AuxTerm(name="skill_sd", kind="k3_is", coef=self.opts.lam)],
            metrics={"adv/mean": float(adv.mean()), "adv/abs_mean": float(adv.abs().mean())},
        )
