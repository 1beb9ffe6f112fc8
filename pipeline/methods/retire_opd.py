"""``retire_opd``: on-policy distillation from a frozen skill-trained teacher, with adaptive
retirement (RetireOPD, seed 002; official code ``ZJU-REAL/SDAR`` ``verl/trainer/ppo/retire_opd.py``).

Two phases, one command:

1. ``prerequisite(method_dict)`` returns the phase-1 method dict when ``teacher_path`` is unset:
   ``skill_grpo`` with this method's skill retrieval options and placement (default ``user``:
   ``"[Privileged Skill Information]\\n{skills}\\n\\n{obs}"``), same base model, ``phase1_steps``
   (150) steps (``prerequisite_steps``). The launcher trains it, measures its validation success
   rate *with* skills on phase 2's validation protocol, writes ``teacher.json`` next to the HF
   weights (``write_teacher_meta``), and calls ``adopt_prerequisite(hf_dir, success_rate)``.
2. Phase 2 (this class): the student sees no skills; the scorer runs the frozen teacher
   (``source=frozen``, ``frozen_path``) with the skills in the *same* format it was trained with
   (placement ``user``; the official code scores with a raw prefix instead, a mismatch we do not
   copy), filling ``teacher_logprobs`` on every row.

Credit while the teacher is active: GRPO row advantages broadcast to tokens, aux
``teacher_logprobs`` and ``AuxTerm(name="opd", kind="k3_is", coef=lam)``::

    l = lp - lpT,  k3 = exp(min(-l, 20)) - 1 + l,  rho = exp(min(lp - lp_prox, 10))  (not detached)
    L = L_PPO + lam * token_mean(rho * k3)          lam = 0.01, no KL to reference

and, after the learner's step, ``K_n = token_mean(lp_prox - lpT)`` (the learner's ``opd/alignment``:
its own log-probs before the update, never the engine's) recorded into
``pipeline.algorithm.retirement.RetirementController``
(windows of W = 5 steps; at each window end the validation success rate closes the window;
retire at the first m >= 2 with ``rho_m >= delta`` and ``eta_m >= gamma``). Once retired,
``teacher_active`` is False (no teacher forward), credit is plain GRPO, lam is 0 for good.

Steps: the controller passes the 0-based number of completed steps; K_n is recorded under the
training step's 1-based number ``step + 1``, which is also the step its metrics are logged at, so
``opd/retire_step`` is the step whose validation retired the teacher.

Validation cadence: the controller validates every ``trainer.val_every`` steps. Windows close on
validation, so ``trainer.val_every`` must equal W (``required_val_every()``; a divisor of W also
works, the validations between window ends are then ignored here). Otherwise the step after a full
window raises, saying so.

SR_T: ``teacher_success_rate``; None = read ``teacher.json`` (``{"success_rate": ...}``) from
``teacher_path``, as written at the end of phase 1 (the official code takes SR_T by hand).
``state_dict`` carries the teacher path, SR_T and the controller (pending K's, previous window,
retired flag and step), so a resumed run stays retired.

Metrics: ``opd/K``, ``opd/Kbar``, ``opd/rho``, ``opd/eta``, ``opd/retired``, ``opd/retire_step``
(from the controller), plus the learner's ``opd/loss``, ``opd/k3_mean``, ``opd/rho_mean``.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from pipeline.orchestration.batches import Credit
from pipeline.methods.base import TeacherSpec, parse_options, register_method
from pipeline.methods.common import SkillFields, check_types, require, teacher_rows
from pipeline.methods.grpo import GRPO, broadcast
from pipeline.algorithm.retirement import RetirementController
from pipeline.core.types import AuxTerm, EpisodeGroup

TEACHER_META = "teacher.json"  # next to the phase-1 teacher's HF weights


def write_teacher_meta(hf_dir: str | Path, success_rate: float, **extra) -> Path:
    """Store SR_T (and anything else worth keeping, e.g. the phase-1 method dict) with the teacher."""
    path = Path(hf_dir) / TEACHER_META
    path.write_text(json.dumps({"success_rate": float(success_rate), **extra}, indent=1))
    return path


def read_teacher_success_rate(hf_dir: str | Path) -> float:
    path = Path(hf_dir) / TEACHER_META
    if not path.exists():
        raise ValueError(f"method=retire_opd: method.teacher_success_rate is null and {path} does not exist; "
                         "set method.teacher_success_rate=<SR_T> or point method.teacher_path at a phase-1 "
                         "teacher exported by the two-phase command")
    return float(json.loads(path.read_text())["success_rate"])


@register_method
class RetireOPD(GRPO):
    name = "retire_opd"

    @dataclasses.dataclass
    class Options(SkillFields, GRPO.Options):
        name: str = "retire_opd"
        placement: str = "user"  # the teacher's skills placement, same as its skill_grpo training
        lam: float = 0.01  # OPD coefficient while the teacher is active, >= 0
        gamma: float = 0.9  # retire when eta_m >= gamma (success-rate ratio to the teacher), > 0
        delta: float = 0.0  # ... and rho_m >= delta (relative change of the window-mean K)
        window: int = 5  # W, steps per window; trainer.val_every must equal it
        teacher_path: str | None = None  # HF dir of the frozen teacher; None = train it first (phase 1)
        teacher_success_rate: float | None = None  # SR_T in [0, 1]; None = read from the phase-1 run
        phase1_steps: int = 150  # skill_grpo steps of phase 1 when teacher_path is None

        def validate(self) -> None:
            check_types(self)
            require(self.lam >= 0.0, f"method=retire_opd: method.lam={self.lam} must be >= 0")
            require(math.isfinite(self.gamma) and self.gamma > 0.0,
                    f"method=retire_opd: method.gamma={self.gamma} must be > 0 (paper range 0.80-0.96)")
            require(math.isfinite(self.delta),
                    f"method=retire_opd: method.delta={self.delta} must be finite (paper range -0.10-0.04)")
            require(self.window >= 1, f"method=retire_opd: method.window={self.window} must be >= 1")
            sr = self.teacher_success_rate
            require(sr is None or 0.0 <= sr <= 1.0,
                    f"method=retire_opd: method.teacher_success_rate={sr} must be in [0, 1] or null")
            require(self.phase1_steps >= 1,
                    f"method=retire_opd: method.phase1_steps={self.phase1_steps} must be >= 1")
            require(self.teacher_path is None or bool(str(self.teacher_path)),
                    "method=retire_opd: method.teacher_path is empty; use null to train the teacher first")
            self.validate_skills("retire_opd")

    def __init__(self, options, *, total_steps: int, invalid_action_penalty: float):
        super().__init__(options, total_steps=total_steps, invalid_action_penalty=invalid_action_penalty)
        self.teacher_path: str | None = options.teacher_path
        sr = options.teacher_success_rate
        if sr is None and self.teacher_path is not None:
            sr = read_teacher_success_rate(self.teacher_path)
        self.teacher_success_rate: float | None = sr
        self.controller: RetirementController | None = None if sr is None else self._new_controller(sr)

    def _new_controller(self, sr: float) -> RetirementController:
        o = self.opts
        return RetirementController(teacher_success_rate=sr, window=o.window, delta=o.delta, gamma=o.gamma)

    # ----- two-phase command -----------------------------------------------------------------------
    @classmethod
    def prerequisite(cls, method_dict: dict) -> dict | None:
        """The phase-1 method dict (``skill_grpo`` with the same retrieval options and placement)
        when ``teacher_path`` is unset, else None."""
        opts = parse_options(cls, dict(method_dict))
        if opts.teacher_path is not None:
            return None
        return {"name": "skill_grpo", "mean_std_across_rows": opts.mean_std_across_rows,
                "norm_std": opts.norm_std, "skill_bank": opts.skill_bank, "skill_mode": opts.skill_mode,
                "skill_top_k": opts.skill_top_k, "placement": opts.placement}

    @classmethod
    def prerequisite_steps(cls, method_dict: dict) -> int:
        """Training steps of phase 1 (``method.phase1_steps``)."""
        return parse_options(cls, dict(method_dict)).phase1_steps

    def adopt_prerequisite(self, hf_dir: str, success_rate: float) -> None:
        """Use the phase-1 model at ``hf_dir`` as the frozen teacher, with SR_T = ``success_rate``."""
        if not 0.0 <= success_rate <= 1.0:
            raise ValueError(f"retire_opd: the teacher's success rate must be in [0, 1], got {success_rate}")
        write_teacher_meta(hf_dir, success_rate)
        self.teacher_path = str(hf_dir)
        self.teacher_success_rate = float(success_rate)
        self.controller = self._new_controller(self.teacher_success_rate)

    @classmethod
    def finished_prerequisite(cls, hf_dir) -> float | None:
        """SR_T from ``teacher.json``, which ``adopt_prerequisite`` writes when phase 1 has finished."""
        return read_teacher_success_rate(hf_dir) if (Path(hf_dir) / TEACHER_META).exists() else None

    def required_val_every(self) -> int:
        """``trainer.val_every`` this method needs: windows close on validation."""
        return self.opts.window

    # ----- upstream --------------------------------------------------------------------------------
    def teacher_spec(self) -> TeacherSpec:
        return TeacherSpec(source="frozen", context="skills", placement=self.opts.placement,
                           frozen_path=self.teacher_path)

    def skills_for_teacher(self) -> dict:
        return self.opts.skill_retrieval()

    def _ready(self) -> RetirementController:
        if self.teacher_path is None or self.controller is None:
            raise RuntimeError("method=retire_opd has no teacher: set method.teacher_path=<phase-1 HF dir> "
                               "(with method.teacher_success_rate or its teacher.json), or launch with the "
                               "two-phase command, which trains the teacher with skill_grpo first")
        return self.controller

    @property
    def retired(self) -> bool:
        return self.controller is not None and self.controller.retired

    def teacher_active(self, step: int) -> bool:
        return not self._ready().retired

    # ----- credit ----------------------------------------------------------------------------------
    def credit(self, groups: list[EpisodeGroup], step: int) -> Credit:
        ctrl = self._ready()
        adv = self.row_advantages(groups).advantages
        metrics = {"adv/mean": float(adv.mean()), "adv/abs_mean": float(adv.abs().mean())}
        advantages = broadcast(groups, adv.tolist())
        if ctrl.retired:
            metrics.update(ctrl.metrics())
            return Credit(advantages=advantages, metrics=metrics)
        if ctrl.needs_validation:
            raise RuntimeError(f"retire_opd: a window of {ctrl.window} steps ended before step {step + 1} "
                               "without a validation; set trainer.val_every="
                               f"{self.required_val_every()} (= method.window)")
        return Credit(advantages=advantages, aux={"teacher_logprobs": teacher_rows(groups, self.name)},
                      aux_terms=[AuxTerm(name="opd", kind="k3_is", coef=self.opts.lam)], metrics=metrics)

    def after_train_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Record ``K_n = token_mean(lp_prox - lpT)``: the learner's ``opd/alignment`` over the
        step's tokens (its own log-probs before the update, not the engine's)."""
        ctrl = self.controller
        if ctrl is None or ctrl.retired or "opd/alignment" not in metrics:
            return {} if ctrl is None else ctrl.metrics()
        return ctrl.record_step(step + 1, float(metrics["opd/alignment"]))

    # ----- controller hooks ------------------------------------------------------------------------
    def on_validation(self, step: int, success_rate: float) -> dict[str, float]:
        """Close the window when it is full (its W steps are recorded); otherwise only report."""
        ctrl = self.controller
        if ctrl is None:
            return {}
        if ctrl.needs_validation:
            return ctrl.end_window(success_rate)
        return ctrl.metrics()

    def state_dict(self) -> dict:
        return {"teacher_path": self.teacher_path, "teacher_success_rate": self.teacher_success_rate,
                "controller": None if self.controller is None else self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.teacher_path = state["teacher_path"]
        self.teacher_success_rate = state["teacher_success_rate"]
        self.controller = None
        if self.teacher_success_rate is not None:
            self.controller = self._new_controller(self.teacher_success_rate)
            if state["controller"] is not None:
                self.controller.load_state_dict(state["controller"])
