"""``schedule`` parts: when the teacher signal is on, and its scale (0 = off: no teacher forward).

- ``constant``: always on.
- ``window`` (ADRS): on for the training steps ``warmup_steps < n <= warmup_steps + active_steps``
  (21-70 by default; ``active_steps: null`` = to the end), with ``entropy_coef_active`` while on
  and ``entropy_coef_idle`` otherwise (set on every step's Credit). ``n = step + 1``: the
  controller passes completed steps.
- ``retirement`` (RetireOPD): on until the teacher retires (``pipeline.algorithm.retirement``):
  windows of ``window`` steps of ``K_n = <prefix>/alignment`` (the learner's token mean of
  ``lp_prox - lpT``), closed by the validation at each window end; retire at the first window
  m >= 2 with ``rho_m >= delta`` and ``eta_m >= gamma``. SR_T is the frozen teacher's recorded
  success rate, or, for a teacher that learns with the student, the success rate of the policy
  given the privileged context measured at that validation. ``trainer.val_every`` must equal
  ``window``.
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.algorithm.adrs import adrs_schedule
from pipeline.algorithm.retirement import RetirementRule
from pipeline.methods.options import require
from pipeline.methods.parts.base import Part


class Schedule(Part, slot="schedule"):
    rule: RetirementRule | None = None  # the retirement state, where there is one
    retired = False

    def set_teacher_success_rate(self, success_rate: float) -> None:
        """SR_T, once known (a frozen teacher's, read or adopted)."""

    def scale(self, step: int) -> float:
        return 1.0

    def entropy_coef(self, step: int) -> float | None:
        return None

    def metrics(self, step: int) -> dict[str, float]:
        return {}

    def check(self, step: int) -> None:
        """Raise before a step the schedule cannot take (a window that was never validated)."""

    def after_train_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return {}

    def on_validation(self, step: int, success_rate: float, teacher_success_rate: float | None) -> dict[str, float]:
        return {}

    def required_val_every(self) -> int | None:
        return None


class Constant(Schedule, kind="constant"):
    """The teacher signal at full scale every step."""


class Window(Schedule, kind="window"):
    """The teacher signal on for a window of steps, with its own entropy bonus (ADRS)."""

    @dataclasses.dataclass
    class Options:
        warmup_steps: int = 20  # the teacher signal starts after this many steps
        active_steps: int | None = 50  # ... and lasts this many (null = to the end)
        entropy_coef_active: float = 0.01  # entropy bonus while on
        entropy_coef_idle: float = 0.001  # entropy bonus otherwise

        def validate(self, method: str) -> None:
            require(self.warmup_steps >= 0, f"method={method}: method.warmup_steps={self.warmup_steps} must be >= 0")
            require(
                self.active_steps is None or self.active_steps >= 1,
                f"method={method}: method.active_steps={self.active_steps} must be >= 1, or null for no end",
            )
            require(
                self.entropy_coef_active >= 0.0 and self.entropy_coef_idle >= 0.0,
                f"method={method}: method.entropy_coef_active and method.entropy_coef_idle must be >= 0",
            )

    def _at(self, step: int):
        o = self.opts
        return adrs_schedule(
            step + 1,
            eta=1.0,
            warmup_steps=o.warmup_steps,
            active_steps=o.active_steps,
            entropy_coef_active=o.entropy_coef_active,
            entropy_coef_idle=o.entropy_coef_idle,
        )

    def scale(self, step: int) -> float:
        return self._at(step).eta_s

    def entropy_coef(self, step: int) -> float | None:
        return self._at(step).entropy_coef

    def metrics(self, step: int) -> dict[str, float]:
        return {f"{self.setting.prefix}/entropy_coef": self.entropy_coef(step)}


class Retirement(Schedule, kind="retirement"):
    """The teacher signal on until the teacher retires (RetireOPD)."""

    @dataclasses.dataclass
    class Options:
        gamma: float = 0.9  # retire when eta_m >= gamma (success-rate ratio to the teacher), > 0
        delta: float = 0.0  # ... and rho_m >= delta (relative change of the window-mean K)
        window: int = 5  # W, steps per window; trainer.val_every must equal it

        def validate(self, method: str) -> None:
            require(
                math.isfinite(self.gamma) and self.gamma > 0.0,
                f"method={method}: method.gamma={self.gamma} must be > 0 (paper range 0.80-0.96)",
            )
            require(
                math.isfinite(self.delta),
                f"method={method}: method.delta={self.delta} must be finite (paper range -0.10-0.04)",
            )
            require(self.window >= 1, f"method={method}: method.window={self.window} must be >= 1")

    def __init__(self, opts, setting):
        super().__init__(opts, setting)
        self.rule = RetirementRule(
            teacher_success_rate=None, window=opts.window, delta=opts.delta, gamma=opts.gamma, prefix=setting.prefix
        )

    @property
    def retired(self) -> bool:
        return self.rule.retired

    def set_teacher_success_rate(self, success_rate: float) -> None:
        self.rule.teacher_success_rate = success_rate

    def scale(self, step: int) -> float:
        return 0.0 if self.rule.retired else 1.0

    def metrics(self, step: int) -> dict[str, float]:
        return self.rule.metrics() if self.rule.retired else {}

    def check(self, step: int) -> None:
        if self.rule.needs_validation:
            raise RuntimeError(
                f"{self.setting.method}: a window of {self.opts.window} steps ended before step "
                f"{step + 1} without a validation; set trainer.val_every={self.opts.window} "
                "(= method.window)"
            )

    def after_train_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        key = f"{self.setting.prefix}/alignment"
        if self.rule.retired or key not in metrics:
            return self.rule.metrics()
        return self.rule.record_step(step + 1, float(metrics[key]))

    def on_validation(self, step: int, success_rate: float, teacher_success_rate: float | None) -> dict[str, float]:
        if self.rule.needs_validation:
            return self.rule.end_window(success_rate, teacher_success_rate)
        return self.rule.metrics()

    def required_val_every(self) -> int:
        return self.opts.window

    def state_dict(self) -> dict:
        return self.rule.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rule.load_state_dict(state)
