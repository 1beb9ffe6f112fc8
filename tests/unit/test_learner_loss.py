"""Whose death a Ray error reports (actors/learner_loss.py, actors/handles.py): a consumer whose call
failed because the learner died making its argument (the weight packet) is not dead itself, and
the learner group names the rank by the actor id in the error. FAKE handles carry actor ids."""

from __future__ import annotations

import asyncio

import ray.exceptions as rx

from actors.handles import _is_death
from actors.learner_loss import learner_failure
from pipeline.core.errors import LearnerLost, NonFiniteWeights


class _Id:
    def __init__(self, h: str):
        self.h = h

    def hex(self) -> str:
        return self.h


class FakeActor:
    def __init__(self, h: str):
        self._actor_id = _Id(h)


def _died(h: str | None) -> rx.RayActorError:
    return rx.RayActorError(actor_id=h, error_msg="The actor died unexpectedly before finishing this task.")


def test_a_call_failed_by_another_actors_death_is_not_a_death_of_the_callee():
    worker = FakeActor("aa")
    assert _is_death(_died("aa"), worker)
    assert not _is_death(_died("bb"), worker)  # the learner that made the packet died
    assert _is_death(_died(None), worker) and _is_death(_died("bb"), object())  # unknown: a death, as before


def test_the_learner_group_names_the_rank_whose_death_a_consumer_saw():
    ranks = [FakeActor("r0"), FakeActor("r1")]
    lost = asyncio.run(learner_failure("rollout worker 0", _died("r1"), ranks, None))
    assert isinstance(lost, LearnerLost) and str(lost).startswith("learner rank 1 died:")
    other = _died("zz")
    assert asyncio.run(learner_failure("rollout worker 0", other, ranks, None)) is other


def test_non_finite_weights_come_out_of_rays_wrapper_as_they_are():
    wrapped = rx.RayTaskError("weight_packet", "trace", NonFiniteWeights("the weights after step 4: 3 of 9 ..."))
    out = asyncio.run(learner_failure("rollout worker 0", wrapped, [FakeActor("r0")], None))
    assert type(out) is NonFiniteWeights and str(out) == "the weights after step 4: 3 of 9 ..."
