"""The asynchronous controller: a few named loops around one bounded buffer.

* ``_rollout_loop``: wait for admission (the staleness bound, see
  ``pipeline/orchestration/buffer.py``), play one group, have the teacher score it if a step it
  may train in wants a teacher (so scoring overlaps the learner instead of preceding it), put it
  in the buffer. There are as many loops as groups the admission lets be in flight,
  ``(max_policy_lag + 1) * groups_per_step``, spread over the workers: a worker plays several
  groups at once and batches their turns together (``actors/rollout.py``).
* ``_train_loop``: take ``groups_per_step`` groups, score the ones that still need it, assign
  credit, train, publish the new weights, then validate / checkpoint when due.

Stopping (Ctrl-C, ``request_stop``): the train loop finishes the step it is in (the rollout loops
keep playing the groups it waits for), checkpoints and returns; a second request aborts at once
(``run`` raises ``Aborted``). A stop with a deadline (SIGTERM) skips validations and abandons the
step in progress when it could not be checkpointed in time (``pipeline/orchestration/stopping.py``).
The rollout loops end only when the train loop has ended, or by raising.

The controller talks to workers through small handles (``actors.handles``), so the same loops drive
Ray actors in a run and plain in-process fakes in tests. Time spent waiting on each side is
measured: the learner idles while the buffer is short of groups, the rollout side while admission
holds it back.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, field

from actors.handles import ActorDied, LearnerLost
from pipeline.core.config import PrivyConfig
from pipeline.core.microbatch import slice_rows
from pipeline.distributed.weight_sync import WeightSyncError
from pipeline.orchestration.batches import build_train_batch, drop_silent_rows, minibatch_bounds, rows_of
from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.logging import EventLog, OutcomeLog
from pipeline.orchestration.saving import Saving
from pipeline.orchestration.step_metrics import check_noise_floor, rollout_metrics, step_timing, teacher_metrics
from pipeline.orchestration.stopping import StopRequest
from pipeline.orchestration.supervision import Supervision
from pipeline.orchestration.validation import Validation


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
    in_flight: list[int] = field(default_factory=list)  # task indices started, not yet buffered
    rollout_busy_s: float = 0.0  # wall time with at least one group in play
    restarts: int = 0  # rollout workers / the scorer brought back after their process died
    replayed: int = 0  # groups lost with a dead worker and played again from their task seed
    skipped: int = 0  # training steps whose update was discarded (non-finite gradients)
    skipped_streak: int = 0  # ... of them in a row, up to the last step
    env_error_episodes: int = 0  # training episodes cut short by their env (left out of training)
    env_error_groups: int = 0  # training groups with no episode the env completed (played again)


class Controller(Supervision, Saving, Validation):
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
        # trainer.time_limit_s counts from here (time.monotonic()): the run's start, given by run.py
        self._started_at = time.monotonic() if started_at is None else started_at
        self.time_limited = False  # the last step was the first to end past trainer.time_limit_s
        self.events = events or EventLog(None)
        self.outcomes = outcomes or OutcomeLog(None)
        self.learner, self.workers, self.method = learner, workers, method
        self.scorer, self.logger, self.checkpointer = scorer, logger, checkpointer
        self.progress = progress
        self.state = state or ControllerState()
        # Consumers must hold at least these weights (a resumed run publishes them before it starts).
        self._published = self.state.step
        self.state.skipped_streak = 0  # a resumed run (new lr, fixed rewards) gets a fresh allowance
        t = cfg.trainer
        self.buffer = GroupBuffer(groups_per_step=t.groups_per_step, max_policy_lag=t.max_policy_lag)
        if buffer_state is not None:
            self.buffer.load_state_dict(buffer_state, version=self.state.step)
        else:
            self.buffer.synced_version = self.state.step
            self.buffer.started = self.state.step * t.groups_per_step
        self._retry = list(self.state.in_flight)  # groups lost in flight at the last checkpoint
        self._away: set[int] = set()  # workers lost that the run goes on without (supervision.py)
        self._rejoins: list[asyncio.Task] = []  # ... each waiting for Ray to place it again
        self._joining: set[int] = set()  # ... placed again, taking the current weights
        self._noise_checked = False  # the teacher's noise floor against its signal (step_metrics.py)
        self._min_workers = cfg.rollout.min_workers or len(workers)
        self._env_error_streak: dict[int, int] = {}  # task index -> groups in a row the env failed whole
        self.state.in_flight = []
        self._stop = StopRequest()
        self._committed = False  # the step in progress has begun its update: it can no longer be abandoned
        self._checkpoint_s: float | None = None  # the last save's seconds, what a deadline keeps for the next
        self._saved_step: int | None = self.state.step or None  # a resumed run starts at a checkpoint
        self.abandoned_step: int | None = None  # a step given up for a stop deadline
        self.final_skipped = False  # the last step ended under a stop deadline: no final validation
        self._sync_lock = asyncio.Lock()  # a training step and its publish vs a weight-group re-form
        self._trainer: asyncio.Task | None = None
        self._n_playing, self._busy_mark = 0, time.time()
        # Busy time already set against a step's tokens: a step's tokens/s counts the busy time
        # since the last step ended, so groups played during a validation count too.
        self._busy_counted, self._window_start = self.state.rollout_busy_s, time.time()
        self.aborted = False
        self.history: list[dict[str, float]] = []
        # Colocated vLLM engines free their GPU memory while the learner trains (lag 0 only:
        # then no group is in flight during the train step).
        self._sleep_engines = (
            cfg.cluster.colocate and cfg.rollout.engine == "vllm" and cfg.rollout.vllm.enable_sleep_mode
        )

    def _precisions(self) -> str:
        r, sc = self.cfg.rollout, self.cfg.scorer
        where = "rollout engine" if self.scorer.on_engine else f"scorer.precision={sc.precision}"
        return f"rollout.precision={r.precision}, teacher: {where}"

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self, deadline: float | None = None) -> None:
        """First call: finish the current step, checkpoint, return (Ctrl-C); with a ``deadline``
        (``time.monotonic()``, SIGTERM) the checkpoint is saved by then. Second: abort now."""
        if not self._stop.is_set():
            self._stop.set(deadline)
            return
        self.aborted = True
        if self._trainer is not None:
            self._trainer.cancel()

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
                    await self._save_after_rollout_failure(trainer, task.exception())
                if task is trainer and not task.cancelled() and isinstance(task.exception(), LearnerLost):
                    self._say_where_to_resume(task.exception())
                if not (task is trainer and self.aborted):
                    task.result()
        finally:
            await _cancel_all([trainer, *rollouts, *self._rejoins])
        if self.aborted:
            raise Aborted(f"aborted during step {self.state.step + 1} (a second stop request)")
        return self.history

    def _next_task_index(self) -> int:
        if self._retry:
            return self._retry.pop(0)
        idx = self.state.next_task
        self.state.next_task += 1
        return idx

    async def _rollout_loop(self, slot: int) -> None:
        cfg, st = self.cfg, self.state
        while True:  # cancelled by run() once the train loop has ended
            ticket = await self.buffer.acquire_start()
            worker = self._worker_for(slot)
            idx = self._next_task_index()
            st.in_flight.append(idx)
            self._playing(+1)
            try:
                group = await worker.run_group(
                    task_seed=task_seed(cfg.trainer.seed, idx),
                    split=cfg.env.train_split,
                    group_size=cfg.rollout.group_size,
                    temperature=cfg.rollout.temperature,
                    sample_seed=cfg.trainer.seed * 7919 + idx,
                    view=self.method.student_view(),
                    min_version=self._published,
                    **self._demonstrate(ticket.deadline),
                )
                if not self._drop_env_errors(group, idx):
                    await self.buffer.release_start(ticket)
                    st.in_flight.remove(idx)
                    self._retry.insert(0, idx)
                    continue
                if self._teacher_wanted(ticket.deadline):
                    group = await self._score(group, slot)
            except ActorDied as e:
                # The worker's process died mid-group: nothing of the group is kept; the task is
                # played again, first, from its seed, once Ray has restarted the worker.
                await self.buffer.release_start(ticket)
                st.in_flight.remove(idx)
                self._retry.insert(0, idx)
                st.replayed += 1
                self.events.record("replay", step=st.step, task=idx, actor=e.handle.name)
                await self._worker_lost(e)
                continue
            except BaseException:
                await self.buffer.release_start(ticket)
                raise
            finally:
                self._playing(-1)
            st.in_flight.remove(idx)
            await self.buffer.put(ticket, group)

    def _playing(self, delta: int) -> None:
        """Count groups in play; the wall time with at least one is the rollout side's busy time."""
        now = time.time()
        if self._n_playing > 0:
            self.state.rollout_busy_s += now - self._busy_mark
        self._n_playing += delta
        self._busy_mark = now

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
            # the starting point (e.g. the warm start), as step 0; with no steps, also the final splits
            metrics = await self._validate(0, notify_method=False) if t.val_at_start else {}
            if t.total_steps == 0:
                metrics.update(await self._final_validation(0))
            self.logger.log(metrics, 0)
            if self.progress is not None:
                self.progress(0, metrics)
        while self.state.step < t.total_steps and not self._stop.is_set():
            metrics = await self._step_unless_out_of_time()
            if metrics is None:
                await self._keep_last_step()
                return
            step = self.state.step
            halt = self._count_skip(step, metrics)
            last = step == t.total_steps or self._past_time_limit(step, metrics)
            hurry = self._stop.deadline is not None  # a validation could outlast the grace
            try:
                if t.val_every and (step % t.val_every == 0 or last) and not halt and not hurry:
                    metrics.update(await self._validate(step))
                if last and not halt:
                    if hurry:
                        self.final_skipped = True
                    else:
                        metrics.update(await self._final_validation(step))
            except Exception as error:  # e.g. a rollout worker lost for good mid-validation
                await self._keep_trained_step(step, metrics, error)
                raise
            due = (t.ckpt_every and step % t.ckpt_every == 0) or last
            if self.checkpointer is not None and (due or halt or self._stop.is_set()):
                metrics["time/checkpoint_s"] = await self._save(step)
            # New groups may start only now: at lag 0 nothing is in flight at the checkpoint.
            if not last and not self._stop.is_set():
                await self.buffer.set_synced_version(step)
            self.logger.log(metrics, step)
            self.history.append(metrics)
            if self.progress is not None:
                self.progress(step, metrics)
            if halt:
                where = f"; checkpoint at step {step}" if self.checkpointer is not None else ""
                raise NonFiniteTraining(
                    f"stopping the run: {self.state.skipped_streak} training steps in a row (up to step {step}) "
                    f"had non-finite losses or gradients, so their updates were discarded{where}; lower "
                    f"learner.lr or check the rewards, then resume with trainer.resume=RUN_DIR"
                )
            if last:
                return

    def _past_time_limit(self, step: int, metrics: dict[str, float]) -> bool:
        """Whether ``step`` ended past ``trainer.time_limit_s`` (and so is the last one)."""
        limit = self.cfg.trainer.time_limit_s
        if limit is None or time.monotonic() - self._started_at < limit:
            return False
        self.time_limited = True
        metrics["trainer/time_limited"] = 1.0
        self.events.record("time_limit", step=step, limit_s=limit)
        print(
            f"privy-rl: trainer.time_limit_s={limit:g} reached: step {step} of {self.cfg.trainer.total_steps} "
            "is the last (validated, final splits, checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        return True

    def _count_skip(self, step: int, metrics: dict[str, float]) -> bool:
        """Count a step whose update was discarded; True when ``trainer.max_skipped_steps`` came
        in a row (the run then checkpoints and stops)."""
        st, limit = self.state, self.cfg.trainer.max_skipped_steps
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

    async def _train_step(self) -> dict[str, float]:
        cfg, st = self.cfg, self.state
        step = st.step
        t0 = time.time()
        groups = await self.buffer.take(cfg.trainer.groups_per_step, learner_version=step)
        t1 = time.time()
        metrics: dict[str, float] = {}
        if self.method.teacher_active(step):
            if self.scorer is None:
                raise RuntimeError(f"method={self.method.name} needs a teacher scorer")
            # Normally scored as they completed; a group that was not (the teacher's schedule
            # turned on after it finished) is scored now, and the learner waits for it.
            groups = [await self._score(g, i) if self.scorer.needs_scoring(g) else g for i, g in enumerate(groups)]
            metrics.update(teacher_metrics(groups, self.scorer.self_teacher))
            if not self._noise_checked and "noise/gap_abs_mean" in metrics:  # once, before any update
                self._noise_checked = True
                check_noise_floor(metrics, cfg.scorer.max_noise_ratio, self._precisions())
        t2 = time.time()
        self._committed = True  # from here the step changes the method's and the learner's state
        self.method.observe(groups)  # e.g. the skills offered to these episodes and their rewards (UCB)
        credit = self.method.credit(groups, step)
        rows = rows_of(groups)
        batch = build_train_batch(
            rows, credit, pad_id=self.learner.pad_id, default_entropy_coef=cfg.learner.entropy_coef
        )
        minibatches = [slice_rows(batch, a, b) for a, b in minibatch_bounds(groups, cfg.learner.mini_batches)]
        if cfg.trainer.skip_zero_advantage_rows and cfg.learner.kl_coef == 0:
            minibatches = [drop_silent_rows(mb, min_rows=cfg.learner.num_learners) for mb in minibatches]
            metrics["learner/skipped_rows_frac"] = 1.0 - sum(mb.n_rows for mb in minibatches) / max(batch.n_rows, 1)
        t3 = time.time()
        async with self._sync_lock:  # a revive re-forming the weight group waits for the publish
            if self._sleep_engines:
                await asyncio.gather(*[w.sleep() for w in self._live_workers()])
            metrics.update(await self.learner.train_step(minibatches))
            metrics.update(self.method.after_train_step(step, metrics))
            if self._sleep_engines:
                await asyncio.gather(*[w.wake_up() for w in self._live_workers()])
            t4 = time.time()
            version = step + 1
            try:
                sync_m = await self._publish(version)
            except WeightSyncError as e:
                # Never go on: the workers would keep sampling with stale (or no) weights. This
                # ends run(): the rollout loops are cancelled and run_training frees the actors.
                # The step itself trained: checkpoint it (a resumed run publishes its weights first).
                cause = getattr(e, "cause", None) or e  # a Ray task error wraps the receiver's own
                where = await self._checkpoint_after_failed_sync(version)
                raise WeightSyncError(
                    f"stopping the run: syncing the weights of step {version} failed ({cause}); {where}"
                ) from e
        t5 = time.time()
        st.step = self._published = version
        metrics.update(credit.metrics)
        metrics.update(sync_m)
        metrics.update(rollout_metrics(groups, self.method.invalid_action_penalty))
        metrics.update(self.buffer.stats.as_metrics())
        metrics.update(
            {
                "faults/restarts": st.restarts,
                "faults/replayed_groups": st.replayed,
                "faults/env_error_episodes": st.env_error_episodes,
                "faults/env_error_groups": st.env_error_groups,
                "rollout/live_workers": len(self.workers) - len(self._away),
            }
        )
        self._playing(0)  # bring the busy time up to now
        busy = st.rollout_busy_s - self._busy_counted
        window = t5 - self._window_start  # since the last step ended (a validation included)
        self._busy_counted, self._window_start = st.rollout_busy_s, t5
        metrics.update(step_timing([t0, t1, t2, t3, t4, t5], busy, window, groups, step))
        return metrics


async def _cancel_all(tasks: list[asyncio.Task], grace_s: float = 60.0) -> None:
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
