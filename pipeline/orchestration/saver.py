"""The step saver: checkpoints, and a training step run within a stop's deadline.

Besides the periodic checkpoints (``save``) it saves what a stop or a failure would otherwise
lose: on a stop with a deadline the step in progress is run only while it can still be
checkpointed in time (``run_step``, ``pipeline/orchestration/stopping.py``); after a failed weight
sync, a rollout loop that failed for good, or a validation that failed, the last trained step is
saved and the error says where to resume.

``counters`` is the run's ``ControllerState`` (read for the step, set by a failed sync's save);
``snapshot()`` returns what a checkpoint holds besides the learner (the controller's counters, the
buffer, the method's state).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from pipeline.core.config import PrivyConfig
from pipeline.core.errors import first_line
from pipeline.orchestration.logging import EventLog
from pipeline.orchestration.stopping import StopRequest


class StepSaver:
    def __init__(
        self,
        cfg: PrivyConfig,
        checkpointer,
        *,
        learner,
        buffer,
        stop: StopRequest,
        events: EventLog,
        counters,
        snapshot: Callable[[], dict],
    ):
        self.cfg, self.checkpointer, self.learner, self.buffer = cfg, checkpointer, learner, buffer
        self.stop, self.events, self.counters, self.snapshot = stop, events, counters, snapshot
        self.committed = False  # the step in progress has begun its update: it can no longer be abandoned
        self.checkpoint_s: float | None = None  # the last save's seconds, what a deadline keeps for the next
        self.saved_step: int | None = counters.step or None  # a resumed run starts at a checkpoint
        self.abandoned_step: int | None = None  # a step given up for a stop deadline
        self.saving: int | None = None  # the step whose checkpoint is being written

    @property
    def enabled(self) -> bool:
        return self.checkpointer is not None

    async def save(self, step: int) -> float:
        tc = time.time()
        self.saving = step  # left set by a save cancelled half-way (an abort): it says what was lost
        await self.checkpointer.save(step, self.learner, self.snapshot())
        self.saving = None
        self.checkpoint_s = time.time() - tc
        self.saved_step = step
        return self.checkpoint_s

    def begin_update(self) -> None:
        """Called by the step when it starts changing the method's and the learner's state."""
        self.committed = True

    async def run_step(self, step: Callable[[], Awaitable[dict[str, float]]]) -> dict[str, float] | None:
        """The step's metrics, or None when a stop deadline made it give up before its update
        (its groups are back in the buffer)."""
        self.committed = False
        task = asyncio.create_task(step(), name="train step")

        def reserve() -> float:  # for the checkpoint: what the last one took, with a margin; unmeasured: half the grace
            if self.checkpoint_s is not None:
                return 1.5 * self.checkpoint_s + 1.0
            return 0.5 * self.cfg.trainer.stop_grace_s

        if await self.stop.finish_or_abandon(task, lambda: self.committed, reserve):
            return task.result()
        self.abandoned_step = self.counters.step + 1
        back = await self.buffer.give_back()
        self.events.record(
            "step_abandoned",
            step=self.abandoned_step,
            groups_given_back=back,
            reason=f"it could not finish and be checkpointed within trainer.stop_grace_s="
            f"{self.cfg.trainer.stop_grace_s:g}",
        )
        return None

    async def keep_last_step(self) -> None:
        """After an abandoned step: checkpoint the last completed step unless it already is."""
        step = self.counters.step
        if self.enabled and step > 0 and self.saved_step != step:
            await self.save(step)

    async def keep_trained_step(self, step: int, error: BaseException) -> None:
        """A validation after step ``step`` failed (a rollout worker Ray will not restart): the step
        is trained and the learner is fine, so it is checkpointed before the run stops, and
        ``error`` says where to resume. A failed save leaves the validation's error to report."""
        if not self.enabled or self.saved_step == step:
            return
        try:
            await self.save(step)
        except Exception:
            return
        hint = f"checkpoint at step {step}: resume with trainer.resume={self._run_dir()}"
        error.args = (f"{first_line(error)}; {hint}",)
        # also said here: some errors (Ray's) print a message of their own, not their args
        print(f"privy-rl: the validation after step {step} failed; {hint}", file=sys.stderr, flush=True)

    async def after_failed_sync(self, version: int) -> str:
        """Save step ``version`` (trained, not published); says where to resume from. Bounded: a
        learner still blocked in the failed broadcast answers after its own sync timeout."""
        if not self.enabled:
            return "resume from the last checkpoint"
        self.counters.step = version
        limit = self.cfg.cluster.sync_timeout_s + 60
        try:
            tc = time.time()
            path = await asyncio.wait_for(self.checkpointer.save(version, self.learner, self.snapshot()), limit)
            self.checkpoint_s, self.saved_step = time.time() - tc, version
        except Exception as err:  # the sync error is the one to report
            return f"its checkpoint failed too ({first_line(err)}); resume from the last checkpoint"
        self.events.record("checkpoint_after_failed_sync", step=version, path=str(path))
        return f"checkpoint at step {version}: resume with trainer.resume=RUN_DIR"

    async def after_rollout_failure(self, trainer: asyncio.Task, error: BaseException) -> None:
        """A rollout loop failed for good (a worker Ray will not restart, an env that always
        fails): the learner is fine, so the train loop stops at once, as on a stop deadline
        (the step in progress is abandoned unless its update began) and checkpoints the last
        completed step; the error then says where to resume. Bounded by the learner's own timeout."""
        if not self.enabled or trainer.done():
            return
        self.stop.set(time.monotonic())  # not a stop request: after a Ctrl-C that would abort, unsaved
        limit = self.cfg.learner.call_timeout_s or None
        done, _ = await asyncio.wait([trainer], timeout=limit and 2 * limit + 60)
        if trainer in done and not trainer.cancelled() and trainer.exception() is None and self.counters.step:
            error.args = (
                f"{first_line(error)}; checkpoint at step {self.counters.step}: resume with "
                f"trainer.resume={self._run_dir()}",
            )

    def say_where_to_resume(self, error: BaseException) -> None:
        """A lost learner took its state with it: the run continues from its last checkpoint."""
        if getattr(self.checkpointer, "root", None) is None:
            return
        where = (
            f"resume from the last checkpoint (step {self.saved_step}): trainer.resume={self._run_dir()}"
            if self.saved_step
            else "no checkpoint was saved yet: start the run again"
        )
        error.args = (f"{first_line(error)}; {where}",)

    def _run_dir(self) -> str:
        root = getattr(self.checkpointer, "root", None)  # RUN/checkpoints
        return str(root.parent) if root is not None else "RUN_DIR"
