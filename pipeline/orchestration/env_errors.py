"""Episodes an env cut short: left out of training, and a task whose env always fails stops the run.

An env exception or timeout is not the policy's failure: training on it would push down innocent
turns, so the group's statistics are over the episodes the env completed. A group with none is
played again from its seed, ``MAX_ENV_ERROR_REPLAYS`` times in a row at most.
"""

from __future__ import annotations

from pipeline.core.types import EpisodeGroup
from pipeline.orchestration.logging import EventLog

MAX_ENV_ERROR_REPLAYS = 3  # a training task whose env fails every episode this often in a row stops the run


class EnvErrorFilter:
    """``counters`` is the run's ``ControllerState`` (``env_error_episodes`` / ``_groups`` are
    counted in it)."""

    def __init__(self, counters, events: EventLog):
        self.counters, self.events = counters, events
        self._streak: dict[int, int] = {}  # task index -> groups in a row the env failed whole

    def keep(self, group: EpisodeGroup, idx: int) -> bool:
        """Drop the episodes the env cut short; False when none was completed: training task
        ``idx`` must be played again (raises after ``MAX_ENV_ERROR_REPLAYS`` in a row)."""
        errors = [e.error for e in group.episodes if e.error]
        if not errors:
            self._streak.pop(idx, None)
            return True
        st = self.counters
        st.env_error_episodes += len(errors)
        group.episodes = [e for e in group.episodes if not e.error]
        self.events.record(
            "env_error", step=st.step, task=idx, episodes=len(errors), kept=len(group.episodes), error=errors[0][:200]
        )
        if group.episodes:
            self._streak.pop(idx, None)
            return True
        st.env_error_groups += 1
        n = self._streak[idx] = self._streak.get(idx, 0) + 1
        if n >= MAX_ENV_ERROR_REPLAYS:
            raise RuntimeError(
                f"stopping the run: every episode of training task {idx} ended in an env error, "
                f"{n} times in a row; the last: {errors[0][:300]}"
            )
        return False
