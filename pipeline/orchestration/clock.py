"""Where a training step's time went, and how busy the rollout side was meanwhile.

``StepClock`` marks the end of each phase of one step; ``RolloutMeter`` counts the wall time with
at least one group in play (groups in flight overlap: summing their own seconds would count the
same second twice), so that a step's rollout tokens/s and the rollout side's idle fraction are
over the time since the last step ended (a validation included).
"""

from __future__ import annotations

import time

from pipeline.core.types import EpisodeGroup

PHASES = ("wait_rollout", "wait_teacher", "credit", "train", "sync")  # time/<phase>_s, in order


class StepClock:
    def __init__(self):
        self.marks = [time.time()]

    def mark(self) -> float:
        """The end of the next phase (``PHASES``)."""
        self.marks.append(time.time())
        return self.marks[-1]

    def metrics(self, busy: float, window: float, groups: list[EpisodeGroup], step: int) -> dict[str, float]:
        """``busy``: the wall time the rollout side was busy since the last step ended, ``window``
        that time; ``step`` the version the groups trained (their lag is measured against it)."""
        if len(self.marks) != len(PHASES) + 1:
            raise RuntimeError(f"a step has {len(PHASES)} phases, {len(self.marks) - 1} were marked")
        spans = {p: b - a for p, a, b in zip(PHASES, self.marks, self.marks[1:])}
        step_s = self.marks[-1] - self.marks[0]
        return {
            "time/step_s": step_s,
            **{f"time/{p}_s": s for p, s in spans.items()},
            "time/learner_idle_frac": (spans["wait_rollout"] + spans["wait_teacher"]) / max(step_s, 1e-9),
            "time/rollout_idle_frac": max(0.0, 1.0 - busy / max(window, 1e-9)),
            "rollout/tokens_per_s": sum(g.n_generated_tokens for g in groups) / max(busy, 1e-9),
            "rollout/group_seconds": sum(g.rollout_seconds for g in groups) / max(len(groups), 1),
            "sync/step_fraction": spans["sync"] / max(step_s, 1e-9),
            "rollout/policy_lag_max": step - min(g.min_version for g in groups),
        }


class RolloutMeter:
    """``counters.rollout_busy_s`` (checkpointed) grows by the wall time with a group in play."""

    def __init__(self, counters):
        self.counters = counters
        self.playing, self._mark = 0, time.time()
        self._counted, self._window_start = counters.rollout_busy_s, time.time()

    def change(self, delta: int) -> None:
        """``delta`` groups start (+1) or end (-1) their play; 0 brings the busy time up to now."""
        now = time.time()
        if self.playing > 0:
            self.counters.rollout_busy_s += now - self._mark
        self.playing += delta
        self._mark = now

    def window(self, now: float) -> tuple[float, float]:
        """(busy seconds, wall seconds) since the last call: the window of one step."""
        self.change(0)
        busy = self.counters.rollout_busy_s - self._counted
        window = now - self._window_start
        self._counted, self._window_start = self.counters.rollout_busy_s, now
        return busy, window
