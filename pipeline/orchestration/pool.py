"""The weight consumers as one object: the rollout workers (lost, degraded, back) and the scorer.

A rollout worker or the scorer whose process died is restarted by Ray; ``revive`` waits for it
and gives it the current weights (the last packet, or with collective sync a new weight group
formed around its new process and a broadcast).

A rollout worker Ray cannot restart now (its node is gone and no node has room) need not stop the
run: while ``rollout.min_workers`` remain, the worker is set *away* (``lost``): the groups it
would play go to the others (``worker_for``), the weight group (collective sync) is formed again
around the survivors, an event and ``rollout/live_workers`` say the run is degraded, and a task
waits for Ray to place it again (a node joins) and brings it back with the current weights.

``sync_lock`` orders a training step and its publish against a weight group being formed again:
whoever re-forms the group must end up with the published weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from pipeline.core.config import PrivyConfig
from pipeline.core.errors import ActorDied, first_line
from pipeline.core.types import EpisodeGroup
from pipeline.distributed.weight_sync import WeightSyncError
from pipeline.orchestration.logging import EventLog


class WorkerPool:
    """``counters`` is the run's ``ControllerState``: the pool reads its ``step`` (for events) and
    counts ``restarts`` in it (checkpointed with it)."""

    def __init__(self, cfg: PrivyConfig, workers: list, *, learner, scorer, events: EventLog, counters):
        self.workers, self.learner, self.scorer, self.events = workers, learner, scorer, events
        self.counters = counters
        self.max_restarts = cfg.cluster.max_restarts
        self.min_workers = cfg.rollout.min_workers or len(workers)
        self.published = counters.step  # consumers must hold at least these weights
        self.away: set[int] = set()  # workers lost that the run goes on without
        self.joining: set[int] = set()  # ... placed again, taking the current weights
        self.rejoins: list[asyncio.Task] = []  # ... each waiting for Ray to place it again
        self.sync_lock = asyncio.Lock()
        # Colocated vLLM engines free their GPU memory while the learner trains (lag 0 only:
        # then no group is in flight during the train step).
        r = cfg.rollout
        self.sleep_engines = cfg.cluster.colocate and r.engine == "vllm" and r.vllm.enable_sleep_mode

    # ----- who plays ---------------------------------------------------------------------------------
    def live(self) -> list:
        """The workers that take the weights: those not away, and one rejoining (it takes the
        current weights before it plays again)."""
        return [w for i, w in enumerate(self.workers) if i not in self.away or i in self.joining]

    def worker_for(self, slot: int):
        """The worker of a rollout loop (or validation task) ``slot``: its own, or while that one
        is away, one of the others (they play several groups at once)."""
        own = slot % len(self.workers)
        if own not in self.away:
            return self.workers[own]
        live = [i for i in range(len(self.workers)) if i not in self.away]
        return self.workers[live[slot % len(live)]]

    @property
    def n_live(self) -> int:
        return len(self.workers) - len(self.away)

    @contextlib.asynccontextmanager
    async def engines_asleep(self):
        if self.sleep_engines:
            await asyncio.gather(*[w.sleep() for w in self.live()])
        try:
            yield
        finally:
            if self.sleep_engines:
                await asyncio.gather(*[w.wake_up() for w in self.live()])

    # ----- deaths ------------------------------------------------------------------------------------
    async def lost(self, died: ActorDied) -> None:
        """A rollout worker died mid-group (the caller replays what it lost): set it away, or wait
        for Ray to restart it as for any actor."""
        if any(w is died.handle for i, w in enumerate(self.workers) if i in self.away):
            return  # another of its loops (or a publish) set it away already
        if not self._set_away(died):
            await self.revive(died)  # not back in time: the run stops with a checkpoint
        elif self._collective:  # the group has a dead member: form it again around the survivors
            async with self.sync_lock:
                await self._reform_group(died)

    async def revive(self, died: ActorDied) -> None:
        """Wait for Ray to restart the actor that died and give it the current weights: the last
        packet in the object store, or (collective sync) a new weight group and a broadcast."""
        if not self._collective or not died.handle.wants_weights:
            if await died.handle.revive(died.generation, getattr(self.learner, "last_packet", None)):
                self._record_restart(died)
            return
        async with self.sync_lock:  # not while a step trains or publishes: the group must carry the published version
            if await self._revive_into_group(died):
                await self.publish(self.published)

    def _set_away(self, died: ActorDied) -> bool:
        """Whether the run goes on without this dead worker: it already is away, or at least
        ``rollout.min_workers`` others remain (then it is set away now, and ``_rejoin`` waits for
        it). False: the caller must wait for it (and the run stops if it does not come back)."""
        idx = next((i for i, w in enumerate(self.workers) if w is died.handle), None)
        if idx in self.joining:  # died again while rejoining: wait for it once more
            self.joining.discard(idx)
            self.rejoins.append(asyncio.create_task(self._rejoin(idx, died), name=f"rejoin{idx}"))
        if idx is None or idx in self.away:
            return idx is not None
        live = self.n_live - 1
        if died.handle.generation > died.generation or live < self.min_workers:
            return False  # back already, or too few would remain
        self.away.add(idx)
        name, n = died.handle.name, len(self.workers)
        self.events.record(
            "degraded", step=self.counters.step, actor=name, live_workers=live, min_workers=self.min_workers
        )
        print(
            f"privy-rl: {name} lost ({first_line(died.cause)[:200]}); going on with {live} of {n} rollout "
            f"workers (rollout.min_workers={self.min_workers}) until Ray can place it again",
            file=sys.stderr,
            flush=True,
        )
        self.rejoins.append(asyncio.create_task(self._rejoin(idx, died), name=f"rejoin{idx}"))
        return True

    async def _rejoin(self, idx: int, died: ActorDied) -> None:
        """Wait as long as it takes for Ray to restart worker ``idx`` (a node with room joined),
        then give it the current weights and take it back."""
        try:
            if await died.handle.revive(died.generation, None, forever=True):
                self._record_restart(died)
        except RuntimeError as e:  # Ray will not restart it (cluster.max_restarts used up)
            self.events.record(
                "worker_gone", step=self.counters.step, actor=died.handle.name, cause=first_line(e)[:300]
            )
            return
        async with self.sync_lock:  # not while a step publishes: it must end up with the published weights
            self.joining.add(idx)  # in the weight group from now on, playing only once it has the weights
            try:
                if self._collective:
                    await self._reform_group(died)
                    await self.publish(self.published)
                elif getattr(self.learner, "last_packet", None) is not None:
                    await died.handle.set_weights(self.learner.last_packet)
                back = idx in self.joining  # not found dead again meanwhile (_set_away)
            finally:
                self.joining.discard(idx)
            if not back:
                return
            self.away.discard(idx)
        live = len(self.live())
        self.events.record("worker_back", step=self.counters.step, actor=died.handle.name, live_workers=live)

    @property
    def _collective(self) -> bool:
        return getattr(self.learner, "weight_group", None) is not None

    async def _revive_into_group(self, died: ActorDied) -> bool:
        """(Collective sync; the caller holds the sync lock.) Bring the actor back and re-form the
        weight group around its new process. False when someone else already had revived it."""
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
                await self.learner.reform_weight_group(self.live(), self.scorer)
                break
            except ActorDied as again:
                if await again.handle.revive(again.generation, None):
                    self._record_restart(again)
        self.events.record(
            "weight_group_reformed", step=self.counters.step, actor=died.handle.name, workers=len(self.live())
        )

    def _record_restart(self, died: ActorDied) -> None:
        self.counters.restarts += 1
        self.events.record(
            "restart", step=self.counters.step, actor=died.handle.name, cause=first_line(died.cause)[:300]
        )

    # ----- weights and the teacher -------------------------------------------------------------------------
    async def publish(self, version: int) -> dict[str, float]:
        """Publish ``version``; a consumer that dies during a collective broadcast is brought back
        into a new group and the broadcast is repeated (the learner's weights are unchanged by a
        failed one), at most ``cluster.max_restarts`` + 1 times."""
        for attempt in range(self.max_restarts + 1):  # noqa: B007 - counted in the error below
            try:
                out = await self.learner.publish(version, self.live(), self.scorer)
                self.published = version
                return out
            except ActorDied as died:
                self.events.record("sync_retry", step=self.counters.step, version=version, actor=died.handle.name)
                if self._set_away(died):  # the run goes on without it: broadcast to the survivors
                    await self._reform_group(died)
                    continue
                try:
                    await self._revive_into_group(died)
                except RuntimeError as e:  # Ray will not restart it: stop, with a checkpoint
                    raise WeightSyncError(f"weights v{version}: {died}; {first_line(e)}") from e
        raise WeightSyncError(f"weights v{version}: consumers kept dying during the broadcast ({attempt + 1} attempts)")

    async def score(self, group: EpisodeGroup, slot: int) -> EpisodeGroup:
        """Teacher log-probs for the group; if whoever scores dies, the same group once it is
        back. The scorer is handed rollout worker ``slot`` (its route may score on that worker's
        engine); a lost worker is handled as any lost worker, a lost scorer actor is revived."""
        t0 = time.time()
        while True:
            try:
                [group], m = await self.scorer.score(
                    [group], self.counters.step, self.published, worker=self.worker_for(slot)
                )
                break
            except ActorDied as e:
                await (self.lost(e) if e.handle in self.workers else self.revive(e))
        group.teacher_seconds += time.time() - t0
        group.teacher_prompt_tokens += m["teacher/prompt_tokens_sum"]
        return group
