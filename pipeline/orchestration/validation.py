"""Validation: held-out tasks at each validation temperature, and with a teacher's context.

A mixin of ``Controller`` (``pipeline/orchestration/controller.py``): it reads the controller's
``cfg``, ``state``, ``method``, ``workers``, ``events``, ``outcomes`` and ``_published``, and
revives a worker that died mid-episode (``Supervision._revive``).
"""

from __future__ import annotations

import asyncio
import sys
import time

from actors.handles import ActorDied
from pipeline.core.types import EpisodeGroup
from pipeline.orchestration.step_metrics import rollout_metrics


class Validation:
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
                    return await self._worker_for(i).run_group(
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
                    await self._worker_lost(e)

        return list(await asyncio.gather(*[one(i, v) for i, v in enumerate(views)]))
