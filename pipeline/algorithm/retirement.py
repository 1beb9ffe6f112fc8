"""RetireOPD's adaptive teacher retirement (docs/methods.md, ``retire_opd``), as a plain class.

Per training step n the method records the alignment ``K_n = token_mean(lp_prox - lpT)`` over the
step's batch, measured by the learner (the ``alignment`` metric of
``pipeline.algorithm.aux_losses.k3_is``: its own log-probs before the step's update, never the rollout
engine's). Steps are grouped in windows of W; when a window closes, the
controller wants a validation success rate SR_m (``needs_validation``) and ``end_window`` then
computes ``Kbar_m`` = mean of the window's K_n and, for m >= 2::

    rho_m = (Kbar_m - Kbar_{m-1}) / |Kbar_m|        (seed convention; the abs guards the sign
                                                    of a k1 estimate that can go negative)
    eta_m = (SR_m + SR_{m-1}) / (2 * SR_T)

The teacher retires at the first m >= 2 with ``rho_m >= delta`` and ``eta_m >= gamma``
(defaults delta = 0, gamma = 0.9): K has stopped falling and the student's success rate is
within gamma of the teacher's. Retirement is permanent; later ``record_step`` calls are ignored
(the teacher forward stops). The whole state round-trips through ``state_dict``, including a
half-filled window.

Guards, chosen as the limits of the formulas:

- ``Kbar_m == 0``: rho_m = 0 if ``Kbar_{m-1} == 0`` too, else +inf / -inf with the sign of the
  change (K rose to 0: no longer falling, eligible; K fell to 0: still falling, not eligible).
- ``SR_T == 0``: eta_m = +inf, so the eta test passes for any success rate: a teacher that
  never succeeds sets no bar, and rho alone decides. ``SR_T < 0`` is rejected.

SR_T is fixed for a frozen teacher (given at construction); a teacher that learns with the
student (the policy itself given the privileged context) is measured anew at every window end
and passed to ``end_window``.

Metrics are python floats (this runs on the driver), under the method's prefix (``opd/`` for
RetireOPD): ``K``, ``Kbar``, ``rho``, ``eta`` (the last two only from window 2 on), ``retired``
(0/1), ``retire_step`` (-1 until retirement), ``teacher_success_rate`` (SR_T once known) and
``retire_teacher_success`` (the SR_T the retiring window was judged against, -1 until retirement).
"""

from __future__ import annotations

import math


class RetirementRule:
    """Windows of K_n, validation at each window end, permanent retirement."""

    def __init__(
        self,
        *,
        teacher_success_rate: float | None,
        window: int = 5,
        delta: float = 0.0,
        gamma: float = 0.9,
        prefix: str = "opd",
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if teacher_success_rate is not None and teacher_success_rate < 0:
            raise ValueError(f"teacher_success_rate must be >= 0, got {teacher_success_rate}")
        self.prefix = prefix
        self.window = window
        self.delta = delta
        self.gamma = gamma
        self.teacher_success_rate = teacher_success_rate
        self.pending: list[float] = []  # K_n of the open window
        self.windows_closed = 0  # m of the last closed window
        self.prev_kbar: float | None = None
        self.prev_sr: float | None = None
        self.retired = False
        self.retire_step = -1
        self.retire_teacher_success = -1.0  # SR_T when the teacher retired (diagnostic)
        self.last_step = 0
        self.last_k: float | None = None
        self._last: dict[str, float] = {}  # Kbar/rho/eta of the last closed window

    # ----- per step --------------------------------------------------------------------------
    def record_step(self, step: int, k: float) -> dict[str, float]:
        """Record K_n of training step ``step``; ignored once retired."""
        if not self.retired:
            if self.needs_validation:
                raise RuntimeError("window is full: call end_window(success_rate) before recording more steps")
            self.pending.append(float(k))
            self.last_step = step
            self.last_k = float(k)
        return self.metrics()

    @property
    def needs_validation(self) -> bool:
        """True when the open window has W steps and waits for its success rate."""
        return not self.retired and len(self.pending) >= self.window

    # ----- per window ------------------------------------------------------------------------
    def end_window(self, success_rate: float, teacher_success_rate: float | None = None) -> dict[str, float]:
        """Close the full window with its validation success rate (and, for a teacher that learns,
        SR_T measured now); may retire the teacher."""
        if not self.needs_validation:
            raise RuntimeError(
                f"end_window needs a full window ({len(self.pending)}/{self.window} steps, retired={self.retired})"
            )
        if teacher_success_rate is not None:
            if teacher_success_rate < 0:
                raise ValueError(f"teacher_success_rate must be >= 0, got {teacher_success_rate}")
            self.teacher_success_rate = float(teacher_success_rate)
        if self.teacher_success_rate is None:
            raise RuntimeError("retirement needs the teacher's success rate SR_T: none was given or measured")
        kbar = sum(self.pending) / len(self.pending)
        self.windows_closed += 1
        p = self.prefix
        self._last = {f"{p}/Kbar": kbar}
        if self.prev_kbar is not None and self.prev_sr is not None:
            rho = _relative_change(kbar, self.prev_kbar)
            sr_sum = success_rate + self.prev_sr
            eta = sr_sum / (2 * self.teacher_success_rate) if self.teacher_success_rate > 0 else math.inf
            self._last.update({f"{p}/rho": rho, f"{p}/eta": eta})
            if rho >= self.delta and eta >= self.gamma:
                self.retired = True
                self.retire_step = self.last_step
                self.retire_teacher_success = float(self.teacher_success_rate)
        self.prev_kbar, self.prev_sr = kbar, float(success_rate)
        self.pending = []
        return self.metrics()

    # ----- reporting and checkpointing -------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        p = self.prefix
        out = dict(self._last)
        if self.last_k is not None:
            out[f"{p}/K"] = self.last_k
        out[f"{p}/retired"] = float(self.retired)
        out[f"{p}/retire_step"] = float(self.retire_step)
        out[f"{p}/retire_teacher_success"] = self.retire_teacher_success
        if self.teacher_success_rate is not None:
            out[f"{p}/teacher_success_rate"] = float(self.teacher_success_rate)
        return out

    def state_dict(self) -> dict:
        return {
            "pending": list(self.pending),
            "windows_closed": self.windows_closed,
            "prev_kbar": self.prev_kbar,
            "prev_sr": self.prev_sr,
            "retired": self.retired,
            "retire_step": self.retire_step,
            "retire_teacher_success": self.retire_teacher_success,
            "last_step": self.last_step,
            "last_k": self.last_k,
            "last": dict(self._last),
            "teacher_success_rate": self.teacher_success_rate,
        }

    def load_state_dict(self, state: dict) -> None:
        self.pending = list(state["pending"])
        self.windows_closed = int(state["windows_closed"])
        self.prev_kbar = state["prev_kbar"]
        self.prev_sr = state["prev_sr"]
        self.retired = bool(state["retired"])
        self.retire_step = int(state["retire_step"])
        self.retire_teacher_success = float(state.get("retire_teacher_success", -1.0))  # older checkpoints lack it
        self.last_step = int(state["last_step"])
        self.last_k = state["last_k"]
        self._last = dict(state["last"])
        if state.get("teacher_success_rate") is not None:
            self.teacher_success_rate = state["teacher_success_rate"]


def _relative_change(kbar: float, prev_kbar: float) -> float:
    """``(Kbar_m - Kbar_{m-1}) / |Kbar_m|`` with the zero-denominator limits of the docstring."""
    change = kbar - prev_kbar
    if kbar != 0.0:
        return change / abs(kbar)
    return 0.0 if change == 0.0 else math.copysign(math.inf, change)
