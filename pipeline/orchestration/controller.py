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
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from actors.handles import ActorDied, LearnerLost
from pipeline.core.config import PrivyConfig
from pipeline.core.errors import first_line
from pipeline.core.microbatch import slice_rows
from pipeline.core.types import EpisodeGroup, criterion_pass_rates
from pipeline.distributed.weight_sync import WeightSyncError
from pipeline.orchestration.batches import build_train_batch, drop_silent_rows, minibatch_bounds, rows_of
from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.logging import EventLog, OutcomeLog
from pipeline.orchestration.stopping import StopRequest


class Aborted(Exception):
    """A second stop request: the run ended without finishing its step."""


class NonFiniteTraining(RuntimeError):
    """``trainer.max_skipped_steps`` updates in a row were discarded for non-finite gradients."""


MAX_ENV_ERROR_REPLAYS = 3  # a training task whose env fails every episode this often in a row stops the run


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


class Controller:
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
    ):
        self.cfg = cfg
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
        rollouts = [
            asyncio.create_task(self._rollout_loop(self.workers[i % len(self.workers)]), name=f"rollout{i}")
            for i in range(n_loops)
        ]
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
            await _cancel_all([trainer, *rollouts])
        if self.aborted:
            raise Aborted(f"aborted during step {self.state.step + 1} (a second stop request)")
        return self.history

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

    def _next_task_index(self) -> int:
        if self._retry:
            return self._retry.pop(0)
        idx = self.state.next_task
        self.state.next_task += 1
        return idx

    async def _rollout_loop(self, worker) -> None:
        cfg, st = self.cfg, self.state
        while True:  # cancelled by run() once the train loop has ended
            ticket = await self.buffer.acquire_start()
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
                    group = await self._score(group)
            except ActorDied as e:
                # The worker's process died mid-group: nothing of the group is kept; the task is
                # played again, first, from its seed, once Ray has restarted the worker.
                await self.buffer.release_start(ticket)
                st.in_flight.remove(idx)
                self._retry.insert(0, idx)
                st.replayed += 1
                self.events.record("replay", step=st.step, task=idx, actor=e.handle.name)
                await self._revive(e)
                continue
            except BaseException:
                await self.buffer.release_start(ticket)
                raise
            finally:
                self._playing(-1)
            st.in_flight.remove(idx)
            await self.buffer.put(ticket, group)

    def _drop_env_errors(self, group: EpisodeGroup, idx: int) -> bool:
        """Leave out the episodes their env cut short (an env exception or timeout is not the
        policy's failure: training on it would push down innocent turns), so the group's
        statistics are over the episodes the env completed. False: none was completed, the task
        must be played again (counted; ``MAX_ENV_ERROR_REPLAYS`` in a row stop the run)."""
        errors = [e.error for e in group.episodes if e.error]
        if not errors:
            self._env_error_streak.pop(idx, None)
            return True
        st = self.state
        st.env_error_episodes += len(errors)
        group.episodes = [e for e in group.episodes if not e.error]
        self.events.record(
            "env_error", step=st.step, task=idx, episodes=len(errors), kept=len(group.episodes), error=errors[0][:200]
        )
        if group.episodes:
            self._env_error_streak.pop(idx, None)
            return True
        st.env_error_groups += 1
        n = self._env_error_streak[idx] = self._env_error_streak.get(idx, 0) + 1
        if n >= MAX_ENV_ERROR_REPLAYS:
            raise RuntimeError(
                f"stopping the run: every episode of training task {idx} ended in an env error, "
                f"{n} times in a row; the last: {errors[0][:300]}"
            )
        return False

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

    @property
    def _collective(self) -> bool:
        return getattr(self.learner, "weight_group", None) is not None

    async def _revive(self, died: ActorDied) -> None:
        """Wait for Ray to restart the actor that died and give it the current weights: the last
        packet in the object store, or (collective sync) a new weight group and a broadcast."""
        if not self._collective or not died.handle.wants_weights:
            if await died.handle.revive(died.generation, getattr(self.learner, "last_packet", None)):
                self._record_restart(died)
            return
        # Not while a step trains or publishes: the new group must carry the published version.
        async with self._sync_lock:
            if await self._revive_into_group(died):
                await self._publish(self._published)

    async def _revive_into_group(self, died: ActorDied) -> bool:
        """(Collective sync; the caller holds the sync lock.) Bring the actor back and re-form the
        weight group around its new process; another consumer found dead meanwhile is brought
        back too. False when someone else already had revived it."""
        if not await died.handle.revive(died.generation, None):
            return False
        self._record_restart(died)
        while True:
            try:
                await self.learner.reform_weight_group(self.workers, self.scorer)
                break
            except ActorDied as again:
                if await again.handle.revive(again.generation, None):
                    self._record_restart(again)
        self.events.record("weight_group_reformed", step=self.state.step, actor=died.handle.name)
        return True

    def _record_restart(self, died: ActorDied) -> None:
        self.state.restarts += 1
        self.events.record("restart", step=self.state.step, actor=died.handle.name, cause=first_line(died.cause)[:300])

    async def _publish(self, version: int) -> dict[str, float]:
        """Publish ``version``; a consumer that dies during a collective broadcast is brought back
        into a new group and the broadcast is repeated (the learner's weights are unchanged by a
        failed one), at most ``cluster.max_restarts`` + 1 times."""
        for attempt in range(self.cfg.cluster.max_restarts + 1):  # noqa: B007 - counted in the error below
            try:
                return await self.learner.publish(version, self.workers, self.scorer)
            except ActorDied as died:
                self.events.record("sync_retry", step=self.state.step, version=version, actor=died.handle.name)
                try:
                    await self._revive_into_group(died)
                except RuntimeError as e:  # Ray will not restart it: stop, with a checkpoint
                    raise WeightSyncError(f"weights v{version}: {died}; {first_line(e)}") from e
        raise WeightSyncError(f"weights v{version}: consumers kept dying during the broadcast ({attempt + 1} attempts)")

    async def _score(self, group: EpisodeGroup) -> EpisodeGroup:
        """Teacher log-probs for the group; if the scorer dies, the same group once it is back."""
        t0 = time.time()
        while True:
            try:
                [group], m = await self.scorer.score([group], self.state.step, self._published)
                break
            except ActorDied as e:
                await self._revive(e)
        group.teacher_seconds += time.time() - t0
        group.teacher_prompt_tokens += m["teacher/prompt_tokens_sum"]
        return group

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
            hurry = self._stop.deadline is not None  # a validation could outlast the grace
            if t.val_every and (step % t.val_every == 0 or step == t.total_steps) and not halt and not hurry:
                metrics.update(await self._validate(step))
            if step == t.total_steps and not halt:
                if hurry:
                    self.final_skipped = True
                else:
                    metrics.update(await self._final_validation(step))
            due = (t.ckpt_every and step % t.ckpt_every == 0) or step == t.total_steps
            if self.checkpointer is not None and (due or halt or self._stop.is_set()):
                metrics["time/checkpoint_s"] = await self._save(step)
            # New groups may start only now: at lag 0 nothing is in flight at the checkpoint.
            if step < t.total_steps and not self._stop.is_set():
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
            groups = [
                g
                if all(
                    r.teacher_logprobs is not None or not self.scorer.spec.selects(e, r)
                    for e in g.episodes
                    for r in e.turns
                )
                else await self._score(g)
                for g in groups
            ]
            metrics.update(teacher_metrics(groups, self.scorer.wants_weights))
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
                await asyncio.gather(*[w.sleep() for w in self.workers])
            metrics.update(await self.learner.train_step(minibatches))
            metrics.update(self.method.after_train_step(step, metrics))
            if self._sleep_engines:
                await asyncio.gather(*[w.wake_up() for w in self.workers])
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
            }
        )
        self._playing(0)  # bring the busy time up to now
        step_s, busy = t5 - t0, st.rollout_busy_s - self._busy_counted
        window = t5 - self._window_start  # since the last step ended (a validation included)
        self._busy_counted, self._window_start = st.rollout_busy_s, t5
        gen_tokens = sum(g.n_generated_tokens for g in groups)
        gen_seconds = sum(g.rollout_seconds for g in groups)
        metrics.update(
            {
                "time/step_s": step_s,
                "time/wait_rollout_s": t1 - t0,
                "time/wait_teacher_s": t2 - t1,
                "time/credit_s": t3 - t2,
                "time/train_s": t4 - t3,
                "time/sync_s": t5 - t4,
                "time/learner_idle_frac": (t1 - t0 + t2 - t1) / max(step_s, 1e-9),
                "time/rollout_idle_frac": max(0.0, 1.0 - busy / max(window, 1e-9)),
                # tokens of the groups trained this step over the wall time the rollout side was busy
                # (groups in flight overlap: summing their own seconds would count the same second twice)
                "rollout/tokens_per_s": gen_tokens / max(busy, 1e-9),
                "rollout/group_seconds": gen_seconds / max(len(groups), 1),
                "sync/step_fraction": (t5 - t4) / max(step_s, 1e-9),
                "rollout/policy_lag_max": step - min(g.min_version for g in groups),
            }
        )
        return metrics

    async def _validate(self, step: int, notify_method: bool = True, split: str | None = None) -> dict[str, float]:
        """Held-out tasks at each validation temperature (0 = greedy), one episode per task, from
        ``env.val_split`` (logged as val/...) or ``split`` (a final split: final/<split>/...).

        For a method with a teacher, the first temperature's tasks are played once more with the
        teacher's privileged context in the student's own prompt (feedback: that of the first
        attempt's failed criteria): ``val/privileged_success`` and ``val/privilege_gap``, the
        teacher's headroom over the student (RetireOPD's SR_T when the teacher learns too)."""
        cfg = self.cfg
        t0 = time.time()
        pre = f"final/{split}" if split else "val"
        split = split or cfg.env.val_split
        out: dict[str, float] = {}
        first: list[EpisodeGroup] = []
        for temp in cfg.rollout.val_temperatures:
            groups = await self._play_validation(temp, [self.method.student_view()] * cfg.trainer.val_tasks, split)
            tag = "greedy" if temp == 0 else f"t{temp:g}"
            self.outcomes.write(pre, step, tag, [g.episodes[0] for g in groups])
            m = rollout_metrics(groups, self.method.invalid_action_penalty)
            out.update({k.replace("rollout/", f"{pre}/{tag}/", 1): v for k, v in m.items()})
            if temp == cfg.rollout.val_temperatures[0]:
                out[f"{pre}/success"] = m["rollout/success"]
                first, tag0 = groups, tag
        privileged = None
        views = [self.method.privileged_view(g.episodes[0]) for g in first]
        if any(v is not None for v in views):
            groups = await self._play_validation(cfg.rollout.val_temperatures[0], views, split, keep=first)
            self.outcomes.write(f"{pre}/privileged", step, tag0, [g.episodes[0] for g in groups])
            privileged = rollout_metrics(groups, self.method.invalid_action_penalty)["rollout/success"]
            out[f"{pre}/privileged_success"] = privileged
            gap = out[f"{pre}/privilege_gap"] = privileged - out[f"{pre}/success"]
            if gap <= 0:
                print(
                    f"privy-rl: step {step}: privilege gap {gap:+.3f} <= 0 on {split}: with its context the "
                    f"policy does no better, so the teacher has nothing to distil yet",
                    file=sys.stderr,
                    flush=True,
                )
        if notify_method:  # a method's windows (RetireOPD) count validations after training steps only
            out.update(self.method.on_validation(step, out.get("val/success", 0.0), privileged))
        out[f"time/{pre}_s"] = time.time() - t0
        return out

    async def _final_validation(self, step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for split in self.cfg.trainer.final_val_splits:
            out.update(await self._validate(step, notify_method=False, split=split))
        return out

    async def _play_validation(
        self, temperature: float, views: list, split: str, keep: list | None = None
    ) -> list[EpisodeGroup]:
        """One episode per validation task of ``split``; a task whose view is None keeps ``keep``'s
        episode (it has no privileged context: its privileged outcome is its plain one)."""

        async def one(i: int, view):
            if view is None and keep is not None:
                return keep[i]
            while True:  # a worker that dies mid-episode plays it again once restarted
                try:
                    return await self.workers[i % len(self.workers)].run_group(
                        task_seed=i,
                        split=split,
                        group_size=1,
                        temperature=temperature,
                        sample_seed=10_000 + i,
                        view=view,
                        min_version=self._published,
                    )
                except ActorDied as e:
                    self.events.record("replay", step=self.state.step, task=f"val{i}", actor=e.handle.name)
                    await self._revive(e)

        return list(await asyncio.gather(*[one(i, v) for i, v in enumerate(views)]))


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


def teacher_metrics(groups: list[EpisodeGroup], self_teacher: bool) -> dict[str, float]:
    """The scorer's work on the step's groups (done while they completed, off the learner's path)."""
    rows = [r for g in groups for r in g.rows()]
    scored = [r for r in rows if r.teacher_logprobs is not None]
    out = {
        "teacher/seconds": sum(g.teacher_seconds for g in groups),
        "teacher/rows_scored_frac": len(scored) / max(len(rows), 1),
        "teacher/prompt_tokens": sum(g.teacher_prompt_tokens for g in groups) / max(len(scored), 1),
    }
    if scored and self_teacher:
        out["teacher/staleness"] = sum(r.teacher_version - r.policy_version for r in scored) / len(scored)
    out.update(gap_statistics("teacher", [(r.teacher_logprobs, r.behaviour_logprobs) for r in scored]))
    out.update(
        gap_statistics(
            "noise",
            [(r.plain_teacher_logprobs, r.behaviour_logprobs) for r in scored if r.plain_teacher_logprobs is not None],
        )
    )
    return out


def gap_statistics(prefix: str, pairs: list[tuple[list[float], list[float]]]) -> dict[str, float]:
    """Per-token gap ``lpT - lp_behaviour`` over every token of ``pairs``: mean, std, mean |gap| and
    the fraction below 0. With ``noise`` (the teacher on the student's own prompt) beside
    ``teacher`` (on the privileged one), what the privileged context adds stands against what
    two forwards of the same weights differ by anyway."""
    gaps = [t - b for lpt, lpb in pairs for t, b in zip(lpt, lpb)]
    if not gaps:
        return {}
    n = len(gaps)
    mean = sum(gaps) / n
    return {
        f"{prefix}/gap_mean": mean,
        f"{prefix}/gap_std": (sum((g - mean) ** 2 for g in gaps) / max(n - 1, 1)) ** 0.5,
        f"{prefix}/gap_abs_mean": sum(abs(g) for g in gaps) / n,
        f"{prefix}/negative_gap_fraction": sum(g < 0 for g in gaps) / n,
    }


def rollout_metrics(groups: list[EpisodeGroup], invalid_penalty: float) -> dict[str, float]:
    """Reward, success (overall and per task type), valid-action rate, turns, response length, and
    each rubric criterion's pass rate over the episodes judged on it (a criterion moves long before
    task success, which needs all of them)."""
    eps = [e for g in groups for e in g.episodes]
    rows = [t for e in eps for t in e.turns]
    n_eps, n_rows = max(len(eps), 1), max(len(rows), 1)
    out: dict[str, Any] = {
        "rollout/reward": sum(e.reward for e in eps) / n_eps,
        "rollout/success": sum(e.won for e in eps) / n_eps,
        "rollout/valid_action_rate": sum(t.action_valid for t in rows) / n_rows,
        "rollout/turns_per_episode": len(rows) / n_eps,
        "rollout/response_tokens": sum(t.n_response for t in rows) / n_rows,
        "rollout/prompt_truncated_frac": sum(t.truncated_prompt for t in rows) / n_rows,
        "rollout/row_score": sum(_row_score(e.reward, t.action_valid, invalid_penalty) for e in eps for t in e.turns)
        / n_rows,
        "rollout/env_errors": float(sum(bool(e.error) for e in eps)),
    }
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in eps:
        if e.task_type:
            by_type[e.task_type].append(e.won)
    for tt, wins in by_type.items():
        out[f"rollout/success/{tt}"] = sum(wins) / len(wins)
    out.update({f"rollout/criteria/{name}": rate for name, rate in criterion_pass_rates(eps).items()})
    return out


def _row_score(reward: float, valid: bool, penalty: float) -> float:
    return reward - (0.0 if valid else penalty)
