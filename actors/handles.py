"""Async handles the controller drives: Ray actors in a run, plain objects in tests.

The controller only awaits ``run_group`` / ``train_step`` / ``publish`` / ``save`` / ``load``
(tests drive it with in-process fakes of the same surface).
"""

from __future__ import annotations

import asyncio
import math
import time

from actors.learner_loss import actor_id, learner_failure
from pipeline.algorithm.metrics import combine, values
from pipeline.core.errors import ActorDied, LearnerHung, LearnerLost, WeightsLost, first_line
from pipeline.core.microbatch import split_rows
from pipeline.core.types import TrainBatch
from pipeline.distributed.weight_sync import WeightSyncError

# ----- actors Ray restarts -----------------------------------------------------------------------


def _is_death(e: BaseException, actor=None) -> bool:
    """Whether ``e`` says that ``actor`` died. A call whose argument another actor failed to
    make (a weight packet of a learner that died) fails with THAT actor's death: not this one's."""
    import ray.exceptions as rx

    if isinstance(e, WeightsLost):
        return True
    if not isinstance(e, rx.RayActorError):
        return False
    mine = actor_id(actor)
    return e.actor_id is None or mine is None or e.actor_id == mine


class Restartable:
    """What a consumer handle needs to survive its actor's death: calls that turn the death into
    ``ActorDied``, and ``revive``, which waits for Ray's new process and gives it the last
    published weights (a fresh process holds the initial ones)."""

    wants_weights = True
    restart_timeout_s = 900.0  # a restart reloads the model (vLLM: minutes on a busy node)

    def _init_restartable(self, actor, name: str) -> None:
        self.actor, self.name = actor, name
        self.generation = 0  # deaths revived so far
        self._revive_lock: asyncio.Lock | None = None
        self._killed = -1  # the generation killed as hung (every call that timed out saw it)

    async def _call(self, method: str, *a, **kw):
        gen = self.generation
        try:
            return await getattr(self.actor, method).remote(*a, **kw)
        except Exception as e:
            if _is_death(e, self.actor):
                raise ActorDied(self, gen, e) from e
            raise

    async def _call_within(self, timeout_s: float, setting: str, method: str, *a, **kw):
        """``_call`` that counts the actor as hung after ``timeout_s`` (0 = never): a hung process
        answers nothing, so it cannot be asked to stop. It is killed, once for all the calls that
        timed out, and Ray restarts it like any dead actor (``cluster.max_restarts``)."""
        if not timeout_s:
            return await self._call(method, *a, **kw)
        gen = self.generation
        try:
            return await asyncio.wait_for(self._call(method, *a, **kw), timeout_s)
        except asyncio.TimeoutError:
            if self._killed < gen == self.generation:
                import ray

                self._killed = gen
                ray.kill(self.actor, no_restart=False)
            cause = TimeoutError(f"no answer to {method} within {setting}={timeout_s:g} s: killed as hung")
            raise ActorDied(self, gen, cause) from None

    async def revive(self, generation: int, weights, *, forever: bool = False) -> bool:
        """Bring the actor back after the death seen at ``generation``; ``weights`` is the last
        published packet's ref (None: the initial weights are current, or the caller gives them).
        Ray gets ``restart_timeout_s`` to restart it, or with ``forever`` as long as it takes (a
        worker whose node is gone comes back once a node with room joins). Returns whether this
        call restored it (False: another caller already had). Raises RuntimeError when Ray will
        not restart it (``cluster.max_restarts`` used up) or it is not back in time."""
        import ray.exceptions as rx

        self._revive_lock = self._revive_lock or asyncio.Lock()
        async with self._revive_lock:
            if self.generation > generation:
                return False
            deadline = math.inf if forever else time.monotonic() + self.restart_timeout_s
            while True:  # calls made while Ray restarts it wait or report it unavailable
                try:
                    await self.actor.hardware.remote()
                    break
                except rx.ActorUnavailableError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{self.name} did not come back within {self.restart_timeout_s:g} s of dying"
                        ) from None
                    await asyncio.sleep(1.0)
                except rx.RayActorError as e:
                    raise RuntimeError(
                        f"{self.name} died and Ray will not restart it (cluster.max_restarts used up): {e}"
                    ) from None
            if weights is not None and self.wants_weights:
                await self.actor.set_weights.remote(weights)
            self.generation += 1
            return True

    async def set_weights(self, packet_or_ref) -> int | None:
        """None when the actor died: ``revive`` gives its new process the weights."""
        try:
            return await self._call("set_weights", packet_or_ref)
        except ActorDied:
            return None

    # The collective route: a death raises ActorDied, so the group is re-formed around its new process.
    async def init_weight_group(self, *a, **kw) -> int:
        return await self._call("init_weight_group", *a, **kw)

    async def receive_weights(self, version: int) -> int:
        return await self._call("receive_weights", version)


# ----- rollout -----------------------------------------------------------------------------------
class RayRollout(Restartable):
    def __init__(self, actor, name: str = "rollout worker", group_timeout_s: float = 0.0):
        self._init_restartable(actor, name)
        self.group_timeout_s = group_timeout_s  # rollout.group_timeout_s (0 = never)

    async def run_group(self, **kw):
        return await self._call_within(self.group_timeout_s, "rollout.group_timeout_s", "run_group", **kw)

    async def score(self, items, plain, needs, min_version: int, micro_batch_tokens, timeout_s: float = 0.0):
        """The self-teacher's forward on this worker's engine (scorer.placement=engine)."""
        return await self._call_within(
            timeout_s, "scorer.timeout_s", "score", items, plain, needs, min_version, micro_batch_tokens
        )

    async def sleep(self) -> None:
        await self.actor.sleep.remote()

    async def wake_up(self) -> None:
        await self.actor.wake_up.remote()


# ----- learner -----------------------------------------------------------------------------------
class LearnerGroup:
    """M learner ranks forming one data-parallel group; rank 0 publishes weights.

    ``ranks`` are Ray actor handles of ``LearnerActor``. Rows of every mini-batch are sharded
    contiguously across ranks.
    """

    def __init__(self, ranks: list, pad_id: int, call_timeout_s: float = 0.0, node_ids: list[str] | None = None):
        self.ranks = ranks
        self.node_ids = node_ids  # the Ray node of each rank, to name it when it is lost
        self.pad_id = pad_id
        self.call_timeout_s = call_timeout_s  # learner.call_timeout_s (0 = never)
        self.weight_group: dict | None = None  # set by init_weight_group: publish broadcasts
        self.last_packet = None  # the object-store ref of the last published weights
        self.death_grace_s = 10.0  # after a failed broadcast, how long to wait for a member's death notice
        self._packet_nbytes: int | None = None

    async def train_step(self, minibatches: list[TrainBatch]) -> dict[str, float]:
        n = len(self.ranks)
        shards = [[split_rows(mb, n)[r] for mb in minibatches] for r in range(n)]
        results = await self._answers(
            "train_step",
            {f"learner rank {r}": rk.train_step.remote(sh) for r, (rk, sh) in enumerate(zip(self.ranks, shards))},
        )
        return combine_rank_metrics(results)

    async def _answers(self, what: str, calls: dict) -> list:
        """Await ``calls`` (who -> awaitable) together, like ``gather``; after ``call_timeout_s``
        without every answer, raise LearnerHung naming who did not answer. A hung rank (or a
        consumer that takes no weights) would otherwise hang the whole run silently."""
        tasks = {who: asyncio.ensure_future(c) for who, c in calls.items()}
        done, pending = await asyncio.wait(
            tasks.values(), timeout=self.call_timeout_s or None, return_when=asyncio.FIRST_EXCEPTION
        )
        failed = [t for t in tasks.values() if t in done and t.exception() is not None]
        for t in pending:  # the run stops: nothing waits for the rest
            t.cancel()
        if failed:
            who = next(w for w, t in tasks.items() if t is failed[0])
            raise await self._lost(who, failed[0].exception())
        if pending:
            silent = [who for who, t in tasks.items() if t in pending]
            raise self._hung(f"{what}: no answer from {', '.join(silent)}")
        return [t.result() for t in tasks.values()]

    async def _lost(self, who: str, e: BaseException) -> BaseException:
        return await learner_failure(who, e, self.ranks, self.node_ids)

    def _hung(self, what: str) -> LearnerHung:
        return LearnerHung(
            f"{what} within learner.call_timeout_s={self.call_timeout_s:g} s; stopping the run "
            f"(resume it from its last checkpoint: trainer.resume=RUN_DIR)"
        )

    @staticmethod
    def _consumers(workers: list, scorer) -> list:
        """Who receives weights: every rollout worker, and the teacher's own copy of the policy
        (``TeacherScorer.consumer``: a scorer actor that follows the policy), if there is one."""
        consumer = scorer.consumer if scorer is not None else None
        return [*workers, *([consumer] if consumer is not None else [])]

    async def init_weight_group(
        self, workers: list, scorer=None, *, backend: str = "auto", bucket_mb: int = 256, timeout_s: float | None = None
    ) -> dict:
        """Form the collective weight group (``cluster.weight_sync=collective``): learner rank 0
        is group rank 0 and broadcasts; the consumers are ranks 1..N. From then on ``publish``
        broadcasts instead of going through the object store.

        Every member blocks in its init until all have joined, so all calls are launched at once
        and awaited together, under a timeout: a member that never joins fails the setup instead
        of hanging the run.
        """
        from pipeline.distributed.collective_sync import DEFAULT_TIMEOUT_S

        timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        consumers = self._consumers(workers, scorer)
        metas = await asyncio.gather(*[rk.sync_meta.remote() for rk in self.ranks])  # ZeRO-3: all
        host, port, backend = await self.ranks[0].weight_group_endpoint.remote(backend)
        world, bucket_bytes = 1 + len(consumers), int(bucket_mb) * 2**20
        calls = [
            rk.init_weight_group.remote(host, port, world, backend, bucket_bytes=bucket_bytes, timeout_s=timeout_s)
            for rk in self.ranks
        ]
        calls += [
            c.init_weight_group(host, port, i + 1, world, backend, metas[0], bucket_bytes, timeout_s)
            for i, c in enumerate(consumers)
        ]
        try:
            # A little longer than the members' own timeout, so their error (if any) comes first.
            await asyncio.wait_for(asyncio.gather(*calls), timeout_s + 30)
        except asyncio.TimeoutError:
            raise WeightSyncError(
                f"the weight group at {host}:{port} ({backend}, {world} members) "
                f"did not form within {timeout_s + 30:g} s"
            ) from None
        self.weight_group = {
            "host": host,
            "port": port,
            "backend": backend,
            "world_size": world,
            "bucket_bytes": bucket_bytes,
            "n_tensors": len(metas[0]),
            "timeout_s": timeout_s,
            "bucket_mb": bucket_mb,
        }
        return self.weight_group

    async def reform_weight_group(self, workers: list, scorer=None) -> dict:
        """A torch.distributed group cannot take a restarted process back: every member (learner
        rank 0 and all consumers, the new process among them) joins a new group on a fresh store,
        with the same settings. The old group objects are dropped. A consumer that died meanwhile
        raises ActorDied."""
        wg = self.weight_group
        return await self.init_weight_group(
            workers, scorer, backend=wg["backend"], bucket_mb=wg["bucket_mb"], timeout_s=wg["timeout_s"]
        )

    async def publish(self, version: int, workers: list, scorer=None) -> dict[str, float]:
        if self.weight_group is not None:
            return await self._publish_collective(version, workers, scorer)
        t0 = time.time()
        # Every rank takes part (ZeRO-3 gathers collectively); rank 0's packet is put once in the
        # object store and read by every consumer.
        refs = [rk.weight_packet.remote(version) for rk in self.ranks]
        ref = self.last_packet = refs[0]  # kept: a restarted consumer gets it (Restartable.revive)
        calls = {getattr(c, "name", "consumer"): c.set_weights(ref) for c in self._consumers(workers, scorer)}
        calls.update({f"learner rank {r}": x for r, x in enumerate(refs[1:], start=1)})
        try:
            await self._answers(f"publishing weights v{version}", calls)
        except LearnerHung:
            if not _object_ready(ref):  # the consumers wait for rank 0's packet: name rank 0
                raise self._hung(f"publishing weights v{version}: learner rank 0 made no weight packet") from None
            raise
        out = {"sync/seconds": time.time() - t0, "sync/version": version}
        if self._packet_nbytes is None:  # the size never changes: ask rank 0 once
            [self._packet_nbytes] = await self._answers(
                "packet_nbytes", {"learner rank 0": self.ranks[0].packet_nbytes.remote()}
            )
        out["sync/bytes"] = float(self._packet_nbytes)
        return out

    async def _publish_collective(self, version: int, workers: list, scorer) -> dict[str, float]:
        t0 = time.time()
        consumers = self._consumers(workers, scorer)
        if len(consumers) + 1 != self.weight_group["world_size"]:
            raise WeightSyncError(
                f"weights v{version}: {len(consumers)} consumers, but the weight "
                f"group was formed with {self.weight_group['world_size'] - 1}"
            )
        # All ranks (ZeRO-3 gathers collectively) and all receivers at once: a broadcast completes
        # only when every member is in it. A receiver raises WeightSyncError on a bad sync.
        sends = [rk.broadcast_weights.remote(version) for rk in self.ranks]
        recvs = [c.receive_weights(version) for c in consumers]
        names = [f"learner rank {r}" for r in range(len(sends))] + [getattr(c, "name", "consumer") for c in consumers]
        # Every member times out on its own (sync_timeout_s); the driver waits a little longer, so
        # a member that died or stalled ends the run with its name instead of hanging it.
        limit = self.weight_group["timeout_s"] + 30
        tasks = [asyncio.ensure_future(x) for x in (*sends, *recvs)]
        done, pending = await asyncio.wait(tasks, timeout=limit, return_when=asyncio.FIRST_EXCEPTION)
        if pending and any(t.exception() is not None for t in done):
            # One member's failure is often another's death, seen first ("connection closed by
            # peer"): give Ray a moment to report it, so a restartable death is told apart.
            more, pending = await asyncio.wait(pending, timeout=self.death_grace_s)
            done |= more
        for t in pending:  # the run stops: nothing waits for the rest
            t.cancel()
        failed = [(n, t.exception()) for n, t in zip(names, tasks) if t in done and t.exception() is not None]
        for name, err in failed:  # a learner rank that died: the broadcast cannot be repeated
            lost = await self._lost(name, err)
            if isinstance(lost, LearnerLost):
                raise lost
        died = [err for _, err in failed if isinstance(err, ActorDied)]
        if died:  # the learner's broadcast failed with it: the controller re-forms the group and retries
            raise died[0]
        if failed:
            name, err = failed[0]
            if isinstance(err, WeightSyncError):
                raise err
            raise WeightSyncError(f"weights v{version}: {name} failed: {first_line(err)}") from err
        if pending:
            raise WeightSyncError(
                f"weights v{version}: {', '.join(n for n, t in zip(names, tasks) if t in pending)} "
                f"did not finish the broadcast within {limit:g} s"
            )
        stats = tasks[0].result()
        return {
            "sync/seconds": time.time() - t0,
            "sync/version": version,
            "sync/gbps": stats["gbps"],
            "sync/bytes": stats["bytes"],
            "sync/buckets": stats["buckets"],
        }

    async def save(self, ckpt_dir: str) -> None:
        await self._answers(
            "save_checkpoint",
            {f"learner rank {r}": rk.save_checkpoint.remote(ckpt_dir) for r, rk in enumerate(self.ranks)},
        )

    async def load(self, ckpt_dir: str) -> int:
        versions = await self._answers(
            "load_checkpoint",
            {f"learner rank {r}": rk.load_checkpoint.remote(ckpt_dir) for r, rk in enumerate(self.ranks)},
        )
        return versions[0]


def _object_ready(ref) -> bool:
    """Whether a Ray object exists yet (not fetched here: a weight packet is large); True for
    anything else (test fakes)."""
    import ray

    if not isinstance(ref, ray.ObjectRef):
        return True
    ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
    return bool(ready)


def combine_rank_metrics(results: list[dict[str, tuple[float, str]]]) -> dict[str, float]:
    """Per-rank step metrics -> the whole batch's, each by its own reduction (token means
    averaged: every rank normalises by the global count; the token count summed; the slowest
    rank's seconds; lr and grad norm are global already)."""
    out = values(combine(results))
    out["learner/tokens_per_s"] = out["learner/tokens"] / max(out["learner/seconds"], 1e-9)
    return out
