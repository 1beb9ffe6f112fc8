"""``learner.call_timeout_s``: the driver's calls to the learner ranks (and the weight publish to
the consumers) end with a named error instead of hanging. FAKE ranks and consumers (plain
objects with ``.remote``) stand in for the Ray actors; a real run is in tests/integration."""

import asyncio

import pytest

from actors.handles import LearnerGroup, LearnerHung
from pipeline.core.config import ConfigError, PrivyConfig, validate
from pipeline.orchestration.stopping import cancel_all


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a, **kw):
        return self.fn(*a, **kw)


async def _never(*_a, **_kw):
    await asyncio.Event().wait()


def _ready(value):
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


class FakeRank:
    """A learner rank whose every call answers after ``delay`` s (None: never)."""

    def __init__(self, delay: float | None = 0.0, error: Exception | None = None):
        async def answer(value, *_a, **_kw):
            if delay is None:
                await _never()
            await asyncio.sleep(delay)
            if error is not None:
                raise error
            return value

        metrics = {"learner/loss": (0.5, "mean"), "learner/tokens": (4.0, "sum"), "learner/seconds": (1.0, "max")}
        self.train_step = _Method(lambda *a: answer(metrics))
        self.weight_packet = _Method(lambda v: _ready(f"packet v{v}"))  # like an ObjectRef: awaited or not
        self.packet_nbytes = _Method(lambda: answer(123))
        self.save_checkpoint = _Method(lambda d: answer(None))
        self.load_checkpoint = _Method(lambda d: answer(7))


class FakeConsumer:
    def __init__(self, name: str, hangs: bool = False):
        self.name, self.hangs, self.got = name, hangs, []

    async def set_weights(self, ref):
        if self.hangs:
            await _never()
        self.got.append(ref)
        return 1


def _train(group: LearnerGroup):
    return asyncio.run(group.train_step([]))


def test_a_rank_that_never_answers_a_train_step_is_named():
    group = LearnerGroup([FakeRank(), FakeRank(delay=None)], pad_id=0, call_timeout_s=0.2)
    with pytest.raises(
        LearnerHung,
        match=r"train_step: no answer from learner rank 1 within "
        r"learner\.call_timeout_s=0\.2 s.*trainer\.resume",
    ):
        _train(group)


def test_answers_within_the_timeout_are_combined_and_0_waits_for_a_slow_one():
    for timeout in (5.0, 0.0):
        group = LearnerGroup([FakeRank(delay=0.05), FakeRank()], pad_id=0, call_timeout_s=timeout)
        assert _train(group)["learner/tokens"] == 8.0


def test_a_rank_that_fails_raises_its_own_error_not_a_hang():
    group = LearnerGroup([FakeRank(), FakeRank(error=ValueError("bad batch"))], pad_id=0, call_timeout_s=5.0)
    with pytest.raises(ValueError, match="bad batch"):
        _train(group)


def test_a_consumer_that_takes_no_weights_is_named_and_the_others_get_them():
    ok, stuck = FakeConsumer("rollout worker 0"), FakeConsumer("rollout worker 1", hangs=True)
    group = LearnerGroup([FakeRank()], pad_id=0, call_timeout_s=0.2)
    with pytest.raises(LearnerHung, match=r"publishing weights v3: no answer from rollout worker 1 within"):
        asyncio.run(group.publish(3, [ok, stuck]))
    assert len(ok.got) == 1


def test_publish_save_and_load_answer_within_the_timeout():
    consumers = [FakeConsumer("rollout worker 0"), FakeConsumer("rollout worker 1")]
    group = LearnerGroup([FakeRank(), FakeRank()], pad_id=0, call_timeout_s=5.0)
    out = asyncio.run(group.publish(2, consumers))
    assert out["sync/version"] == 2 and out["sync/bytes"] == 123.0
    assert all(c.got == [group.last_packet] for c in consumers)
    asyncio.run(group.save("/nonexistent"))  # the fake ranks write nothing
    hung = LearnerGroup([FakeRank(delay=None)], pad_id=0, call_timeout_s=0.2)
    with pytest.raises(LearnerHung, match="save_checkpoint: no answer from learner rank 0"):
        asyncio.run(hung.save("/nonexistent"))
    assert asyncio.run(group.load("/nonexistent")) == 7
    with pytest.raises(LearnerHung, match="load_checkpoint: no answer from learner rank 0"):
        asyncio.run(hung.load("/nonexistent"))


def test_a_negative_call_timeout_fails_validation_naming_the_field():
    cfg = PrivyConfig()
    cfg.learner.call_timeout_s = -1.0
    with pytest.raises(ConfigError, match="learner.call_timeout_s"):
        validate(cfg)


def test_cancelling_the_loops_is_bounded_when_one_ignores_its_cancellation(capsys):
    async def stubborn():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(10)  # ignores the first cancellation (asyncio.run's second ends it)

    async def polite():
        await asyncio.sleep(10)

    async def main():
        tasks = [asyncio.create_task(stubborn(), name="rollout0"), asyncio.create_task(polite(), name="train")]
        await asyncio.sleep(0)
        await cancel_all(tasks, grace_s=0.2)
        return tasks

    tasks = asyncio.run(main())
    assert tasks[1].cancelled()
    assert "rollout0 did not stop within 0.2 s" in capsys.readouterr().err
