"""Every training prompt (task) a run draws, accounted for across stops and resumes.

A task index is drawn once (``next_task``) and from then on is exactly one of: **in flight**
(being played or scored, or waiting to be played again), **buffered** (its group complete and not
yet trained) or **trained**. Nothing is dropped: a group lost with a worker, or one whose env
broke every episode, is played again from its seed (``replay``), and it stays in flight until it
is, so a checkpoint taken meanwhile keeps it (it used to be in neither list then, and a resume
lost it). A checkpoint keeps the buffered groups (``GroupBuffer.state_dict``) and the tasks in
flight, which the resumed run plays first.

``metrics`` logs the counts every step; ``prompts/unaccounted`` (drawn minus the three) is 0
unless a prompt was lost (> 0) or trained twice (< 0).
"""

from __future__ import annotations


class PromptLedger:
    """``counters`` is the run's ``ControllerState``: ``next_task``, ``in_flight`` and
    ``prompts_trained`` live there, so a checkpoint holds them."""

    def __init__(self, counters, groups_per_step: int):
        self.counters = counters
        if counters.prompts_trained is None:  # a checkpoint from before the count: a step trains groups_per_step
            counters.prompts_trained = counters.step * groups_per_step
        self._replay = list(counters.in_flight)  # in flight at the checkpoint: played first

    def draw(self) -> int:
        """The task a rollout loop plays next: one to play again, else a new one."""
        if self._replay:
            return self._replay.pop(0)
        st = self.counters
        idx, st.next_task = st.next_task, st.next_task + 1
        st.in_flight.append(idx)
        return idx

    def replay(self, idx: int) -> None:
        """Task ``idx``'s group was lost: it is played again, before any new task."""
        self._replay.insert(0, idx)

    def buffered(self, idx: int) -> None:
        """Task ``idx``'s group is complete and goes to the buffer."""
        self.counters.in_flight.remove(idx)

    def trained(self, n: int) -> None:
        self.counters.prompts_trained += n

    def metrics(self, buffered: int) -> dict[str, float]:
        st = self.counters
        in_flight = len(st.in_flight)
        return {
            "prompts/drawn": st.next_task,
            "prompts/trained": st.prompts_trained,
            "prompts/buffered": buffered,
            "prompts/in_flight": in_flight,
            "prompts/unaccounted": st.next_task - st.prompts_trained - buffered - in_flight,
        }
