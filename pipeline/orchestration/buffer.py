"""The bounded group buffer between rollout and learning, with the staleness bound.

The rule that keeps training within ``max_policy_lag`` (L) versions is accounted at admission,
so that no group is ever dropped for being slow:

* **Admission** (``acquire_start``): a rollout may start a new group only while fewer than
  ``(version + L + 1) * groups_per_step`` groups have been started, where ``version`` is the
  weights version every rollout worker holds. The group gets a ticket: its admission order and
  its **deadline** ``version + L``, the last training step that may use it. Every turn of the
  group is sampled with weights at least ``version`` (new weights land between turns), so a group
  trained by its deadline is at most L versions behind the learner.
* **Consumption** (``take``) at training step s: the ``groups_per_step`` complete groups with the
  earliest deadlines (then admission order), provided that every group due at s is among them
  (the buffer *waits* for a due group still being played: a slow group is never overtaken into
  expiry) and that what remains can still meet its deadlines (for every later step s', at most
  ``(s' - s) * groups_per_step`` unconsumed groups are due by s'); otherwise it waits for the next
  group to complete.

Admission guarantees that at most ``(s + 1) * groups_per_step`` groups are due by step s, so the
schedule always exists; with L = 0 it is synchronous RL (the step's groups are the ones just
admitted). A fast group may be trained before an older slow one, but never at the cost of the
slow one's deadline: unlike dropping stale groups (which systematically discards the slow, long,
usually hard tasks), nothing generated is lost.

The buffer is a plain class driven from one asyncio loop. It records the lag of every trained
group (learner version - the group's oldest turn version) and, for generated vs trained groups,
the mean success, turns per episode and rollout seconds, so a bias towards fast groups would show.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from pipeline.core.types import EpisodeGroup


@dataclass(frozen=True, slots=True)
class Ticket:
    """A started group's place in the schedule."""

    index: int  # admission order
    version: int  # weights version every worker held at admission
    deadline: int  # the last training step that may use the group: version + max_policy_lag


@dataclass
class GroupProfile:
    """Running sums over groups, to compare the generated with the trained distribution."""

    n: int = 0
    success: float = 0.0  # won fraction of the group's episodes
    turns: float = 0.0  # turns per episode
    seconds: float = 0.0  # rollout seconds of the group

    def add(self, g: EpisodeGroup) -> None:
        eps = max(len(g.episodes), 1)
        self.n += 1
        self.success += sum(e.won for e in g.episodes) / eps
        self.turns += sum(e.n_turns for e in g.episodes) / eps
        self.seconds += g.rollout_seconds

    def metrics(self, prefix: str) -> dict[str, float]:
        n = max(self.n, 1)
        return {
            f"{prefix}_success": self.success / n,
            f"{prefix}_turns": self.turns / n,
            f"{prefix}_seconds": self.seconds / n,
        }


@dataclass
class BufferStats:
    admitted: int = 0  # groups started
    completed: int = 0  # groups put
    consumed: int = 0  # groups taken
    waited_for_due: int = 0  # takes that waited for a group due at that step
    lag_hist: Counter = field(default_factory=Counter)  # learner version - group min version, at take
    generated: GroupProfile = field(default_factory=GroupProfile)
    trained: GroupProfile = field(default_factory=GroupProfile)

    def as_metrics(self) -> dict[str, float]:
        total = sum(self.lag_hist.values()) or 1
        out = {
            "buffer/admitted": self.admitted,
            "buffer/completed": self.completed,
            "buffer/consumed": self.consumed,
            "buffer/waited_for_due": self.waited_for_due,
        }
        for lag, n in sorted(self.lag_hist.items()):
            out[f"lag/frac_{lag}"] = n / total
        out["lag/mean"] = sum(k * v for k, v in self.lag_hist.items()) / total
        out.update(self.generated.metrics("groups/generated"))
        out.update(self.trained.metrics("groups/trained"))
        return out


class GroupBuffer:
    """Admission tickets, completed groups, and the deadline schedule of ``take``."""

    def __init__(self, *, groups_per_step: int, max_policy_lag: int, capacity: int | None = None):
        if groups_per_step < 1 or max_policy_lag < 0:
            raise ValueError("groups_per_step >= 1 and max_policy_lag >= 0 required")
        self.groups_per_step = groups_per_step
        self.max_policy_lag = max_policy_lag
        # Admission already bounds what is complete and unconsumed (< (L + 1) * groups_per_step).
        self.capacity = capacity or groups_per_step * (max_policy_lag + 2)
        self.started = 0  # tickets issued and not released
        self.synced_version = 0  # weights version every rollout worker holds
        self._next_index = 0
        self._pending: dict[int, Ticket] = {}  # started, not yet consumed (in flight or complete)
        self._done: dict[int, EpisodeGroup] = {}  # complete, by ticket index
        self.stats = BufferStats()
        self._cond = asyncio.Condition()
        self._taken: list[tuple[Ticket, EpisodeGroup]] = []  # the last take, until given back
        self._before_take: tuple = ()  # the counters only take changes, as they were before it

    # ----- admission -----------------------------------------------------------------------------
    def may_start(self) -> bool:
        limit = (self.synced_version + self.max_policy_lag + 1) * self.groups_per_step
        return self.started < limit

    async def acquire_start(self) -> Ticket:
        """Wait until a new group may start; returns its ticket."""
        async with self._cond:
            await self._cond.wait_for(self.may_start)
            ticket = Ticket(
                index=self._next_index, version=self.synced_version, deadline=self.synced_version + self.max_policy_lag
            )
            self._next_index += 1
            self.started += 1
            self._pending[ticket.index] = ticket
            self.stats.admitted += 1
            return ticket

    async def release_start(self, ticket: Ticket) -> None:
        """Undo ``acquire_start`` for a rollout that ended without a group (its task is retried)."""
        async with self._cond:
            if self._pending.pop(ticket.index, None) is not None:
                self.started -= 1
                self.stats.admitted -= 1
            self._cond.notify_all()

    async def set_synced_version(self, version: int) -> None:
        async with self._cond:
            self.synced_version = version
            self._cond.notify_all()

    # ----- groups in and out ---------------------------------------------------------------------
    async def put(self, ticket: Ticket, group: EpisodeGroup) -> None:
        """The complete group of ``ticket``."""
        async with self._cond:
            if ticket.index not in self._pending:
                raise ValueError(f"ticket {ticket.index} is not in flight (released or already consumed)")
            await self._cond.wait_for(lambda: len(self._done) < self.capacity)
            self._done[ticket.index] = group
            self.stats.completed += 1
            self.stats.generated.add(group)
            self._cond.notify_all()

    def _order(self, t: Ticket) -> tuple[int, int]:
        return t.deadline, t.index

    def _choose(self, n: int, step: int) -> list[int] | None:
        """Ticket indices to train at ``step``, or None to wait for more groups.

        The candidates are the complete groups in order of (deadline, admission): taking the
        earliest deadlines is the choice that leaves the fewest groups due later, so if it cannot
        meet every later deadline no choice can, and the buffer waits for groups in flight.
        """
        if any(t.deadline <= step and t.index not in self._done for t in self._pending.values()):
            return None  # a group due now is still being played: wait for it
        ready = sorted((self._pending[i] for i in self._done), key=self._order)
        if len(ready) < n:
            return None
        chosen = {t.index for t in ready[:n]}
        due = sum(t.deadline <= step for t in self._pending.values())
        if due > n:
            raise RuntimeError(f"buffer schedule broken: {due} groups are due at step {step} but a step takes {n}")
        rest = [t for i, t in self._pending.items() if i not in chosen]
        for later in range(step + 1, step + self.max_policy_lag + 1):
            if sum(t.deadline <= later for t in rest) > (later - step) * n:
                return None  # too many would be due at `later`: wait for the earlier ones in flight
        return sorted(chosen)

    async def take(self, n: int, learner_version: int) -> list[EpisodeGroup]:
        """Wait for the ``n`` groups the schedule trains at step ``learner_version`` and remove them."""
        self._taken = []  # a take cancelled while it waits has nothing to give back
        async with self._cond:
            waited = False
            while (chosen := self._choose(n, learner_version)) is None:
                waited = waited or any(
                    t.deadline <= learner_version and t.index not in self._done for t in self._pending.values()
                )
                await self._cond.wait()
            st = self.stats
            self._before_take = (st.consumed, st.waited_for_due, Counter(st.lag_hist), dataclasses.replace(st.trained))
            self.stats.waited_for_due += waited
            out = []
            for i in chosen:
                group = self._done.pop(i)
                self._taken.append((self._pending.pop(i), group))
                self.stats.lag_hist[learner_version - group.min_version] += 1
                self.stats.trained.add(group)
                out.append(group)
            self.stats.consumed += len(out)
            self._cond.notify_all()
        return out

    async def give_back(self) -> int:
        """Undo the last ``take``: its groups are complete and unconsumed again, with their tickets
        and the counters as they were, so a checkpoint keeps them (a step abandoned before its
        update, ``pipeline/orchestration/stopping.py``). Returns how many came back."""
        async with self._cond:
            taken, self._taken = self._taken, []
            for ticket, group in taken:
                self._pending[ticket.index], self._done[ticket.index] = ticket, group
            if taken:
                st = self.stats
                st.consumed, st.waited_for_due, st.lag_hist, st.trained = self._before_take
            self._cond.notify_all()
        return len(taken)

    def __len__(self) -> int:
        return len(self._done)

    @property
    def in_flight(self) -> int:
        return len(self._pending) - len(self._done)

    # ----- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Complete, unconsumed groups with their tickets, and the counters. Groups in flight are
        not kept: the controller replays their tasks on resume (new tickets)."""
        return {
            "done": [(self._pending[i], g) for i, g in sorted(self._done.items())],
            "next_index": self._next_index,
            "stats": self.stats,
        }

    def load_state_dict(self, state: dict, *, version: int) -> None:
        self._done = {t.index: g for t, g in state["done"]}
        self._pending = {t.index: t for t, _ in state["done"]}
        self._next_index = state["next_index"]
        self.stats = state["stats"]
        self.synced_version = version
        # Everything consumed so far, plus what is complete and kept, has been started; the
        # replayed in-flight tasks are admitted again.
        self.started = version * self.groups_per_step + len(self._done)
        self.stats.admitted = self.started
