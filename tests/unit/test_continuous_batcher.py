"""ContinuousBatcher (actors/continuous_batcher.py) around a FAKE streaming engine.

The fake stands in for vLLM's request queue only to test the loop: admission into a running
batch, weights landing only when no request is in flight, draining for callers outside the loop,
failures. Each fake request takes ``max_new_tokens`` steps and records the engine version at
every step it ran in. vLLM itself under the batcher: tests/vllm_engine/test_vllm_continuous.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from actors.continuous_batcher import ContinuousBatcher
from actors.engines.base import FinishReason, Generation
from actors.turn_batcher import Request, Sampling


class FakeStreamEngine:
    can_stream = True

    def __init__(self, step_s: float = 0.002):
        self.version = 0
        self.step_s = step_s
        self.live: dict[str, dict] = {}
        self.versions_seen: dict[str, set[int]] = {}
        self.batch_sizes: list[int] = []
        self.stepping = False

    def add(self, rid, prompt, *, max_new_tokens, temperature, top_p, seed):
        if len(prompt) > 50:
            raise ValueError("prompt too long")
        self.live[rid] = {
            "left": max_new_tokens,
            "out": Generation(token_ids=[seed], logprobs=[-0.5], finish_reason=FinishReason.STOP),
        }
        self.versions_seen[rid] = set()

    def add_score(self, rid, prompt, response):
        self.live[rid] = {"left": 1, "out": [-0.25] * len(response)}
        self.versions_seen[rid] = set()

    def step(self):
        self.stepping = True
        time.sleep(self.step_s)
        self.batch_sizes.append(len(self.live))
        done = []
        for rid, r in list(self.live.items()):
            self.versions_seen[rid].add(self.version)
            r["left"] -= 1
            if r["left"] <= 0:
                done.append((rid, self.live.pop(rid)["out"]))
        self.stepping = False
        return done

    def abort(self, ids):
        for rid in ids:
            self.live.pop(rid, None)

    def load(self, version):
        assert not self.live, "weights loaded with a request in flight"
        self.version = version


def _batcher(engine, *, max_batch=64):
    pending: list[int] = []

    def apply():
        if pending:
            engine.load(pending.pop(0))
            return True
        return False

    b = ContinuousBatcher(engine, max_batch=max_batch, apply_weights=apply, weights_pending=lambda: bool(pending))
    return b, pending


def _req(seed: int, tokens: int = 5, prompt_len: int = 3) -> Request:
    return Request(prompt=[1] * prompt_len, sampling=Sampling(tokens, 1.0, 1.0), seed=seed)


def test_with_a_fake_engine_a_late_turn_joins_the_running_batch():
    engine = FakeStreamEngine()
    b, _ = _batcher(engine)
    try:
        long = _req(1, tokens=40)
        b.submit([long])
        time.sleep(0.02)  # the long request is mid-generation
        short = _req(2, tokens=2)
        b.submit([short])
        gen, version = short.future.result(timeout=5)
        assert gen.token_ids == [2] and version == 0
        assert not long.future.done()  # the short turn did not wait for the long one
        assert long.future.result(timeout=5)[0].token_ids == [1]
        assert b.admitted_while_busy >= 1 and max(engine.batch_sizes) == 2
    finally:
        b.close()


def test_with_a_fake_engine_new_weights_wait_for_the_requests_in_flight_and_none_spans_two_versions():
    engine = FakeStreamEngine()
    b, pending = _batcher(engine)
    try:
        first = [_req(i, tokens=20) for i in range(3)]
        b.submit(first)
        time.sleep(0.01)
        pending.append(1)  # weights arrive mid-generation
        late = [_req(10 + i, tokens=3) for i in range(3)]
        b.submit(late)
        assert [r.future.result(timeout=5)[1] for r in first] == [0, 0, 0]
        assert [r.future.result(timeout=5)[1] for r in late] == [1, 1, 1]  # held back until the swap
        assert all(len(v) == 1 for v in engine.versions_seen.values())
    finally:
        b.close()


def test_with_a_fake_engine_scores_run_beside_generation_on_one_version():
    engine = FakeStreamEngine()
    b, _ = _batcher(engine)
    try:
        gen = _req(1, tokens=30)
        b.submit([gen])
        lps, version = b.score([([1, 2], [3, 4, 5]), ([1], [2])], temperature=1.0, micro_batch_tokens=None)
        assert lps == [[-0.25] * 3, [-0.25]] and version == 0
        assert not gen.future.done()  # scored while the turn was still generating
        with pytest.raises(ValueError, match="temperature 1"):
            b.score([([1], [2])], temperature=0.7)
    finally:
        b.close()


def test_with_a_fake_engine_the_engine_lock_drains_the_batch_first():
    engine = FakeStreamEngine()
    b, _ = _batcher(engine)
    try:
        reqs = [_req(i, tokens=15) for i in range(4)]
        b.submit(reqs)
        time.sleep(0.005)
        with b.engine_lock:
            assert all(r.future.done() for r in reqs) and not engine.live and not engine.stepping
            later = _req(9, tokens=1)
            b.submit([later])
            time.sleep(0.02)
            assert not later.future.done()  # nothing is admitted while the caller holds the engine
        assert later.future.result(timeout=5)[0].token_ids == [9]
    finally:
        b.close()


def test_with_a_fake_engine_a_bad_request_fails_alone_and_close_fails_the_rest():
    engine = FakeStreamEngine(step_s=0.01)
    b, _ = _batcher(engine)
    bad, good = _req(1, prompt_len=80), _req(2, tokens=2)
    b.submit([bad, good])
    with pytest.raises(ValueError, match="too long"):
        bad.future.result(timeout=5)
    assert good.future.result(timeout=5)[0].token_ids == [2]
    stuck = _req(3, tokens=10_000)
    b.submit([stuck])
    time.sleep(0.03)
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        stuck.future.result(timeout=5)
    with pytest.raises(RuntimeError, match="closed"):
        b.submit([_req(4)])


def test_an_engine_without_a_request_queue_is_refused():
    class NoQueue:
        pass

    with pytest.raises(ValueError, match="rollout.vllm.continuous needs the vLLM engine"):
        ContinuousBatcher(NoQueue(), max_batch=4, apply_weights=lambda: False, weights_pending=lambda: False)


def test_with_a_fake_engine_max_batch_bounds_the_requests_in_flight():
    engine = FakeStreamEngine()
    b, _ = _batcher(engine, max_batch=3)
    try:
        reqs = [_req(i, tokens=4) for i in range(10)]
        b.submit(reqs)
        assert sorted(r.future.result(timeout=5)[0].token_ids[0] for r in reqs) == list(range(10))
        assert max(engine.batch_sizes) == 3
    finally:
        b.close()


def test_threads_submitting_at_once_each_get_their_own_result():
    engine = FakeStreamEngine(step_s=0.0005)
    b, _ = _batcher(engine)
    results: dict[int, list[int]] = {}

    def episode(i):
        r = _req(i, tokens=1 + i % 5)
        b.submit([r])
        results[i] = r.future.result(timeout=10)[0].token_ids

    try:
        threads = [threading.Thread(target=episode, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {i: [i] for i in range(24)}
    finally:
        b.close()
