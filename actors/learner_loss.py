"""What a failed learner call means: a rank lost (its process, or its node), weights that are not
finite, or something else. Both end the run like a lost learner (``LearnerLost``: its state cannot
be trusted or is gone), and the controller adds the checkpoint to resume from.

A rank's death is seen by the call into it, or by a consumer that waited for its weight packet:
Ray fails a call whose argument another actor died making with THAT actor's death, so a consumer
must not take it for its own (``actors/handles.py``, ``_is_death``), and the learner group names
the rank by the actor id the error carries.
"""

from __future__ import annotations

import asyncio
import time

from pipeline.core.errors import LearnerLost, NonFiniteWeights, first_line

NODE_DEATH_WAIT_S = 30.0  # how long a lost learner's node may take to be reported dead


def actor_id(actor) -> str | None:
    """A Ray actor handle's id (hex), None for anything else (test fakes)."""
    aid = getattr(actor, "_actor_id", None)
    return aid.hex() if aid is not None else None


def _rank_died(who: str, e: BaseException, ranks: list) -> int | None:
    """The learner rank whose death ``e`` reports: the rank called, or the rank whose actor id it
    names; None for anything else."""
    import ray.exceptions as rx

    if not isinstance(e, rx.RayActorError):
        return None
    if who.startswith("learner rank "):
        return int(who.rsplit(" ", 1)[1])
    ids = [actor_id(rk) for rk in ranks]
    return ids.index(e.actor_id) if e.actor_id is not None and e.actor_id in ids else None


async def learner_failure(who: str, e: BaseException, ranks: list, node_ids: list[str] | None) -> BaseException:
    """``e`` (from ``who``'s call) as the run should report it: a rank's death as ``LearnerLost``
    naming the rank and whether its node went with it (Ray reports a lost node a few seconds after
    the calls into it fail); weights that are not finite as ``NonFiniteWeights`` (Ray's wrapper
    dropped); any other error as it is."""
    import ray

    cause = getattr(e, "cause", None) or e  # a Ray task error wraps the rank's own
    if isinstance(cause, NonFiniteWeights):
        return NonFiniteWeights(first_line(cause))
    rank = _rank_died(who, e, ranks)
    if rank is None:
        return e
    who = f"learner rank {rank}"
    if not node_ids:
        return LearnerLost(f"{who} died: {first_line(e)[:300]}; stopping the run")
    node = node_ids[rank]
    gone, t0 = False, time.monotonic()
    while not gone and time.monotonic() - t0 < NODE_DEATH_WAIT_S:
        gone = not any(n["NodeID"] == node and n["Alive"] for n in ray.nodes())
        if not gone:
            await asyncio.sleep(1.0)
    where = f"with its node {node}" if gone else f"(its node {node} is still up: the process ended)"
    return LearnerLost(f"{who} died {where}: {first_line(e)[:300]}; stopping the run")
