"""One generation loop per rollout worker: every live episode's next turn, across groups, batched.

Episodes submit their next prompt the moment their env step returns (``submit``); the loop, a
thread of its own, takes what is pending, up to ``max_batch`` sequences and ``max_tokens`` padded
tokens (prompt + new tokens) with the same sampling settings, into ONE ``engine.generate`` call,
and resolves each request's future with its Generation and the weights version that sampled it.

Before a call it waits up to ``wait_s`` for the turns it knows are coming: the groups in play
tell it how many episodes are live (``join`` / ``leave``), and a live episode that is neither
queued nor generating is an env step away from its next request. Without that wait, groups in
lockstep alternate for ever (one generates while the other steps its envs, then the reverse) and
every call holds one group, exactly as if the worker played one group at a time. With it, a call
takes every live episode, and generation never waits longer than ``wait_s`` for a slow env.

The loop is the only code that touches the engine: new weights (``apply_weights``, queued by the
worker) are loaded between two ``generate`` calls, i.e. between turns, never under one. Each
request carries its own seed (``GenerationEngine.generate``'s ``seeds``), so a turn's sample does
not depend on which other turns shared its batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from actors.engines.base import Generation


@dataclass(frozen=True)
class Sampling:
    """The settings one ``generate`` call shares: requests batch only with their own kind."""

    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass
class Request:
    prompt: list[int]
    sampling: Sampling
    seed: int
    future: Future = field(default_factory=Future)  # -> (Generation, version)


@dataclass
class BatcherStats:
    calls: int = 0
    sequences: int = 0
    tokens: int = 0  # generated
    seconds: float = 0.0  # inside generate

    def snapshot(self) -> dict[str, float]:
        return {"calls": self.calls, "sequences": self.sequences, "tokens": self.tokens, "seconds": self.seconds}


class TurnBatcher:
    def __init__(
        self, engine, *, max_batch: int, max_tokens: int, apply_weights: Callable[[], bool], wait_s: float = 0.0
    ):
        self.engine, self.max_batch, self.max_tokens, self.wait_s = engine, max_batch, max_tokens, wait_s
        self.apply_weights = apply_weights
        self.engine_lock = threading.Lock()  # held around every engine call (weights, generate)
        self.stats = BatcherStats()
        self._queue: list[Request] = []
        self._live = 0  # episodes in play (each queued, generating, or in an env call)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="turn-batcher", daemon=True)
        self._thread.start()

    def submit(self, requests: list[Request]) -> None:
        """Queue requests (a group's episodes submitted at once batch together)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the turn batcher is closed")
            self._queue.extend(requests)
            self._cond.notify()

    def join(self, n: int) -> None:
        """``n`` more episodes are in play: each will submit requests until it ``leave``s."""
        with self._cond:
            self._live += n

    def leave(self, n: int) -> None:
        """``n`` episodes ended (or their group is gone): no call waits for them any more."""
        with self._cond:
            self._live -= n
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def score_teacher(self, items, plain, needs, *, temperature: float, micro_batch_tokens: int | None):
        """The teacher on the engine (``scorer.placement=engine``) between two ``generate`` calls,
        after the queued weights: ``engine.score_teacher`` with the version that scored it."""
        with self.engine_lock:
            self.apply_weights()
            out = self.engine.score_teacher(
                items, plain, needs, temperature=temperature, micro_batch_tokens=micro_batch_tokens
            )
            out.version = self.engine.version
            return out

    def _take(self) -> list[Request]:
        """The oldest request and every pending one of its kind that fits the budget."""
        kind = self._queue[0].sampling
        batch, rest, width = [], [], 0
        for r in self._queue:
            fits = (
                r.sampling == kind
                and len(batch) < self.max_batch
                and (len(batch) + 1) * max(width, len(r.prompt) + kind.max_new_tokens) <= self.max_tokens
            )
            if fits or not batch:  # the oldest always goes, even alone over the budget
                batch.append(r)
                width = max(width, len(r.prompt) + kind.max_new_tokens)
            else:
                rest.append(r)
        self._queue = rest
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    pending, self._queue = self._queue, []
                    for r in pending:
                        r.future.set_exception(RuntimeError("the turn batcher closed"))
                    return
                deadline = time.monotonic() + self.wait_s
                # live episodes not queued are in env calls (no generate is under way here)
                while (
                    self._live > len(self._queue)
                    and len(self._queue) < self.max_batch
                    and not self._closed
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                if self._closed:
                    continue
                batch = self._take()
            s = batch[0].sampling
            try:
                with self.engine_lock:
                    self.apply_weights()  # between turns: no generate is under way
                    t0 = time.perf_counter()
                    gens: list[Generation] = self.engine.generate(
                        [r.prompt for r in batch],
                        max_new_tokens=s.max_new_tokens,
                        temperature=s.temperature,
                        top_p=s.top_p,
                        seeds=[r.seed for r in batch],
                    )
                    version = self.engine.version
                    self.stats.seconds += time.perf_counter() - t0
                self.stats.calls += 1
                self.stats.sequences += len(batch)
                self.stats.tokens += sum(g.n_tokens for g in gens)
                for r, g in zip(batch, gens):
                    r.future.set_result((g, version))
            except BaseException as e:  # the requests' owners re-raise it
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)


__all__ = ["BatcherStats", "Request", "Sampling", "TurnBatcher"]
