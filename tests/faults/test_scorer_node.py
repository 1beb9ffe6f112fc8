"""The teacher scorer on a node of its own, then that node lost, on a real multi-node Ray cluster on
one machine (``ray.cluster_utils.Cluster``, as ``test_node_loss.py``).

``scorer.num_cpus=1`` reserves a CPU for the scorer actor (it used to ask Ray for none, so it
always shared a node with another actor): with one CPU per node it gets a node to itself. That
node is then killed (its raylet and every process of it): Ray places the scorer again on a node
that joins with room, the controller gives it the current weights and scores again the group
that waited for it, and the run trains every step on teacher-scored groups.
"""

from __future__ import annotations

import os
import signal

import pytest
from test_actor_restart import ARGS
from test_node_loss import NODE, _actor_on, _lose_node_and_finish, _start, _wait

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.extended]


def test_the_scorer_gets_a_node_of_its_own_and_is_placed_again_when_that_node_is_lost(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})
    run_dir, proc = tmp_path / "run", None
    args = [*ARGS, "scorer.num_cpus=1", f"cluster.address={cluster.address}", f"trainer.run_dir={run_dir}"]
    try:
        learner_node = cluster.add_node(**NODE)
        proc = _start(args, tmp_path)
        # one CPU per node: the learner (made first) takes this one; the rollout worker and the
        # scorer, made together, take the two that join, in whichever order Ray places them
        _wait(lambda: _actor_on(learner_node, "LearnerActor"), "learner on its node", proc)
        nodes = [cluster.add_node(**NODE), cluster.add_node(**NODE)]
        scorer_node = _wait(
            lambda: next((n for n in nodes if _actor_on(n, "TeacherScorerWorker")), None), "the scorer placed", proc
        )
        worker_node = next(n for n in nodes if n is not scorer_node)
        _wait(lambda: _actor_on(worker_node, "RolloutWorker"), "the rollout worker on the other node", proc)
        assert not any(_actor_on(n, "TeacherScorerWorker") for n in (learner_node, worker_node))
        rows, events = _lose_node_and_finish(cluster, proc, scorer_node, "TeacherScorerWorker", run_dir)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
    assert [e["actor"] for e in events if e["event"] == "restart"] == ["teacher scorer"], events
    for r in rows:  # every step trained on complete, teacher-scored groups
        assert r["teacher/rows_scored_frac"] == 1.0, r["step"]
