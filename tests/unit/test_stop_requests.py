"""Repeated stop requests with in-process FAKE workers, learner and checkpointer (the real signals on
a real run: tests/faults/test_stop_signals.py), the start-up's signal handling in this process, and
the prompt ledger (every drawn task trained, buffered or in flight)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from test_controller_with_fake_workers import FakeLearner, make_cfg
from test_stop_grace import FakeCheckpointer, SlowAfter, controller

from pipeline.orchestration.controller import ControllerState
from pipeline.orchestration.prompts import PromptLedger
from pipeline.orchestration.signals import RunStopped, StopSignals, abort_line, ask_to_stop
from pipeline.orchestration.stopping import StopRequest


def test_fake_a_second_request_gives_up_the_step_at_once_and_saves_the_last_trained_one():
    """Ctrl-C first (no deadline: the step would be finished, however long), then a second signal:
    the step still waiting for its groups is given up now and step 2 is saved."""
    cfg = make_cfg(lag=0, steps=50)
    cfg.trainer.ckpt_every = 0
    worker, learner, ckpt = SlowAfter(fast=4, slow=30.0), FakeLearner(0.0), FakeCheckpointer()
    ctl = controller(cfg, worker, learner, ckpt)

    async def main():
        async def signals():
            while not (ctl.state.step == 2 and worker.played >= 6):
                await asyncio.sleep(0.005)
            ask_to_stop(ctl, 30.0, signal.SIGINT, 1)
            await asyncio.sleep(0.2)
            ask_to_stop(ctl, 30.0, signal.SIGINT, 2)

        stopper = asyncio.create_task(signals())
        t0 = time.monotonic()
        await asyncio.wait_for(ctl.run(), timeout=10)
        await stopper
        return time.monotonic() - t0

    assert asyncio.run(main()) < 5  # not the 30 s of the slow groups
    assert ctl.state.step == 2 and ctl.abandoned_step == 3 and not ctl.aborted
    assert [s for s, _ in ckpt.saved] == [2]


def test_fake_a_second_request_during_the_save_lets_it_finish_and_a_third_aborts_it():
    for n in (2, 3):
        cfg = make_cfg(lag=0, steps=50)
        cfg.trainer.ckpt_every = 0
        worker, learner, ckpt = SlowAfter(fast=100, slow=0.0), FakeLearner(0.0), FakeCheckpointer(seconds=1.0)
        ctl = controller(cfg, worker, learner, ckpt)

        async def main(n=n, ctl=ctl):
            async def signals():
                while ctl.state.step < 1:
                    await asyncio.sleep(0.001)
                ask_to_stop(ctl, 600.0, signal.SIGTERM, 1)
                while ctl.saver.saving is None:
                    await asyncio.sleep(0.001)
                for k in range(2, n + 1):
                    ask_to_stop(ctl, 600.0, signal.SIGTERM, k)

            stopper = asyncio.create_task(signals())
            try:
                await asyncio.wait_for(ctl.run(), timeout=10)
            finally:
                await stopper

        if n == 2:
            asyncio.run(main())
            assert [s for s, _ in ckpt.saved] == [ctl.state.step] and ctl.saver.saved_step == ctl.state.step
        else:
            with pytest.raises(Exception, match="aborted"):
                asyncio.run(main())
            step = ctl.state.step
            assert ckpt.saved == [] and ctl.saver.saving == step
            line = abort_line(ctl, "RUN", 50)
            assert line.startswith(f"aborted while saving step {step}:") and line.endswith("; no step is saved"), line


def test_a_deadline_brought_forward_wakes_the_wait_for_the_step():
    async def main():
        stop = StopRequest()
        stop.set(time.monotonic() + 600)
        step = asyncio.create_task(asyncio.sleep(30))
        waiter = asyncio.create_task(stop.finish_or_abandon(step, lambda: False, lambda: 0.0))
        await asyncio.sleep(0.05)
        stop.set(time.monotonic())  # a second signal: now
        stop.set(time.monotonic() + 900)  # a later deadline never pushes it back
        return await asyncio.wait_for(waiter, 2), stop.deadline

    finished, deadline = asyncio.run(main())
    assert finished is False and deadline <= time.monotonic()


def test_a_signal_before_the_controller_stops_the_start_up_with_its_status_and_a_write_is_never_cut():
    with StopSignals() as signals:
        signals.during("the warm start")
        with pytest.raises(RunStopped) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes: here
        assert stopped.value.signum == signal.SIGTERM and "SIGTERM during the warm start" in str(stopped.value)
        written = []
        with pytest.raises(RunStopped):
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                written.append("whole")  # reached: the signal waits for the block's end
        assert written == ["whole"] and signals.first == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) != signals._handle  # put back


def test_the_ledger_keeps_a_task_waiting_for_its_replay_in_flight_for_a_checkpoint():
    st = ControllerState()
    ledger = PromptLedger(st, groups_per_step=2)
    a, b, c = ledger.draw(), ledger.draw(), ledger.draw()
    ledger.buffered(b)
    ledger.replay(a)  # its worker died: a checkpoint now must keep it
    assert st.in_flight == [a, c]
    assert ledger.metrics(buffered=1)["prompts/unaccounted"] == 0
    resumed = PromptLedger(ControllerState(**{**vars(st), "in_flight": list(st.in_flight)}), groups_per_step=2)
    assert [resumed.draw(), resumed.draw(), resumed.draw()] == [a, c, 3]  # replayed first, then new ones
    old = ControllerState(step=4, next_task=9)  # a checkpoint from before the count
    assert PromptLedger(old, groups_per_step=2).metrics(buffered=1)["prompts/trained"] == 8
