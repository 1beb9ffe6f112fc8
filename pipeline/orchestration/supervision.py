"""Supervision: what the controller does when an actor dies or an env fails a group.

A rollout worker or the scorer whose process died is restarted by Ray; ``_revive`` waits for it
and gives it the current weights (the last packet, or with collective sync a new weight group
formed around its new process and a broadcast). A group whose env failed every episode is played
again from its seed, ``MAX_ENV_ERROR_REPLAYS`` times in a row at most.

A rollout worker Ray cannot restart now (its node is gone and no node has room) need not stop the
run: while ``rollout.min_workers`` remain, the worker is set *away* (``_worker_lost``): the
groups it would play go to the others, the weight group (collective sync) is formed again around
the survivors, an event and ``rollout/live_workers`` say the run is degraded, and a task waits for
Ray to place it again (a node joins) and brings it back with the current weights (``_rejoin``).

A mixin of ``Controller`` (``pipeline/orchestration/controller.py``): it reads the controller's
``cfg``, ``state``, ``events``, ``learner``, ``workers``, ``scorer``, ``_published``,
``_sync_lock``, ``_env_error_streak``, ``_away``, ``_joining`` and ``_rejoins``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from actors.handles import ActorDied
from pipeline.core.errors import first_line
from pipeline.core.types import EpisodeGroup
from pipeline.distributed.weight_sync import WeightSyncError

MAX_ENV_ERROR_REPLAYS = 3  # a training task whose env fails every episode this often in a row stops the run


class Supervision:
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

    # ----- rollout workers: degraded while one is away ---------------------------------------------
    def _live_workers(self) -> list:
        """The workers that take the weights: those not away, and one rejoining (it takes the
        current weights before it plays again)."""
        return [w for i, w in enumerate(self.workers) if i not in self._away or i in self._joining]

    def _worker_for(self, slot: int):
        """The worker of a rollout loop (or validation task) ``slot``: its own, or while that one
        is away, one of the others (they play several groups at once)."""
        own = slot % len(self.workers)
        if own not in self._away:
            return self.workers[own]
        live = [i for i in range(len(self.workers)) if i not in self._away]
        return self.workers[live[slot % len(live)]]

    def _set_away(self, died: ActorDied) -> bool:
        """Whether the run goes on without this dead worker: it already is away, or at least
        ``rollout.min_workers`` others remain (then it is set away now, and ``_rejoin`` waits for
        it). False: the caller must wait for it (and the run stops if it does not come back)."""
        idx = next((i for i, w in enumerate(self.workers) if w is died.handle), None)
        if idx in self._joining:  # died again while rejoining: wait for it once more
            self._joining.discard(idx)
            self._rejoins.append(asyncio.create_task(self._rejoin(idx, died), name=f"rejoin{idx}"))
        if idx is None or idx in self._away:
            return idx is not None
        live = len(self.workers) - len(self._away) - 1
        if died.handle.generation > died.generation or live < self._min_workers:
            return False  # back already, or too few would remain
        self._away.add(idx)
        name, n = died.handle.name, len(self.workers)
        self.events.record(
            "degraded", step=self.state.step, actor=name, live_workers=live, min_workers=self._min_workers
        )
        print(
            f"privy-rl: {name} lost ({first_line(died.cause)[:200]}); going on with {live} of {n} rollout "
            f"workers (rollout.min_workers={self._min_workers}) until Ray can place it again",
            file=sys.stderr,
            flush=True,
        )
        self._rejoins.append(asyncio.create_task(self._rejoin(idx, died), name=f"rejoin{idx}"))
        return True

    async def _worker_lost(self, died: ActorDied) -> None:
        """A rollout worker died mid-group (the caller replays the group): set it away, or wait
        for Ray to restart it as for any actor."""
        if any(w is died.handle for i, w in enumerate(self.workers) if i in self._away):
            return  # another of its loops (or a publish) set it away already
        if not self._set_away(died):
            await self._revive(died)  # not back in time: the run stops with a checkpoint
        elif self._collective:  # the group has a dead member: form it again around the survivors
            async with self._sync_lock:
                await self._reform_group(died)

    async def _rejoin(self, idx: int, died: ActorDied) -> None:
        """Wait as long as it takes for Ray to restart worker ``idx`` (a node with room joined),
        then give it the current weights and take it back."""
        try:
            if await died.handle.revive(died.generation, None, forever=True):
                self._record_restart(died)
        except RuntimeError as e:  # Ray will not restart it (cluster.max_restarts used up)
            self.events.record("worker_gone", step=self.state.step, actor=died.handle.name, cause=first_line(e)[:300])
            return
        async with self._sync_lock:  # not while a step publishes: it must end up with the published weights
            self._joining.add(idx)  # in the weight group from now on, playing only once it has the weights
            try:
                if self._collective:
                    await self._reform_group(died)
                    await self._publish(self._published)
                elif getattr(self.learner, "last_packet", None) is not None:
                    await died.handle.set_weights(self.learner.last_packet)
                back = idx in self._joining  # not found dead again meanwhile (_set_away)
            finally:
                self._joining.discard(idx)
            if not back:
                return
            self._away.discard(idx)
        self.events.record(
            "worker_back", step=self.state.step, actor=died.handle.name, live_workers=len(self._live_workers())
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
        await self._reform_group(died)
        return True

    async def _reform_group(self, died: ActorDied) -> None:
        """(Collective sync; the caller holds the sync lock.) A new weight group of the learner,
        the workers not away and the scorer; a member found dead meanwhile is brought back first."""
        while True:
            try:
                await self.learner.reform_weight_group(self._live_workers(), self.scorer)
                break
            except ActorDied as again:
                if await again.handle.revive(again.generation, None):
                    self._record_restart(again)
        self.events.record(
            "weight_group_reformed", step=self.state.step, actor=died.handle.name, workers=len(self._live_workers())
        )

    def _record_restart(self, died: ActorDied) -> None:
        self.state.restarts += 1
        self.events.record("restart", step=self.state.step, actor=died.handle.name, cause=first_line(died.cause)[:300])

    async def _publish(self, version: int) -> dict[str, float]:
        """Publish ``version``; a consumer that dies during a collective broadcast is brought back
        into a new group and the broadcast is repeated (the learner's weights are unchanged by a
        failed one), at most ``cluster.max_restarts`` + 1 times."""
        for attempt in range(self.cfg.cluster.max_restarts + 1):  # noqa: B007 - counted in the error below
            try:
                return await self.learner.publish(version, self._live_workers(), self.scorer)
            except ActorDied as died:
                self.events.record("sync_retry", step=self.state.step, version=version, actor=died.handle.name)
                if self._set_away(died):  # the run goes on without it: broadcast to the survivors
                    await self._reform_group(died)
                    continue
                try:
                    await self._revive_into_group(died)
                except RuntimeError as e:  # Ray will not restart it: stop, with a checkpoint
                    raise WeightSyncError(f"weights v{version}: {died}; {first_line(e)}") from e
        raise WeightSyncError(f"weights v{version}: consumers kept dying during the broadcast ({attempt + 1} attempts)")

    async def _score(self, group: EpisodeGroup, slot: int) -> EpisodeGroup:
        """Teacher log-probs for the group; if the scorer dies, the same group once it is back.
        On the engine route (``scorer.placement=engine``) rollout worker ``slot``'s engine scores
        (a lost one is handled as any lost worker, and another scores)."""
        t0 = time.time()
        while True:
            engine = self._worker_for(slot) if self.scorer.on_engine else None
            try:
                [group], m = await self.scorer.score([group], self.state.step, self._published, engine=engine)
                break
            except ActorDied as e:
                await (self._worker_lost(e) if self.scorer.on_engine else self._revive(e))
        group.teacher_seconds += time.time() - t0
        group.teacher_prompt_tokens += m["teacher/prompt_tokens_sum"]
        return group
