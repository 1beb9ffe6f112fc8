"""``adrs``: advantage shaping from self-distilled teacher scores (ADRS, seed 004; official code
``gitrxh/ADRS-arxiv`` ``verl/trainer/ppo/adrs_utils.py``). No distillation loss.

Teacher: the policy at the scorer's synced weights with retrieved skills (``source=self``,
``context=skills``, placement ``raw_prefix`` as SDAR). Credit per token (all formulas in
``pipeline.algorithm.advantages.adrs_advantages``)::

    qhat = (lpT - mean_t lpT) / (std + 1e-8)           std per row (per_seq) or batch (global)
    alpha_u = sigmoid((lbar_u - mean lbar) / T),  TVA_g,  m = sigmoid(tau * TVA_g)
    A_t = A_row + clip(eta_s * Z_t, -c_g, c_g),  Z = whiten_g(m * qhat)  (tva_apply: paper)
                                                 Z = m * whiten_g(qhat)  (tva_apply: after_whitening)

on a GRPO base (``level: L2``, unit = row, R = row score) or a GiGPO base (``level: L3``, unit =
anchor step, R = discounted step return, gamma / step_weight / similarity_threshold as ``gigpo``),
with the adaptive clip ``c_g = clip * min(strength_g / median strength, 1)`` (strength = std_g,
GiGPO: max|A|). With ``tva_apply: paper`` at L2 the gate is constant in a group and cancels in the
whitening (the paper-as-coded behaviour); ``after_whitening`` or L3 make it act.

Schedule over the 1-based training step ``n = step + 1`` (the controller passes completed steps,
0-based; metrics are logged at n): ``eta_s = eta`` (0.02) for ``warmup_steps < n <=
warmup_steps + active_steps`` (steps 21-70), else 0; ``entropy_coef`` 0.01 while shaping,
0.001 otherwise (set on every step's Credit). ``teacher_active`` is True only while eta_s > 0, so
the teacher forward runs only then; outside it the advantages are the base method's.

Deviations (see ``pipeline/algorithm/advantages.py``): ``eta_r`` is not an option (it cancels in the
whitening); the alpha centring uses the mean of the row means at both levels.
Metrics: ``adrs/tva_mean``, ``adrs/gate_mean``, ``adrs/shaping_abs_mean``, ``adrs/clip_fraction``,
``adrs/shaped_group_fraction`` while shaping; ``adrs/eta_s`` and ``adrs/entropy_coef`` every step.
"""
from __future__ import annotations

import dataclasses

from pipeline.algorithm.advantages import adrs_advantages, adrs_schedule, gigpo_advantages, grpo_advantages, rows_from_groups
from pipeline.orchestration.batches import Credit
from pipeline.methods.base import TeacherSpec, register_method
from pipeline.methods.common import SkillFields, check_types, require, teacher_rows
from pipeline.methods.gigpo import GigpoFields
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.core.types import EpisodeGroup

LEVELS = ("L2", "L3")
TVA_APPLY = ("paper", "after_whitening")
STD_MODES = ("per_seq", "global")


@register_method
class ADRS(GRPO):
    name = "adrs"

    @dataclasses.dataclass
    class Options(SkillFields, GigpoFields, GRPO.Options):
        name: str = "adrs"
        level: str = "L2"  # L2 = GRPO base, unit = row; L3 = GiGPO base, unit = anchor step
        tva_apply: str = "paper"  # paper (gate inside the whitening) | after_whitening
        std_mode: str = "per_seq"  # centring std of qhat: per_seq (scripts) | global (code default)
        tau: float = 2.0  # gate sharpness m = sigmoid(tau * TVA), >= 0
        T: float = 1.0  # TVA alignment temperature alpha = sigmoid((lbar - mean) / T), > 0
        clip: float | None = 0.2  # shaping clip c (scaled per group if adaptive_clip); null = no clip
        adaptive_clip: bool = True
        eta: float = 0.02  # shaping coefficient eta_s while active, >= 0
        warmup_steps: int = 20  # shaping starts after this many steps
        active_steps: int | None = 50  # ... and lasts this many (null = to the end)
        entropy_coef_active: float = 0.01  # entropy bonus while shaping
        entropy_coef_idle: float = 0.001  # entropy bonus otherwise

        def validate(self) -> None:
            check_types(self)
            require(self.level in LEVELS, f"method=adrs: method.level={self.level!r}; choose one of {list(LEVELS)}")
            require(self.tva_apply in TVA_APPLY,
                    f"method=adrs: method.tva_apply={self.tva_apply!r}; choose one of {list(TVA_APPLY)}")
            require(self.std_mode in STD_MODES,
                    f"method=adrs: method.std_mode={self.std_mode!r}; choose one of {list(STD_MODES)}")
            require(self.tau >= 0.0, f"method=adrs: method.tau={self.tau} must be >= 0")
            require(self.T > 0.0, f"method=adrs: method.T={self.T} must be > 0")
            require(self.clip is None or self.clip > 0.0,
                    f"method=adrs: method.clip={self.clip} must be > 0, or null for no clip")
            require(self.eta >= 0.0, f"method=adrs: method.eta={self.eta} must be >= 0")
            require(self.warmup_steps >= 0, f"method=adrs: method.warmup_steps={self.warmup_steps} must be >= 0")
            require(self.active_steps is None or self.active_steps >= 1,
                    f"method=adrs: method.active_steps={self.active_steps} must be >= 1, or null for no end")
            require(self.entropy_coef_active >= 0.0 and self.entropy_coef_idle >= 0.0,
                    "method=adrs: method.entropy_coef_active and method.entropy_coef_idle must be >= 0")
            self.validate_gigpo("adrs")
            self.validate_skills("adrs")

    def teacher_spec(self) -> TeacherSpec:
        return TeacherSpec(source="self", context="skills", placement=self.opts.placement)

    def skills_for_teacher(self) -> dict:
        return self.opts.skill_retrieval()

    def schedule(self, step: int):
        """Shaping coefficient and entropy coefficient of the training step after ``step`` completed ones."""
        o = self.opts
        return adrs_schedule(step + 1, eta=o.eta, warmup_steps=o.warmup_steps, active_steps=o.active_steps,
                             entropy_coef_active=o.entropy_coef_active, entropy_coef_idle=o.entropy_coef_idle)

    def teacher_active(self, step: int) -> bool:
        return self.schedule(step).eta_s > 0.0

    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        o = self.opts
        rows = rows_from_groups(groups)
        common = dict(invalid_penalty=self.invalid_action_penalty,
                      mean_std_across_rows=o.mean_std_across_rows, norm_std=o.norm_std)
        if o.level == "L3":
            base = gigpo_advantages(rows, gamma=o.gamma, step_weight=o.step_weight,
                                    similarity_threshold=o.similarity_threshold, **common)
        else:
            base = grpo_advantages(rows, **common)
        sched = self.schedule(step)
        metrics = {"adrs/eta_s": sched.eta_s, "adrs/entropy_coef": sched.entropy_coef, **base.metrics}
        if sched.eta_s > 0.0:
            per_token, m = adrs_advantages(
                rows, teacher_rows(groups, self.name), base, eta_s=sched.eta_s, level=o.level,
                tva_apply=o.tva_apply, std_mode=o.std_mode, temperature=o.T, tau=o.tau, clip=o.clip,
                adaptive_clip=o.adaptive_clip, invalid_penalty=self.invalid_action_penalty, gamma=o.gamma,
                similarity_threshold=o.similarity_threshold)
            advantages = [t.tolist() for t in per_token]
            metrics.update(m)
        else:
            advantages = broadcast(groups, base.advantages.tolist())
        a = base.advantages
        metrics.update({"adv/mean": float(a.mean()), "adv/abs_mean": float(a.abs().mean())})
        return Credit(advantages=advantages, entropy_coef=sched.entropy_coef, metrics=metrics)
