"""How a run stops when asked: Ctrl-C finishes the step it is in; SIGTERM has a deadline.

A cluster gives a stopping job a grace, then SIGKILL: `ray job stop` waits
``RAY_JOB_STOP_WAIT_TIME_S`` (a few seconds by default), a spot or Kubernetes preemption 30 s to
2 min. Whatever is not in a checkpoint by then is lost. So a stop with a deadline
(``trainer.stop_grace_s`` after SIGTERM) finishes the current step only if it can still save the
checkpoint in time, and otherwise abandons the step and saves the last completed one.

A step can be abandoned only before its update: until then it has only taken groups from the
buffer (they are given back, ``GroupBuffer.give_back``) and had them scored. From the moment the
method observes the groups and the learner changes its weights, the step is *committed*: it is
finished, and that step is saved. A learner update longer than what is left of the grace is
therefore not saved in time (docs/cluster.md says what grace a model needs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class StopRequest:
    """Whether a stop was requested, and by when the checkpoint must be on disk."""

    def __init__(self):
        self.requested = asyncio.Event()
        self.deadline: float | None = None  # time.monotonic(); None: no limit (Ctrl-C)
        self._deadline_set = asyncio.Event()

    def set(self, deadline: float | None) -> None:
        self.requested.set()
        if deadline is not None and self.deadline is None:
            self.deadline = deadline
            self._deadline_set.set()

    def is_set(self) -> bool:
        return self.requested.is_set()

    def abandon_at(self, reserve_s: float) -> float | None:
        """When an uncommitted step must be given up to leave ``reserve_s`` for the checkpoint."""
        return None if self.deadline is None else self.deadline - reserve_s

    async def finish_or_abandon(
        self, step: asyncio.Task, committed: Callable[[], bool], reserve_s: Callable[[], float]
    ) -> bool:
        """Wait for ``step``: True when it finished (its result or error is the task's). False when
        a deadline leaves no time to finish it while the step is not yet committed: it is cancelled
        and has ended. A cancellation of the caller cancels the step too."""
        try:
            while not step.done():
                if self.deadline is None:  # wake when it finishes or a deadline arrives
                    wake = asyncio.ensure_future(self._deadline_set.wait())
                    try:
                        await asyncio.wait([step, wake], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        wake.cancel()
                elif committed():
                    await asyncio.wait([step])
                else:
                    left = self.abandon_at(reserve_s()) - time.monotonic()
                    if left > 0:
                        await asyncio.wait([step], timeout=left)
                    else:  # nothing was awaited since committed() said no: the step is still abandonable
                        step.cancel()
                        await asyncio.wait([step])
                        return False
            return True
        finally:
            if not step.done():
                step.cancel()
