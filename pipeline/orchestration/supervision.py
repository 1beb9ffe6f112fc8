"""Supervision: what the controller does when an actor dies or an env fails a group.

A rollout worker or the scorer whose process died is restarted by Ray; ``_revive`` waits for it
and gives it the current weights (the last packet, or with collective sync a new weight group
formed around its new process and a broadcast). A group whose env failed every episode is played
again from its seed, ``MAX_ENV_ERROR_REPLAYS`` times in a row at most.

A mixin of ``Controller`` (``pipeline/orchestration/controller.py``): it reads the controller's
``cfg``, ``state``, ``events``, ``learner``, ``workers``, ``scorer``, ``_published``,
``_sync_lock`` and ``_env_error_streak``.
"""

from __future__ import annotations

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
