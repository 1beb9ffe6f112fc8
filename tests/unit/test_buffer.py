"""GroupBuffer: admission bound, deadline schedule (no group is ever dropped), bookkeeping (plain asyncio)."""

import asyncio
import itertools
import random

import pytest

from pipeline.core.types import Episode, EpisodeGroup, TurnRecord
from pipeline.orchestration.buffer import GroupBuffer


def group(version: int, task: str = "t", won: bool = False, turns: int = 1) -> EpisodeGroup:
    rows = [
        TurnRecord(
            prompt_ids=[1],
            response_ids=[2],
            behaviour_logprobs=[-0.1],
            policy_version=version,
            turn_index=i,
            messages=[],
        )
        for i in range(turns)
    ]
    return EpisodeGroup(
        task_id=task, seed=0, episodes=[Episode(task_id=task, env_name="x", seed=0, turns=rows, won=won)]
    )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_lag_zero_admits_exactly_one_step_of_groups_until_weights_sync():
    async def main():
        buf = GroupBuffer(groups_per_step=2, max_policy_lag=0)
        a, b = await buf.acquire_start(), await buf.acquire_start()
        assert not buf.may_start()
        assert (a.deadline, b.deadline) == (0, 0)
        await buf.set_synced_version(1)
        assert buf.may_start()
        assert (await buf.acquire_start()).deadline == 1

    run(main())


def test_lag_one_admits_two_steps_ahead_with_deadlines_one_step_later():
    async def main():
        buf = GroupBuffer(groups_per_step=3, max_policy_lag=1)
        tickets = [await buf.acquire_start() for _ in range(6)]
        assert not buf.may_start()
        assert {t.deadline for t in tickets} == {1}

    run(main())


def test_take_waits_for_a_slow_group_that_is_due_instead_of_dropping_it():
    async def main():
        buf = GroupBuffer(groups_per_step=1, max_policy_lag=1)
        slow, fast = await buf.acquire_start(), await buf.acquire_start()  # both due by step 1
        await buf.put(fast, group(0, "fast"))
        step0 = await buf.take(1, learner_version=0)  # nothing is due yet: the fast group trains
        assert [g.task_id for g in step0] == ["fast"]
        await buf.set_synced_version(1)
        later = await buf.acquire_start()  # deadline 2
        await buf.put(later, group(1, "later"))
        waiting = asyncio.create_task(buf.take(1, learner_version=1))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the slow group is due at step 1: the buffer waits for it
        await buf.put(slow, group(0, "slow"))
        assert [g.task_id for g in await waiting] == ["slow"]
        assert buf.stats.waited_for_due == 1 and buf.stats.lag_hist == {0: 1, 1: 1}

    run(main())


def test_a_fill_that_would_make_two_groups_due_at_once_is_refused():
    async def main():
        # gps 1, lag 2: tickets 0, 1, 2 all due by step 2. Filling steps 0 and 1 with later
        # tickets while 0 and 1 are in flight would leave two due at step 2.
        buf = GroupBuffer(groups_per_step=1, max_policy_lag=2)
        t = [await buf.acquire_start() for _ in range(3)]
        await buf.put(t[2], group(0, "t2"))
        assert [g.task_id for g in await buf.take(1, learner_version=0)] == ["t2"]
        await buf.set_synced_version(1)
        t3 = await buf.acquire_start()  # deadline 3
        await buf.put(t3, group(1, "t3"))
        waiting = asyncio.create_task(buf.take(1, learner_version=1))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # taking t3 now would leave t0 and t1 both due at step 2
        await buf.put(t[1], group(0, "t1"))
        assert [g.task_id for g in await waiting] == ["t1"]

    run(main())


def test_released_tickets_free_their_slot():
    async def main():
        buf = GroupBuffer(groups_per_step=1, max_policy_lag=0)
        t = await buf.acquire_start()
        assert not buf.may_start()
        await buf.release_start(t)
        assert buf.may_start() and buf.in_flight == 0

    run(main())


@pytest.mark.parametrize("seed", range(20))
def test_random_completion_orders_never_drop_a_group_or_exceed_the_lag(seed):
    """Workers finish groups in random order with random durations; the trainer takes n per step.
    Every started group is trained exactly once, within the lag, and no deadline is missed."""
    rng = random.Random(seed)
    n, lag, steps = rng.choice([1, 2, 3]), rng.choice([0, 1, 2, 3]), 12

    async def main():
        buf = GroupBuffer(groups_per_step=n, max_policy_lag=lag)
        counter = itertools.count()
        trained: list[tuple[int, str]] = []

        async def worker():
            while True:
                ticket = await buf.acquire_start()
                name = f"g{next(counter)}"
                await asyncio.sleep(rng.choice([0.0, 0.001, 0.003, 0.02]))
                await buf.put(ticket, group(ticket.version, name))

        workers = [asyncio.create_task(worker()) for _ in range(rng.choice([1, 2, 4]))]
        for step in range(steps):
            got = await buf.take(n, learner_version=step)
            assert len(got) == n
            for g in got:
                assert step - g.min_version <= lag
                trained.append((step, g.task_id))
            await buf.set_synced_version(step + 1)
        for w in workers:
            w.cancel()
        names = [name for _, name in trained]
        assert len(names) == len(set(names)) == steps * n

    run(main())


def test_generated_and_trained_profiles_are_logged():
    async def main():
        buf = GroupBuffer(groups_per_step=1, max_policy_lag=0)
        t = await buf.acquire_start()
        await buf.put(t, group(0, won=True, turns=3))
        await buf.take(1, learner_version=0)
        m = buf.stats.as_metrics()
        assert m["groups/generated_success"] == m["groups/trained_success"] == 1.0
        assert m["groups/generated_turns"] == m["groups/trained_turns"] == 3.0

    run(main())


def test_state_dict_round_trip_keeps_complete_groups_their_deadlines_and_counters():
    async def main():
        buf = GroupBuffer(groups_per_step=2, max_policy_lag=1)
        a, b = await buf.acquire_start(), await buf.acquire_start()
        await buf.put(a, group(1, "a"))  # b is in flight at the checkpoint: replayed on resume
        state = buf.state_dict()
        other = GroupBuffer(groups_per_step=2, max_policy_lag=1)
        other.load_state_dict(state, version=2)
        assert len(other) == 1 and other.started == 5 and other.synced_version == 2
        assert (await other.acquire_start()).index == b.index + 1
        assert [g.task_id for g in await other.take(1, learner_version=2)] == ["a"]

    run(main())


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        GroupBuffer(groups_per_step=0, max_policy_lag=0)
