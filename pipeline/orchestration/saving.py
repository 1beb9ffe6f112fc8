"""Checkpoints the controller saves besides the periodic ones: on a stop (within its deadline,
abandoning a step that cannot finish in time, ``pipeline/orchestration/stopping.py``), after a
failed weight sync, after a rollout loop failed for good, after a validation that failed; and the
resume hint the error then gives.

A mixin of ``Controller`` (``pipeline/orchestration/controller.py``): it reads the controller's
``cfg``, ``state``, ``events``, ``buffer``, ``checkpointer``, ``_stop``, ``_committed``,
``_checkpoint_s``, ``_saved_step`` and ``_published``, and sets ``abandoned_step``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from pipeline.core.errors import first_line


class Saving:
    async def _save(self, step: int) -> float:
        tc = time.time()
        await self.checkpointer.save(self, step)
        self._checkpoint_s = time.time() - tc
        self._saved_step = step
        return self._checkpoint_s

    async def _step_unless_out_of_time(self) -> dict[str, float] | None:
        """The next training step's metrics, or None when a stop deadline made it give up before
        its update (its groups are back in the buffer)."""
        self._committed = False
        step = asyncio.create_task(self._train_step(), name="train step")

        def reserve() -> float:  # for the checkpoint: what the last one took, with a margin; unmeasured: half the grace
            if self._checkpoint_s is not None:
                return 1.5 * self._checkpoint_s + 1.0
            return 0.5 * self.cfg.trainer.stop_grace_s

        if await self._stop.finish_or_abandon(step, lambda: self._committed, reserve):
            return step.result()
        self.abandoned_step = self.state.step + 1
        back = await self.buffer.give_back()
        self.events.record(
            "step_abandoned",
            step=self.abandoned_step,
            groups_given_back=back,
            reason=f"it could not finish and be checkpointed within trainer.stop_grace_s="
            f"{self.cfg.trainer.stop_grace_s:g}",
        )
        return None

    async def _keep_last_step(self) -> None:
        """After an abandoned step: checkpoint the last completed step unless it already is."""
        step = self.state.step
        if self.checkpointer is not None and step > 0 and self._saved_step != step:
            await self._save(step)

    async def _keep_trained_step(self, step: int, metrics: dict[str, float], error: BaseException) -> None:
        """A validation after step ``step`` failed (a rollout worker Ray will not restart): the step
        is trained and the learner is fine, so it is logged and checkpointed before the run stops,
        and ``error`` says where to resume. A failed save leaves the validation's error to report."""
        self.logger.log(metrics, step)
        if self.checkpointer is None or self._saved_step == step:
            return
        try:
            await self._save(step)
        except Exception:
            return
        root = getattr(self.checkpointer, "root", None)  # RUN/checkpoints
        where = root.parent if root is not None else "RUN_DIR"
        hint = f"checkpoint at step {step}: resume with trainer.resume={where}"
        error.args = (f"{first_line(error)}; {hint}",)
        # also said here: some errors (Ray's) print a message of their own, not their args
        print(f"privy-rl: the validation after step {step} failed; {hint}", file=sys.stderr, flush=True)

    async def _checkpoint_after_failed_sync(self, version: int) -> str:
        """Save step ``version`` (trained, not published); says where to resume from. Bounded: a
        learner still blocked in the failed broadcast answers after its own sync timeout."""
        if self.checkpointer is None:
            return "resume from the last checkpoint"
        self.state.step = self._published = version
        limit = self.cfg.cluster.sync_timeout_s + 60
        try:
            path = await asyncio.wait_for(self.checkpointer.save(self, version), limit)
        except Exception as err:  # the sync error is the one to report
            return f"its checkpoint failed too ({first_line(err)}); resume from the last checkpoint"
        self.events.record("checkpoint_after_failed_sync", step=version, path=str(path))
        return f"checkpoint at step {version}: resume with trainer.resume=RUN_DIR"

    async def _save_after_rollout_failure(self, trainer: asyncio.Task, error: BaseException) -> None:
        """A rollout loop failed for good (a worker Ray will not restart, an env that always
        fails): the learner is fine, so the train loop stops at once, as on a stop deadline
        (the step in progress is abandoned unless its update began) and checkpoints the last
        completed step; the error then says where to resume. Bounded by the learner's own timeout."""
        if self.checkpointer is None or trainer.done():
            return
        self._stop.set(time.monotonic())  # not request_stop: after a Ctrl-C that would abort, unsaved
        limit = self.cfg.learner.call_timeout_s or None
        done, _ = await asyncio.wait([trainer], timeout=limit and 2 * limit + 60)
        if trainer in done and not trainer.cancelled() and trainer.exception() is None and self.state.step:
            root = getattr(self.checkpointer, "root", None)  # RUN/checkpoints
            error.args = (
                f"{first_line(error)}; checkpoint at step {self.state.step}: resume with "
                f"trainer.resume={root.parent if root is not None else 'RUN_DIR'}",
            )

    def _say_where_to_resume(self, error: BaseException) -> None:
        """A lost learner took its state with it: the run continues from its last checkpoint."""
        root = getattr(self.checkpointer, "root", None)  # RUN/checkpoints
        if root is None:
            return
        where = (
            f"resume from the last checkpoint (step {self._saved_step}): trainer.resume={root.parent}"
            if self._saved_step
            else "no checkpoint was saved yet: start the run again"
        )
        error.args = (f"{first_line(error)}; {where}",)
