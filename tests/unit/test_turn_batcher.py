"""TurnBatcher (actors/turn_batcher.py) around a FAKE engine that records its calls.

The fake stands in for an engine only to test the loop's batching, weight timing and failure
paths; the real HF engine under the batcher is exercised in tests/integration/test_rollout_worker.py.
"""

from __future__ import annotations

import threading

import pytest

from actors.engines.base import FinishReason, Generation
from actors.turn_batcher import Request, Sampling, TurnBatcher

S = Sampling(max_new_tokens=4, temperature=1.0, top_p=1.0)


class FakeEngine:
    def __init__(self, gate: threading.Event | None = None, fail_on_call: int | None = None):
        self.version = 0
        self.calls: list[dict] = []
        self.gate = gate  # when set, each generate waits for it (requests pile up meanwhile)
        self.fail_on_call = fail_on_call
        self.in_generate = False
        self.entered = threading.Event()

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        self.in_generate = True
        self.entered.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(10)
            self.calls.append(
                {
                    "prompts": prompts,
                    "seeds": seeds,
                    "version": self.version,
                    "sampling": (max_new_tokens, temperature, top_p),
                }
            )
            if self.fail_on_call == len(self.calls):
                raise RuntimeError("engine broke")
            return [Generation(token_ids=[len(p)], logprobs=[-0.5], finish_reason=FinishReason.STOP) for p in prompts]
        finally:
            self.in_generate = False


def _batcher(engine, *, max_batch=64, max_tokens=10_000, weights=None) -> TurnBatcher:
    def apply():
        if weights:
            assert not engine.in_generate  # new weights land between generate calls only
            engine.version = weights.pop(0)
            return True
        return False

    return TurnBatcher(engine, max_batch=max_batch, max_tokens=max_tokens, apply_weights=apply)


def _req(n: int, seed: int = 0, sampling: Sampling = S) -> Request:
    return Request(prompt=[1] * n, sampling=sampling, seed=seed)


def test_with_a_fake_engine_requests_queued_during_a_generate_share_the_next_call():
    gate = threading.Event()
    eng = FakeEngine(gate)
    b = _batcher(eng)
    first = _req(3, seed=1)
    b.submit([first])
    assert eng.entered.wait(5)  # the first call is under way, alone
    later = [_req(n, seed=10 + n) for n in (2, 5, 7)]
    for r in later:
        b.submit([r])
    gate.set()
    assert first.future.result(5)[0].token_ids == [3]
    assert [r.future.result(5)[0].token_ids for r in later] == [[2], [5], [7]]
    assert [len(c["prompts"]) for c in eng.calls] == [1, 3]
    assert eng.calls[1]["seeds"] == [12, 15, 17]  # each request keeps its own seed
    assert b.stats.calls == 2 and b.stats.sequences == 4 and b.stats.tokens == 4
    b.close()


def test_with_a_fake_engine_a_call_respects_max_batch_and_the_token_budget():
    gate = threading.Event()
    eng = FakeEngine(gate)
    # budget: 3 sequences of (6 prompt + 4 new) tokens = 30 padded tokens
    b = _batcher(eng, max_batch=4, max_tokens=30)
    b.submit([_req(1)])
    assert eng.entered.wait(5)
    reqs = [_req(6) for _ in range(5)] + [_req(40)]  # the last one alone is over the budget
    b.submit(reqs)
    gate.set()
    for r in reqs:
        r.future.result(5)
    sizes = [len(c["prompts"]) for c in eng.calls]
    assert sizes == [1, 3, 2, 1]  # 3 fit 30 tokens; then 2; the oversized one goes alone
    b.close()


def test_with_a_fake_engine_requests_of_different_sampling_never_share_a_call():
    gate = threading.Event()
    eng = FakeEngine(gate)
    b = _batcher(eng)
    b.submit([_req(1)])
    assert eng.entered.wait(5)
    greedy = Sampling(max_new_tokens=4, temperature=0.0, top_p=1.0)
    mixed = [_req(2), _req(2, sampling=greedy), _req(2), _req(2, sampling=greedy)]
    b.submit(mixed)
    gate.set()
    for r in mixed:
        r.future.result(5)
    assert [c["sampling"][1] for c in eng.calls] == [1.0, 1.0, 0.0]
    assert [len(c["prompts"]) for c in eng.calls] == [1, 2, 2]
    b.close()


def test_with_a_fake_engine_new_weights_load_between_calls_and_each_turn_gets_its_version():
    eng = FakeEngine()
    weights = [1]
    b = _batcher(eng, weights=weights)
    r = _req(2)
    b.submit([r])
    _, version = r.future.result(5)
    assert version == 1 and eng.calls[0]["version"] == 1  # applied before the generate, not under it
    weights.append(2)
    r2 = _req(2)
    b.submit([r2])
    assert r2.future.result(5)[1] == 2
    b.close()


def test_with_a_fake_engine_an_engine_error_fails_its_batch_and_the_loop_goes_on():
    eng = FakeEngine(fail_on_call=1)
    b = _batcher(eng)
    bad = _req(2)
    b.submit([bad])
    with pytest.raises(RuntimeError, match="engine broke"):
        bad.future.result(5)
    ok = _req(3)
    b.submit([ok])
    assert ok.future.result(5)[0].token_ids == [3]
    b.close()


def test_with_a_fake_engine_close_fails_pending_requests_and_refuses_new_ones():
    gate = threading.Event()
    eng = FakeEngine(gate)
    b = _batcher(eng)
    b.submit([_req(1)])
    assert eng.entered.wait(5)
    waiting = _req(2)
    b.submit([waiting])
    closer = threading.Thread(target=b.close)
    closer.start()
    for _ in range(500):  # close() has marked the batcher closed before the first call returns
        if b._closed:
            break
        threading.Event().wait(0.01)
    gate.set()
    closer.join(10)
    with pytest.raises(RuntimeError, match="closed"):
        waiting.future.result(5)
    with pytest.raises(RuntimeError, match="closed"):
        b.submit([_req(1)])


def test_with_a_fake_engine_a_call_waits_for_live_episodes_then_takes_them_together():
    eng = FakeEngine()
    b = TurnBatcher(eng, max_batch=64, max_tokens=10_000, apply_weights=lambda: False, wait_s=30.0)
    b.join(3)  # three episodes in play, all in env calls
    first = _req(2)
    b.submit([first])
    assert not eng.entered.wait(0.3)  # two live episodes are not queued yet: no call
    rest = [_req(3), _req(4)]
    b.submit(rest[:1])
    b.submit(rest[1:])  # every live episode is queued: the call starts at once
    for r in [first, *rest]:
        r.future.result(5)
    assert [len(c["prompts"]) for c in eng.calls] == [3]
    b.close()


def test_with_a_fake_engine_an_ended_or_slow_episode_does_not_hold_the_call_for_ever():
    eng = FakeEngine()
    b = TurnBatcher(eng, max_batch=64, max_tokens=10_000, apply_weights=lambda: False, wait_s=30.0)
    b.join(2)
    r = _req(2)
    b.submit([r])
    b.leave(1)  # the other episode ended: nothing more is coming
    assert r.future.result(5)[0].token_ids == [2]
    short = TurnBatcher(FakeEngine(), max_batch=64, max_tokens=10_000, apply_weights=lambda: False, wait_s=0.05)
    short.join(5)  # live episodes that never ask (a slow env): the call goes after wait_s
    r2 = _req(3)
    short.submit([r2])
    assert r2.future.result(5)[0].token_ids == [3]
    b.close()
    short.close()
