"""Continuous batching on the vLLM engine (``rollout.vllm.continuous=true``): each turn joins the
running batch at the engine's next step, instead of waiting for a whole ``generate`` call to end.

``TurnBatcher`` (actors/turn_batcher.py) gives the engine one ``generate`` call at a time: a turn
whose env step returns while a call runs waits for that call's longest reply. Here one thread
drives the engine's own request queue (``engine.add`` / ``add_score`` / ``step``, what vLLM's
``LLMEngine`` is under ``LLM.generate``): every loop admits what was submitted since the last
step and runs one step; a request's future resolves in the step that finishes it. Teacher scores
(``scorer.placement=engine``) are requests of the same queue, prefilled beside the decodes.

What stays exact, as in ``TurnBatcher``:
- **one version per request.** New weights are loaded only when no request is in flight: while
  weights are pending, nothing new is admitted, the requests in flight finish on the weights they
  started with, then the weights load and admission resumes. Each request records the version it
  was admitted under, which is the version that sampled (or scored) all of its tokens.
- **per-request seeds**: a turn samples the same tokens whichever requests share its steps.
- **the engine is touched by one thread.** Callers outside the loop (weight checksums, sleep /
  wake_up, a blocking ``engine.score``) enter ``engine_lock``, which first drains the requests in
  flight and holds admission until they leave.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from actors.turn_batcher import BatcherStats, Request


@dataclass
class ScoreRequest:
    prompt: list[int]
    response: list[int]
    future: Future = field(default_factory=Future)  # -> (log-probs, version)


class _Drained:
    """``with batcher.engine_lock:`` from outside the loop: no request in flight, none admitted,
    the engine to the caller alone (``TurnBatcher.engine_lock``'s contract)."""

    def __init__(self, batcher: ContinuousBatcher):
        self._b = batcher

    def __enter__(self):
        b = self._b
        with b._cond:
            b._exclusive += 1
            b._cond.notify_all()
            while b._in_flight_n and not b._closed:
                b._cond.wait()
        b._engine.acquire()
        return self

    def __exit__(self, *exc):
        b = self._b
        b._engine.release()
        with b._cond:
            b._exclusive -= 1
            b._cond.notify_all()
        return False


class ContinuousBatcher:
    def __init__(
        self,
        engine,
        *,
        max_batch: int,
        apply_weights: Callable[[], bool],
        weights_pending: Callable[[], bool],
    ):
        if not getattr(engine, "can_stream", False):
            raise ValueError(
                f"{type(engine).__name__} has no request queue: rollout.vllm.continuous needs the vLLM engine"
            )
        self.engine, self.max_batch = engine, max_batch
        self.apply_weights, self.weights_pending = apply_weights, weights_pending
        self.stats = BatcherStats()  # calls = engine steps, sequences = requests in flight summed over steps
        self.admitted_while_busy = 0  # requests that joined a running batch (what TurnBatcher cannot do)
        self._engine = threading.Lock()
        self.engine_lock = _Drained(self)
        self._cond = threading.Condition()
        self._queue: list[Request | ScoreRequest] = []
        self._in_flight: dict[str, tuple[Request | ScoreRequest, int]] = {}  # the loop's own
        self._in_flight_n = 0  # len(_in_flight), read by other threads under _cond
        self._exclusive = 0
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="continuous-batcher", daemon=True)
        self._thread.start()

    # ----- TurnBatcher's interface ------------------------------------------------------------------
    def submit(self, requests: list[Request]) -> None:
        self._enqueue(requests)

    def join(self, n: int) -> None:  # nothing waits for live episodes: a turn is admitted when it comes
        pass

    def leave(self, n: int) -> None:
        pass

    def score(self, items: list[tuple[list[int], list[int]]], *, temperature: float, micro_batch_tokens=None):
        """The teacher's log-probs of (prompt ids, response ids), scored beside generation, and the
        weights version that scored them (all items: one version, as a request never spans two)."""
        if abs(temperature - 1.0) > 1e-9:
            raise ValueError(f"the vLLM engine scores at temperature 1 only, got {temperature}")
        reqs = [ScoreRequest(list(p), list(r)) for p, r in items]
        self._enqueue(reqs)
        results = [r.future.result() for r in reqs]
        versions = {v for _, v in results}
        if len(versions) > 1:  # weights changed between two of the items: score the rest again
            return self.score(items, temperature=temperature)
        return [lp for lp, _ in results], versions.pop() if versions else self.engine.version

    def score_teacher(self, items, plain, needs, *, temperature: float, micro_batch_tokens=None):
        """``score`` of the items and the plain items together, as a ``TeacherOutput``: vLLM's
        prompt log-probs give the sampled tokens only (a whole-distribution need is refused at launch)."""
        from pipeline.core.types import TeacherOutput

        if needs.whole_distribution:
            raise NotImplementedError(
                "vLLM's prompt log-probs are the sampled tokens' only: a top-k support or a channel of "
                "the teacher's distribution needs the HF engine (refused at launch)"
            )
        lps, version = self.score(list(items) + list(plain), temperature=temperature)
        return TeacherOutput(
            logprobs=lps[: len(items)], plain_logprobs=lps[len(items) :] if plain else None, version=version
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ----- the loop ---------------------------------------------------------------------------------
    def _enqueue(self, requests) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the continuous batcher is closed")
            self._queue.extend(requests)
            self._cond.notify_all()

    def _admit(self) -> list:
        """What may join the batch now (under _cond)."""
        if self._exclusive or (self._in_flight_n and self.weights_pending()):
            return []  # drain: the caller outside, or new weights, waits for the requests in flight
        room = max(self.max_batch - self._in_flight_n, 0)
        admit, self._queue = self._queue[:room], self._queue[room:]
        return admit

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._in_flight_n and not (self._queue and not self._exclusive):
                    self._cond.wait()
                if self._closed:
                    self._fail_all(RuntimeError("the continuous batcher closed"))
                    return
                admit = self._admit()
            try:
                with self._engine:
                    if not self._in_flight:
                        self.apply_weights()  # no request in flight: none spans two versions
                    busy = bool(self._in_flight)
                    version = self.engine.version
                    for r in admit:
                        rid = f"c{next(self._ids)}"
                        try:
                            self._add(rid, r)
                        except Exception as e:  # this request's error (a prompt too long): its owner's
                            r.future.set_exception(e)
                            continue
                        self._in_flight[rid] = (r, version)
                        self.admitted_while_busy += busy
                    admit = []
                    t0 = time.perf_counter()
                    done = self.engine.step() if self._in_flight else []
                    self.stats.seconds += time.perf_counter() - t0
                self.stats.calls += 1
                self.stats.sequences += len(self._in_flight)
                for rid, out in done:
                    r, v = self._in_flight.pop(rid)
                    if isinstance(r, Request):
                        self.stats.tokens += out.n_tokens
                    r.future.set_result((out, v))
            except BaseException as e:  # a request's owner re-raises it; the loop goes on
                for r in admit:
                    if not r.future.done():
                        r.future.set_exception(e)
                self._abort_in_flight(e)
            with self._cond:
                self._in_flight_n = len(self._in_flight)
                self._cond.notify_all()

    def _add(self, rid: str, r: Request | ScoreRequest) -> None:
        if isinstance(r, ScoreRequest):
            self.engine.add_score(rid, r.prompt, r.response)
            return
        s = r.sampling
        self.engine.add(
            rid, r.prompt, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=r.seed
        )

    def _abort_in_flight(self, err: BaseException) -> None:
        ids = list(self._in_flight)
        for r, _ in self._in_flight.values():
            if not r.future.done():
                r.future.set_exception(err)
        self._in_flight.clear()
        try:
            with self._engine:
                self.engine.abort(ids)
        except Exception:  # the engine failed already: its error is the one reported
            pass

    def _fail_all(self, err: BaseException) -> None:
        pending, self._queue = self._queue, []
        for r in pending:
            r.future.set_exception(err)
        self._abort_in_flight(err)
        self._in_flight_n = 0
        self._cond.notify_all()


__all__ = ["ContinuousBatcher", "ScoreRequest"]
