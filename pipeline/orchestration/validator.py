"""Validation: held-out tasks at each validation temperature, and with a teacher's context.

``validate(step)`` plays ``env.val_split`` (logged as ``val/...``) and tells the method (a
method's windows, RetireOPD's, close on validations after training steps); ``final(step)`` plays
each of ``trainer.final_val_splits`` once (``final/<split>/...``), the test read at the end.
"""

from __future__ import annotations

import asyncio
import sys
import time

from pipeline.core.config import PrivyConfig
from pipeline.core.errors import ActorDied
from pipeline.core.types import EpisodeGroup
from pipeline.orchestration.logging import EventLog, OutcomeLog
from pipeline.orchestration.pool import WorkerPool
from pipeline.orchestration.step_metrics import rollout_metrics


class Validator:
    def __init__(self, cfg: PrivyConfig, pool: WorkerPool, method, *, events: EventLog, outcomes: OutcomeLog):
        self.cfg, self.pool, self.method, self.events, self.outcomes = cfg, pool, method, events, outcomes

    async def validate(
        self, step: int, notify_method: bool = True, split: str | None = None, last: bool = False
    ) -> dict[str, float]:
        """Held-out tasks at each validation temperature (0 = greedy), one episode per task, from
        ``env.val_split`` (logged as val/...) or ``split`` (a final split: final/<split>/...).

        For a method with a teacher, the first temperature's tasks are played once more with the
        teacher's privileged context in the student's own prompt (feedback: that of the first
        attempt's failed criteria): ``val/privileged_success`` and ``val/privilege_gap``, the
        teacher's headroom over the student (RetireOPD's SR_T when the teacher learns too); with
        ``trainer.privileged_val=ends`` only at step 0 and at the ``last`` step (see ``_privileged``)."""
        cfg = self.cfg
        t0 = time.time()
        pre = f"final/{split}" if split else "val"
        split = split or cfg.env.val_split
        penalty = self.method.invalid_action_penalty
        temps = len(cfg.rollout.val_temperatures)
        # a line ending "..." opens a phase: the console says it is still going (pipeline/tools/cli.py)
        print(f"privy-rl: {pre} at step {step}: {cfg.trainer.val_tasks} tasks of {split} x {temps} temperatures...",
              file=sys.stderr, flush=True)  # fmt: skip
        out: dict[str, float] = {}
        first: list[EpisodeGroup] = []
        for temp in cfg.rollout.val_temperatures:
            groups = await self._play(temp, [self.method.student_view()] * cfg.trainer.val_tasks, split)
            tag = "greedy" if temp == 0 else f"t{temp:g}"
            self.outcomes.write(pre, step, tag, [g.episodes[0] for g in groups])
            m = rollout_metrics(groups, penalty)
            out.update({k.replace("rollout/", f"{pre}/{tag}/", 1): v for k, v in m.items()})
            if temp == cfg.rollout.val_temperatures[0]:
                out[f"{pre}/success"] = m["rollout/success"]
                first, tag0 = groups, tag
        privileged = None
        views = [self.method.privileged_view(g.episodes[0]) for g in first] if self._privileged(step, pre, last) else []
        if any(v is not None for v in views):
            groups = await self._play(cfg.rollout.val_temperatures[0], views, split, keep=first)
            self.outcomes.write(f"{pre}/privileged", step, tag0, [g.episodes[0] for g in groups])
            privileged = rollout_metrics(groups, penalty)["rollout/success"]
            out[f"{pre}/privileged_success"] = privileged
            gap = out[f"{pre}/privilege_gap"] = privileged - out[f"{pre}/success"]
            if gap <= 0:
                print(
                    f"privy-rl: step {step}: privilege gap {gap:+.3f} <= 0 on {split}: with its context the "
                    f"policy does no better, so the teacher has nothing to distil yet",
                    file=sys.stderr,
                    flush=True,
                )
        if notify_method:
            out.update(self.method.on_validation(step, out.get("val/success", 0.0), privileged))
        out[f"time/{pre}_s"] = time.time() - t0
        print(f"privy-rl: {pre} at step {step}: success {out[f'{pre}/success']:.3f} in {out[f'time/{pre}_s']:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        return out

    async def at_start(self, stop) -> dict[str, float] | None:
        """The starting point (e.g. the warm start) as step 0, with no steps to train also the final
        splits; None when a stop with a deadline (``stop``) cancels them."""
        t = self.cfg.trainer
        got = await stop.unless_deadline(self.validate(0, notify_method=False)) if t.val_at_start else {}
        return await self._with_final(got, 0, stop) if t.total_steps == 0 else got

    async def due(self, step: int, last: bool, stop) -> dict[str, float] | None:
        """Step ``step``'s due validation (every ``trainer.val_every`` steps and at the ``last``)
        and at the last step the final splits; None when a stop with a deadline (``stop``, a
        ``StopRequest``) comes first: they are cancelled, as one can outlast any grace (64
        Search-QA questions take 2-10 min on 2 cores, a preemption gives 30 s)."""
        t = self.cfg.trainer
        got: dict[str, float] | None = {}
        if t.val_every and (step % t.val_every == 0 or last):
            got = await stop.unless_deadline(self.validate(step, last=last))
        if last:
            got = await self._with_final(got, step, stop)
        if got is None:
            self.events.record("validation_put_off", step=step)
            print(f"privy-rl: the validation of step {step} is put off to the resumed run (a stop with a deadline)",
                  file=sys.stderr, flush=True)  # fmt: skip
        return got

    async def _with_final(self, got: dict[str, float] | None, step: int, stop) -> dict[str, float] | None:
        """``got`` and the final splits, or None when either was cancelled by ``stop``'s deadline."""
        if got is None:
            return None
        final = await stop.unless_deadline(self.final(step))
        return None if final is None else {**got, **final}

    def _privileged(self, step: int, pre: str, last: bool) -> bool:
        """Whether this validation replays its tasks with the teacher's context. Under "ends", the
        gap at the start and at the end of the run (what a method changed of it) costs two replays
        instead of one per validation; SR_T for a retirement rule is never skipped."""
        if self.cfg.trainer.privileged_val == "every":
            return True
        return pre == "val" and (step == 0 or last or self.method.needs_privileged_success)

    async def final(self, step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for split in self.cfg.trainer.final_val_splits:
            out.update(await self.validate(step, notify_method=False, split=split))
        return out

    async def _play(self, temperature: float, views: list, split: str, keep: list | None = None) -> list[EpisodeGroup]:
        """One episode per validation task of ``split``; a task whose view is None keeps ``keep``'s
        episode (it has no privileged context: its privileged outcome is its plain one)."""
        pool = self.pool

        async def one(i: int, view):
            if view is None and keep is not None:
                return keep[i]
            while True:  # a worker that dies mid-episode plays it again once restarted
                try:
                    return await pool.worker_for(i).run_group(
                        task_seed=i,
                        split=split,
                        group_size=1,
                        temperature=temperature,
                        sample_seed=10_000 + i,
                        view=view,
                        min_version=pool.published,
                    )
                except ActorDied as e:
                    self.events.record("replay", step=pool.counters.step, task=f"val{i}", actor=e.handle.name)
                    await pool.lost(e)

        return list(await asyncio.gather(*[one(i, v) for i, v in enumerate(views)]))
