"""The asynchronous controller: a few named loops around one bounded buffer.

* ``_rollout_loop``: wait for admission (the staleness bound, see
  ``pipeline/orchestration/buffer.py``), play one group, have the teacher score it if a step it
  may train in wants a teacher (so scoring overlaps the learner instead of preceding it), put it
  in the buffer. There are as many loops as groups the admission lets be in flight,
  ``(max_policy_lag + 1) * groups_per_step``, spread over the workers: a worker plays several
  groups at once and batches their turns together (``actors/rollout.py``).
* ``_train_loop``: one step (gather the groups, assign credit, update and publish, report), then
  validate / checkpoint when due.

Stopping (Ctrl-C, ``request_stop``): the train loop finishes the step it is in (the rollout loops
keep playing the groups it waits for), checkpoints and returns; a second request aborts at once
(``run`` raises ``Aborted``: a third signal, ``signals.py``; a second one hurries the stop). A stop
with a deadline (SIGTERM) puts validations off to the resumed run (``val_pending``) and abandons
the step in progress when it could not be checkpointed in time (``pipeline/orchestration/stopping.py``).
The rollout loops end only when the train loop has ended, or by raising.

Workers are handles (``actors.handles``, from ``launch.py``): the same loops drive Ray actors in
a run and in-process fakes in tests. Each side's waiting is measured (``clock.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass, field

from pipeline.core.config import PrivyConfig
from pipeline.core.errors import ActorDied, LearnerLost
from pipeline.core.microbatch import slice_rows
from pipeline.core.types import EpisodeGroup
from pipeline.distributed.weight_sync import WeightSyncError
from pipeline.orchestration.batches import build_train_batch, drop_silent_rows, minibatch_bounds, rows_of, unique_tokens
from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.clock import RolloutMeter, StepClock
from pipeline.orchestration.env_errors import EnvErrorFilter
from pipeline.orchestration.logging import EventLog, OutcomeLog
from pipeline.orchestration.pool import WorkerPool
from pipeline.orchestration.prompts import PromptLedger
from pipeline.orchestration.saver import StepSaver
from pipeline.orchestration.step_metrics import check_noise_floor, rollout_metrics, teacher_metrics
from pipeline.orchestration.stopping import RunLimits, StopRequest, cancel_all
from pipeline.orchestration.validator import Validator


class Aborted(Exception):
    """A second stop request: the run ended without finishing its step."""


class NonFiniteTraining(RuntimeError):
    """``trainer.max_skipped_steps`` updates in a row were discarded for non-finite gradients."""


def task_seed(base_seed: int, index: int) -> int:
    """The task seed of the ``index``-th training group (deterministic, resume-safe)."""
    return random.Random(base_seed * 1_000_003 + index).randrange(2**31)


@dataclass
class ControllerState:
    """Everything the loops need to continue exactly after a resume."""

    step: int = 0  # completed training steps = weights version
    next_task: int = 0  # index of the next training task to start
    in_flight: list[int] = field(default_factory=list)  # task indices drawn, not yet buffered (prompts.py)
    prompts_trained: int | None = None  # tasks whose group a step trained (None: a checkpoint before the count)
    rollout_busy_s: float = 0.0  # wall time with at least one group in play
    restarts: int = 0  # rollout workers / the scorer brought back after their process died
    replayed: int = 0  # groups lost with a dead worker and played again from their task seed
    skipped: int = 0  # training steps whose update was discarded (non-finite gradients)
    skipped_streak: int = 0  # ... of them in a row, up to the last step
    env_error_episodes: int = 0  # training episodes cut short by their env (left out of training)
    env_error_groups: int = 0  # training groups with no episode the env completed (played again)
    val_pending: int | None = None  # a step whose due validation a stop deadline put off: a resume runs it first


class Controller:
    """The loops, and a step as named phases: gather, assign credit, update, report. What else
    it needs is composed of objects with their own state: the worker pool (``pool.py``), the
    validator (``validator.py``), the step saver (``saver.py``), the env-error filter
    (``env_errors.py``) and the rollout meter (``clock.py``)."""

    def __init__(
        self,
        cfg: PrivyConfig,
        *,
        learner,
        workers: list,
        method,
        logger,
        checkpointer=None,
        scorer=None,
        progress=None,
        state: ControllerState | None = None,
        buffer_state: dict | None = None,
        events: EventLog | None = None,
        outcomes: OutcomeLog | None = None,
        started_at: float | None = None,
    ):
        self.cfg = cfg
        self.events = events or EventLog(None)
        self.learner, self.method, self.scorer = learner, method, scorer
        self.logger, self.progress = logger, progress
        self.state = state or ControllerState()
        self.state.skipped_streak = 0  # a resumed run (new lr, fixed rewards) gets a fresh allowance
        self.limits = RunLimits(cfg.trainer, self.state, self.events, started_at)
        t = cfg.trainer
        self.buffer = GroupBuffer(groups_per_step=t.groups_per_step, max_policy_lag=t.max_policy_lag)
        if buffer_state is not None:
            self.buffer.load_state_dict(buffer_state, version=self.state.step)
        else:
            self.buffer.synced_version = self.state.step
            self.buffer.started = self.state.step * t.groups_per_step
        self.prompts = PromptLedger(self.state, t.groups_per_step)
        self._stop = StopRequest()
        self.pool = WorkerPool(cfg, workers, learner=learner, scorer=scorer, events=self.events, counters=self.state)
        self.validator = Validator(cfg, self.pool, method, events=self.events, outcomes=outcomes or OutcomeLog(None))
        self.saver = StepSaver(
            cfg,
            checkpointer,
            learner=learner,
            buffer=self.buffer,
            stop=self._stop,
            events=self.events,
            counters=self.state,
            snapshot=self._snapshot,
        )
        self.env_errors = EnvErrorFilter(self.state, self.events)
        self.meter = RolloutMeter(self.state)
        self._noise_checked = False  # the teacher's noise floor against its signal (step_metrics.py)
        self._trainer: asyncio.Task | None = None
        self.aborted = False
        self.final_skipped = False  # the last step ended under a stop deadline: no final validation
        self.history: list[dict[str, float]] = []

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def abandoned_step(self) -> int | None:
        return self.saver.abandoned_step

    @property
    def time_limited(self) -> bool:
        """The last step was the first to end past ``trainer.time_limit_s``."""
        return self.limits.time_limited

    def request_stop(self, deadline: float | None = None) -> None:
        """First call: finish the current step, checkpoint, return (Ctrl-C); with a ``deadline``
        (``time.monotonic()``, SIGTERM) the checkpoint is saved by then. Second: abort now."""
        if not self._stop.is_set():
            self._stop.set(deadline)
            return
        self.aborted = True
        if self._trainer is not None:
            self._trainer.cancel()

    def _snapshot(self) -> dict:
        """What a checkpoint holds besides the learner's state."""
        return {
            "controller": dataclasses.asdict(self.state),
            "buffer": self.buffer.state_dict(),
            "method": self.method.state_dict(),
        }

    # ----- loops ---------------------------------------------------------------------------------
    async def run(self) -> list[dict[str, float]]:
        t = self.cfg.trainer
        n_loops = (t.max_policy_lag + 1) * t.groups_per_step if t.total_steps else 0  # 0: evaluate only
        rollouts = [asyncio.create_task(self._rollout_loop(i), name=f"rollout{i}") for i in range(n_loops)]
        self._trainer = trainer = asyncio.create_task(self._train_loop(), name="train")
        try:
            done, _ = await asyncio.wait([trainer, *rollouts], return_when=asyncio.FIRST_COMPLETED)
            for task in done:  # a rollout loop only ends by raising; the trainer when done or stopped
                if task is not trainer and not task.cancelled() and task.exception() is not None:
                    await self.saver.after_rollout_failure(trainer, task.exception())
                if task is trainer and not task.cancelled() and isinstance(task.exception(), LearnerLost):
                    self.saver.say_where_to_resume(task.exception())
                if not (task is trainer and self.aborted):
                    task.result()
        finally:
            await cancel_all([trainer, *rollouts, *self.pool.rejoins])
        if self.aborted:
            raise Aborted(f"aborted during step {self.state.step + 1} (a second stop request)")
        return self.history

    async def _rollout_loop(self, slot: int) -> None:
        cfg, st, pool = self.cfg, self.state, self.pool
        while True:  # cancelled by run() once the train loop has ended
            ticket = await self.buffer.acquire_start()
            idx = self.prompts.draw()
            self.meter.change(+1)
            try:
                group = await pool.worker_for(slot).run_group(
                    task_seed=task_seed(cfg.trainer.seed, idx),
                    split=cfg.env.train_split,
                    group_size=cfg.rollout.group_size,
                    temperature=cfg.rollout.temperature,
                    sample_seed=cfg.trainer.seed * 7919 + idx,
                    view=self.method.student_view(),
                    min_version=pool.published,
                    **self._demonstrate(ticket.deadline),
                )
                if not self.env_errors.keep(group, idx):
                    await self.buffer.release_start(ticket)
                    self.prompts.replay(idx)
                    continue
                if self._teacher_wanted(ticket.deadline):
                    group = await pool.score(group, slot)
            except ActorDied as e:
                # The worker's process died mid-group: nothing of the group is kept; the task is
                # played again, first, from its seed, once Ray has restarted the worker.
                await self.buffer.release_start(ticket)
                self.prompts.replay(idx)
                st.replayed += 1
                self.events.record("replay", step=st.step, task=idx, actor=e.handle.name)
                await pool.lost(e)
                continue
            except BaseException:
                await self.buffer.release_start(ticket)
                raise
            finally:
                self.meter.change(-1)
            await self.buffer.put(ticket, group)
            self.prompts.buffered(idx)

    def _demonstrate(self, deadline: int) -> dict:
        """``demonstrate=True`` when a step that may train this group learns from demonstrations."""
        wanted = any(self.method.wants_demonstrations(s) for s in range(self.state.step, deadline + 1))
        return {"demonstrate": True} if wanted else {}

    def _teacher_wanted(self, deadline: int) -> bool:
        """Whether any training step that may use a group due by ``deadline`` wants a teacher."""
        return self.scorer is not None and any(
            self.method.teacher_active(s) for s in range(self.state.step, deadline + 1)
        )

    async def _train_loop(self) -> None:
        t = self.cfg.trainer
        if self.state.step == 0 and (t.val_at_start or t.total_steps == 0):
            metrics = await self.validator.at_start(self._stop)
            if metrics is None:  # a stop with a deadline came: nothing is trained yet, nothing lost
                return
            self._log(0, metrics)
        if self.state.val_pending == self.state.step:  # put off by the stop the checkpoint was saved at
            if await self._validate(self.state.step, self.state.step >= t.total_steps, {}):
                return
        while self.state.step < t.total_steps and not self._stop.is_set():
            metrics = await self.saver.run_step(self._train_step)
            if metrics is None:
                await self.saver.keep_last_step()
                return
            step = self.state.step
            halt = self.limits.count_skip(step, metrics)
            last = step == t.total_steps or self.limits.past_time_limit(step, metrics)
            try:
                if not halt and ((t.val_every and step % t.val_every == 0) or last):
                    await self._validate(step, last, metrics, log=False)
            except Exception as error:  # e.g. a rollout worker lost for good mid-validation
                self.logger.log(metrics, step)
                await self.saver.keep_trained_step(step, error)
                raise
            due = (t.ckpt_every and step % t.ckpt_every == 0) or last
            if self.saver.enabled and (due or halt or self._stop.is_set()):
                metrics["time/checkpoint_s"] = await self.saver.save(step)
            # New groups may start only now: at lag 0 nothing is in flight at the checkpoint.
            if not last and not self._stop.is_set():
                await self.buffer.set_synced_version(step)
            self.history.append(metrics)
            self._log(step, metrics)
            if halt:
                raise NonFiniteTraining(
                    f"stopping the run: {self.state.skipped_streak} training steps in a row (up to step {step}) "
                    f"had non-finite losses or gradients, so their updates were discarded"
                    f"{f'; checkpoint at step {step}' if self.saver.enabled else ''}; lower "
                    f"learner.lr or check the rewards, then resume with trainer.resume=RUN_DIR"
                )
            if last:
                return

    async def _validate(self, step: int, last: bool, metrics: dict[str, float], log: bool = True) -> bool:
        """Step ``step``'s due validation into ``metrics`` (logged if ``log``); True when the run ends
        here. Put off by a stop with a deadline, it is ``val_pending`` in the checkpoint: the resumed
        run validates that step first (no point of the curve, no retirement window lost)."""
        got = await self.validator.due(step, last, self._stop)
        if got is None:
            self.state.val_pending, self.final_skipped = step, last
            return True
        self.state.val_pending = None
        metrics.update(got)
        if log:
            self._log(step, metrics)
        return last

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(metrics, step)
        if self.progress is not None:
            self.progress(step, metrics)

    # ----- one step: gather, assign credit, update, report ---------------------------------------------
    async def _train_step(self) -> dict[str, float]:
        step, clock = self.state.step, StepClock()
        groups, metrics = await self._gather(step, clock)
        self.saver.begin_update()  # from here the step changes the method's and the learner's state
        credit, minibatches = self._assign_credit(groups, step, metrics)
        clock.mark()
        sync_metrics = await self._update(minibatches, step, metrics, clock)
        self.state.step = step + 1
        self.prompts.trained(len(groups))
        metrics.update(self._report(groups, credit, sync_metrics, clock, step))
        return metrics

    async def _gather(self, step: int, clock: StepClock) -> tuple[list[EpisodeGroup], dict[str, float]]:
        """The step's groups from the buffer, every one scored when the teacher is active."""
        groups = await self.buffer.take(self.cfg.trainer.groups_per_step, learner_version=step)
        clock.mark()
        metrics: dict[str, float] = {}
        if self.method.teacher_active(step):
            if self.scorer is None:
                raise RuntimeError(f"method={self.method.name} needs a teacher scorer")
            # Normally scored as they completed; a group that was not (the teacher's schedule
            # turned on after it finished) is scored now, and the learner waits for it.
            groups = [await self.pool.score(g, i) if self.scorer.needs_scoring(g) else g for i, g in enumerate(groups)]
            metrics.update(teacher_metrics(groups, self.scorer.follows_policy))
            if not self._noise_checked and "noise/gap_abs_mean" in metrics:  # once, before any update
                self._noise_checked = True
                where = f"rollout.precision={self.cfg.rollout.precision}, teacher: {self.scorer.where}"
                check_noise_floor(metrics, self.cfg.scorer.max_noise_ratio, where)
        clock.mark()
        return groups, metrics

    def _assign_credit(self, groups: list[EpisodeGroup], step: int, metrics: dict[str, float]):
        """The method's credit, as the learner's mini-batches of whole groups."""
        cfg, entropy = self.cfg, self.cfg.learner.entropy_coef
        self.method.observe(groups)  # e.g. the skills offered to these episodes and their rewards (UCB)
        credit = self.method.credit(groups, step)
        rows = rows_of(groups)
        batch = build_train_batch(rows, credit, pad_id=self.learner.pad_id, default_entropy_coef=entropy)
        metrics["learner/unique_tokens"] = float(unique_tokens(rows))
        minibatches = [slice_rows(batch, a, b) for a, b in minibatch_bounds(groups, cfg.learner.mini_batches)]
        if cfg.trainer.skip_zero_advantage_rows and cfg.learner.kl_coef == 0:
            minibatches = [drop_silent_rows(mb, min_rows=cfg.learner.num_learners) for mb in minibatches]
            metrics["learner/skipped_rows_frac"] = 1.0 - sum(mb.n_rows for mb in minibatches) / max(batch.n_rows, 1)
        return credit, minibatches

    async def _update(self, minibatches: list, step: int, metrics: dict[str, float], clock: StepClock) -> dict:
        """Train, then publish the new weights (no weight group re-forms in between); a failed sync
        stops the run with the trained step checkpointed (a resumed run publishes it first)."""
        async with self.pool.sync_lock:
            async with self.pool.engines_asleep():
                metrics.update(await self.learner.train_step(minibatches))
            metrics.update(self.method.after_train_step(step, metrics))
            clock.mark()
            version = step + 1
            try:
                sync_metrics = await self.pool.publish(version)
            except WeightSyncError as e:
                # Never go on: the workers would keep sampling with stale (or no) weights.
                cause = getattr(e, "cause", None) or e  # a Ray task error wraps the receiver's own
                where = await self.saver.after_failed_sync(version)
                raise WeightSyncError(
                    f"stopping the run: syncing the weights of step {version} failed ({cause}); {where}"
                ) from e
        clock.mark()
        return sync_metrics

    def _report(self, groups: list[EpisodeGroup], credit, sync_metrics: dict, clock: StepClock, step: int) -> dict:
        st = self.state
        busy, window = self.meter.window(clock.marks[-1])
        return {
            **credit.metrics,
            **sync_metrics,
            **rollout_metrics(groups, self.method.invalid_action_penalty),
            **self.buffer.stats.as_metrics(),
            "faults/restarts": st.restarts,
            "faults/replayed_groups": st.replayed,
            "faults/env_error_episodes": st.env_error_episodes,
            "faults/env_error_groups": st.env_error_groups,
            "rollout/live_workers": self.pool.n_live,
            **self.prompts.metrics(len(self.buffer)),
            **clock.metrics(busy, window, groups, step),
        }
