"""A stop with a deadline (SIGTERM and ``trainer.stop_grace_s``) with in-process FAKE workers and a
FAKE learner and checkpointer: the step in progress is finished when it can be, abandoned when it
cannot (its groups go back to the buffer), and the last completed step is always checkpointed.
The real signal on a real run: tests/integration/test_cli.py."""

import asyncio
import time

import pytest
from test_controller_with_fake_workers import FakeLearner, FakeWorker, make_cfg

from pipeline.core.types import Episode, EpisodeGroup, TurnRecord
from pipeline.methods import build_method
from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.controller import Controller
from pipeline.orchestration.logging import MetricsLogger


class SlowAfter(FakeWorker):
    """A FAKE worker whose groups take ``slow`` seconds once it has played ``fast`` of them."""

    def __init__(self, fast: int, slow: float):
        super().__init__(0.01)
        self.fast, self.slow, self.played = fast, slow, 0

    async def run_group(self, **kw):
        self.played += 1
        self.delay = 0.01 if self.played <= self.fast else self.slow
        return await super().run_group(**kw)


class FakeCheckpointer:
    """A FAKE checkpointer: records each saved step and what the buffer held then."""

    def __init__(self, seconds: float = 0.0):
        self.saved, self.seconds = [], seconds

    async def save(self, step, learner, run_state):
        await asyncio.sleep(self.seconds)
        self.saved.append((step, run_state["buffer"]))
        return f"step_{step}"


def controller(cfg, worker, learner, checkpointer):
    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    return Controller(
        cfg, learner=learner, workers=[worker], method=method, logger=MetricsLogger([]), checkpointer=checkpointer
    )


async def stop_when(ctl, ready, grace: float):
    while not ready():
        await asyncio.sleep(0.005)
    ctl.request_stop(deadline=time.monotonic() + grace)


def test_fake_a_deadline_the_step_cannot_meet_abandons_it_and_checkpoints_the_last_completed_step():
    cfg = make_cfg(lag=0, steps=50)
    cfg.trainer.ckpt_every = 0
    worker, learner, ckpt = SlowAfter(fast=4, slow=30.0), FakeLearner(0.0), FakeCheckpointer()
    ctl = controller(cfg, worker, learner, ckpt)

    async def main():
        stopper = asyncio.create_task(stop_when(ctl, lambda: ctl.state.step == 2 and worker.played >= 6, 0.2))
        t0 = time.monotonic()
        history = await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return history, time.monotonic() - t0

    history, seconds = asyncio.run(main())
    assert seconds < 5  # not the 30 s a slow group takes: the step was abandoned at the deadline
    assert ctl.state.step == 2 and len(history) == 2 and len(learner.trained_versions) == 2
    assert ctl.abandoned_step == 3
    assert [s for s, _ in ckpt.saved] == [2]
    # the groups of step 3 in flight are replayed by a resumed run from their task indices
    assert sorted(ctl.state.in_flight) == [4, 5]


def test_fake_a_deadline_during_the_update_keeps_the_update_and_checkpoints_that_step():
    cfg = make_cfg(lag=0, steps=50)
    cfg.trainer.ckpt_every = 0
    worker, learner, ckpt = FakeWorker(0.01), FakeLearner(0.5), FakeCheckpointer()
    ctl = controller(cfg, worker, learner, ckpt)

    async def main():
        # the learner is inside step 2's update (its second train_step call has begun)
        stopper = asyncio.create_task(stop_when(ctl, lambda: len(learner.trained_versions) == 2, 0.05))
        history = await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return history

    history = asyncio.run(main())
    assert ctl.state.step == 2 and len(history) == 2 and ctl.abandoned_step is None
    assert [s for s, _ in ckpt.saved] == [2]


@pytest.mark.parametrize("deadline", [True, False])
def test_fake_a_deadline_skips_a_due_validation_a_ctrl_c_does_not(deadline):
    cfg = make_cfg(lag=0, steps=50)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.ckpt_every = 1, 2, 0
    worker, learner, ckpt = FakeWorker(0.01), FakeLearner(0.3), FakeCheckpointer()
    ctl = controller(cfg, worker, learner, ckpt)

    async def stop_in_the_first_update():
        while len(learner.trained_versions) < 1:
            await asyncio.sleep(0.005)
        ctl.request_stop(deadline=time.monotonic() + 30 if deadline else None)

    async def main():
        stopper = asyncio.create_task(stop_in_the_first_update())
        history = await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return history

    history = asyncio.run(main())
    assert len(history) == 1 and [s for s, _ in ckpt.saved] == [1]
    assert any(k.startswith("val/") for k in history[0]) == (not deadline)


def _group(seed: int) -> EpisodeGroup:
    turn = TurnRecord(
        prompt_ids=[1], response_ids=[2], behaviour_logprobs=[-1.0], policy_version=0, turn_index=0, messages=[]
    )
    return EpisodeGroup(
        task_id="t",
        seed=seed,
        episodes=[Episode(task_id="t", env_name="fake", seed=seed, turns=[turn], reward=1.0, won=True)],
    )


def test_give_back_undoes_the_last_take_so_a_checkpoint_keeps_its_groups():
    async def main():
        buf = GroupBuffer(groups_per_step=2, max_policy_lag=1)
        for seed in range(3):
            await buf.put(await buf.acquire_start(), _group(seed))
        before = (buf.state_dict(), buf.stats.as_metrics(), buf.in_flight, len(buf))
        taken = await buf.take(2, learner_version=0)
        assert [g.seed for g in taken] == [0, 1] and len(buf) == 1
        assert await buf.give_back() == 2
        after = (buf.state_dict(), buf.stats.as_metrics(), buf.in_flight, len(buf))
        assert after == before
        assert await buf.give_back() == 0  # only the last take, once
        assert [g.seed for g in await buf.take(2, learner_version=0)] == [0, 1]

    asyncio.run(main())


def test_a_take_cancelled_while_waiting_gives_back_nothing_of_an_earlier_take():
    async def main():
        buf = GroupBuffer(groups_per_step=1, max_policy_lag=0)
        await buf.put(await buf.acquire_start(), _group(0))
        await buf.take(1, learner_version=0)
        waiting = asyncio.create_task(buf.take(1, learner_version=1))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await buf.give_back() == 0 and len(buf) == 0

    asyncio.run(main())


class SlowValidation(FakeWorker):
    """A FAKE worker whose validation groups (any split but ``train``) take ``slow`` seconds."""

    def __init__(self, slow: float):
        super().__init__(0.01)
        self.slow, self.validating = slow, 0

    async def run_group(self, **kw):
        val = kw["split"] != "train"
        self.validating += val
        self.delay = self.slow if val else 0.01
        return await super().run_group(**kw)


def test_fake_a_deadline_during_a_validation_puts_it_off_to_the_resumed_run():
    """A validation can take minutes (64 Search-QA questions: 2-10 min on 2 cores) against a grace
    of 30 s: a stop with a deadline during the one of step 2 cancels it and saves step 2 with the
    validation pending; the resumed run validates step 2 first (a row of its own), then trains on."""
    from dataclasses import asdict

    from pipeline.orchestration.controller import ControllerState

    cfg = make_cfg(lag=0, steps=4)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.ckpt_every = 2, 2, 0
    worker, learner, ckpt = SlowValidation(slow=30.0), FakeLearner(0.0), FakeCheckpointer()
    ctl = controller(cfg, worker, learner, ckpt)

    async def main(ctl):
        stopper = asyncio.create_task(stop_when(ctl, lambda: worker.validating > 0, 2.0))
        t0 = time.monotonic()
        await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return time.monotonic() - t0

    assert asyncio.run(main(ctl)) < 5  # not the 30 s of the validation
    assert ctl.state.step == 2 and ctl.state.val_pending == 2 and [s for s, _ in ckpt.saved] == [2]
    assert not ctl.final_skipped and not any("val/success" in m for m in ctl.history)

    rows = []
    logger = MetricsLogger([])
    logger.log = lambda metrics, step: rows.append((step, dict(metrics)))
    fast = SlowValidation(slow=0.01)
    state = ControllerState(**asdict(ctl.state))
    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    resumed = Controller(
        cfg, learner=FakeLearner(0.0), workers=[fast], method=method, logger=logger, checkpointer=FakeCheckpointer(),
        state=state, buffer_state=ctl.buffer.state_dict(),
    )  # fmt: skip
    asyncio.run(asyncio.wait_for(resumed.run(), timeout=10))
    assert [s for s, m in rows if "val/success" in m] == [2, 4]  # step 2's put-off validation, then step 4's
    assert rows[0][0] == 2 and "learner/loss" not in rows[0][1]  # a row of its own, before step 3 trains
    assert [s for s, m in rows if "learner/loss" in m] == [3, 4]
    assert resumed.state.step == 4 and resumed.state.val_pending is None


def test_fake_a_deadline_during_the_first_validation_ends_the_run_at_once():
    """Nothing is trained before the step-0 validation, so a stop with a deadline cancels it."""
    cfg = make_cfg(lag=0, steps=4)
    cfg.trainer.val_at_start, cfg.trainer.val_tasks = True, 2
    worker, ckpt = SlowValidation(slow=30.0), FakeCheckpointer()
    ctl = controller(cfg, worker, FakeLearner(0.0), ckpt)

    async def main():
        stopper = asyncio.create_task(stop_when(ctl, lambda: worker.validating > 0, 2.0))
        t0 = time.monotonic()
        await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return time.monotonic() - t0

    assert asyncio.run(main()) < 5
    assert ctl.state.step == 0 and ckpt.saved == [] and ctl.history == []
