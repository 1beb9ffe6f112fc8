"""How a run stops when asked (Ctrl-C finishes the step it is in; SIGTERM has a deadline), and the
limits it stops itself at (``RunLimits``).

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
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class StopRequest:
    """Whether a stop was requested, and by when the checkpoint must be on disk. A later request
    may bring the deadline forward (a second signal: now), never push it back."""

    def __init__(self):
        self.requested = asyncio.Event()
        self.deadline: float | None = None  # time.monotonic(); None: no limit (Ctrl-C)
        self._changed = asyncio.Event()  # the deadline was set or brought forward

    def set(self, deadline: float | None) -> None:
        self.requested.set()
        if deadline is not None and (self.deadline is None or deadline < self.deadline):
            self.deadline = deadline
            self._changed.set()

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
                self._changed.clear()
                if self.deadline is None:  # wake when it finishes or a deadline arrives
                    await self._wait(step, None)
                elif committed():
                    await asyncio.wait([step])
                else:
                    left = self.abandon_at(reserve_s()) - time.monotonic()
                    if left > 0:  # or until the deadline is brought forward
                        await self._wait(step, left)
                    else:  # nothing was awaited since committed() said no: the step is still abandonable
                        step.cancel()
                        await asyncio.wait([step])
                        return False
            return True
        finally:
            if not step.done():
                step.cancel()

    async def unless_deadline(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None when a stop with a deadline comes (or came) first: ``work``
        is cancelled. For validations: one can outlast any grace (minutes against 30 s), and what
        the grace is for is the checkpoint."""
        if self.deadline is not None:
            if asyncio.iscoroutine(work):
                work.close()  # never started
            return None
        task = asyncio.ensure_future(work)
        try:
            while not task.done() and self.deadline is None:
                self._changed.clear()
                await self._wait(task, None)
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.wait([task])
            return None
        finally:
            if not task.done():
                task.cancel()

    async def _wait(self, step: asyncio.Task, timeout: float | None) -> None:
        wake = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait([step, wake], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()


class RunLimits:
    """The two ends a run gives itself: ``trainer.time_limit_s`` (the step that ends past it is the
    last, validated and checkpointed) and ``trainer.max_skipped_steps`` discarded updates in a row
    (the run checkpoints and stops). ``counters`` is the run's ``ControllerState``."""

    def __init__(self, trainer_cfg, counters, events, started_at: float | None = None):
        self.cfg, self.counters, self.events = trainer_cfg, counters, events
        # trainer.time_limit_s counts from here (time.monotonic()): the run's start, given by run.py
        self.started_at = time.monotonic() if started_at is None else started_at
        self.time_limited = False  # the last step was the first to end past trainer.time_limit_s

    def past_time_limit(self, step: int, metrics: dict[str, float]) -> bool:
        """Whether ``step`` ended past ``trainer.time_limit_s`` (and so is the last one)."""
        limit = self.cfg.time_limit_s
        if limit is None or time.monotonic() - self.started_at < limit:
            return False
        self.time_limited = True
        metrics["trainer/time_limited"] = 1.0
        self.events.record("time_limit", step=step, limit_s=limit)
        print(
            f"privy-rl: trainer.time_limit_s={limit:g} reached: step {step} of {self.cfg.total_steps} "
            "is the last (validated, final splits, checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        return True

    def count_skip(self, step: int, metrics: dict[str, float]) -> bool:
        """Count a step whose update was discarded; True when ``trainer.max_skipped_steps`` came
        in a row (the run then checkpoints and stops)."""
        st, limit = self.counters, self.cfg.max_skipped_steps
        if metrics.get("learner/skipped_updates", 0) > 0:
            st.skipped, st.skipped_streak = st.skipped + 1, st.skipped_streak + 1
            self.events.record(
                "skip",
                step=step,
                updates=int(metrics["learner/skipped_updates"]),
                nonfinite_microbatches=int(metrics.get("learner/nonfinite_microbatches", 0)),
                in_a_row=st.skipped_streak,
            )
        else:
            st.skipped_streak = 0
        metrics["faults/skipped_steps"] = st.skipped
        return bool(limit) and st.skipped_streak >= limit


async def cancel_all(tasks: list[asyncio.Task], grace_s: float = 60.0) -> None:
    """Cancel the loops and wait for them, but boundedly: the run's end (its actors are killed
    next) must not hang on a task that does not finish its cancellation."""
    for task in tasks:
        task.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=grace_s)
    for task in done:  # retrieved: their errors after the cancel are not the run's
        if not task.cancelled():
            task.exception()
    if stuck:
        print(
            f"privy-rl: warning: {', '.join(t.get_name() for t in stuck)} did not stop within "
            f"{grace_s:g} s of being cancelled; ending the run without them",
            file=sys.stderr,
            flush=True,
        )
