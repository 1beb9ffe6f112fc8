"""A whole Ray node lost during a real run, on a real multi-node Ray cluster on one machine
(``ray.cluster_utils.Cluster``: a head and worker nodes, each with its own raylet and object store).

The node that holds the rollout worker is killed (its raylet and every process of it, SIGKILL):
Ray restarts the worker on another node that has room, the controller gives it the current
weights and replays its lost group, and the run finishes every step. With no node that has room,
the run goes on with the workers it has (``rollout.min_workers``) and takes the lost one back
when a node joins. The node of a learner rank: the run stops naming it, and the next start
continues from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_actor_restart import ARGS, STEPS  # the same short SDAR run as the single-node restart tests

from lab.faults import actor_pid

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
# The nodes take the host's address: a driver joining a cluster (cluster.address) replaces a
# loopback address by it, as on any real cluster.
NODE = {"num_cpus": 1, "object_store_memory": 200 * 1024 * 1024}


def _driver_env() -> dict[str, str]:
    """The driver joins the cluster through cluster.address, never an inherited RAY_ADDRESS."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}


def _raylet_pid(node) -> int:
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def _actor_on(node, cls: str) -> int | None:
    """The live process of the actor of class ``cls`` that ``node``'s raylet started, if any."""
    return actor_pid(_raylet_pid(node), cls)


def _wait(cond, what: str, proc, timeout: float = 300):
    t0 = time.time()
    while not (got := cond()):
        assert proc.poll() is None, f"the run ended while waiting for {what}:\n{proc.communicate()[1][-3000:]}"
        assert time.time() - t0 < timeout, f"no {what} within {timeout} s"
        time.sleep(0.2)
    return got


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    """The public entry point joining the cluster (its args name it), in a session of its own."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_driver_env(),
        start_new_session=True,
    )


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _lose_node_and_finish(cluster, proc, node, cls: str, run_dir: Path) -> tuple[list[dict], list[dict]]:
    """A spare node joins, and after step 2 ``node`` is killed (its raylet and every process of it,
    SIGKILL): the actor of class ``cls`` on it must be placed again on the spare, and the run must
    train every step. Returns its metrics rows and events.

    The spare joins before step 2, not after: starting a node takes seconds on 2 cores, and the
    tiny run once trained its last 6 steps in that time, so the node was lost after the run ended
    (every actor that needs a CPU is placed already, so nothing else can take the spare)."""
    spare = cluster.add_node(**NODE)  # room for the actor once its node is gone
    _wait(lambda: len(_steps(run_dir)) >= 2, "step 2", proc)
    assert len(_steps(run_dir)) < STEPS - 2, "the run was nearly over before its node could be lost"
    cluster.remove_node(node, allow_graceful=False)
    _wait(lambda: _actor_on(spare, cls), f"{cls} placed again on the spare node", proc)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows, _events(run_dir)


def test_the_node_of_the_rollout_worker_is_lost_and_the_worker_comes_back_on_another_node(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})  # the driver's node only
    proc = None
    try:
        learner_node = cluster.add_node(**NODE)
        run_dir = tmp_path / "run"
        proc = _start([*ARGS, f"cluster.address={cluster.address}", f"trainer.run_dir={run_dir}"], tmp_path)
        # one CPU per node: the learner (created first) takes this node, the worker the next one
        _wait(lambda: _actor_on(learner_node, "LearnerActor"), "learner on its node", proc)
        worker_node = cluster.add_node(**NODE)
        _wait(lambda: _actor_on(worker_node, "RolloutWorker"), "rollout worker on its node", proc)
        rows, events = _lose_node_and_finish(cluster, proc, worker_node, "RolloutWorker", run_dir)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
    restarts = [e for e in events if e["event"] == "restart"]
    assert any(e["actor"] == "rollout worker 0" for e in restarts), events
    assert rows[-1]["faults/restarts"] >= 1
    for r in rows:  # every step trained on complete, teacher-scored groups with fresh weights
        assert r["teacher/rows_scored_frac"] == 1.0 and r["rollout/policy_lag_max"] <= 1, r["step"]


def test_the_node_of_the_learner_is_lost_and_the_run_stops_naming_it_then_continues_from_its_checkpoint(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})
    run_dir = tmp_path / "run"
    args = [
        *(a for a in ARGS if not a.startswith("trainer.ckpt_every=")),
        "trainer.ckpt_every=1",
        f"trainer.run_dir={run_dir}",
        "trainer.resume=auto",
    ]
    proc = None
    try:
        learner_node = cluster.add_node(**NODE)
        env = _driver_env()
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *args, f"cluster.address={cluster.address}"]
        proc = _start(cmd[2:], tmp_path)
        _wait(lambda: _actor_on(learner_node, "LearnerActor"), "learner on its node", proc)
        cluster.add_node(**NODE)  # the rollout worker's
        _wait(lambda: len(_steps(run_dir)) >= 2, "step 2", proc)
        node_id = learner_node.node_id
        cluster.remove_node(learner_node, allow_graceful=False)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 1, err[-4000:]
        steps = [r["step"] for r in _steps(run_dir)]
        assert f"learner rank 0 died with its node {node_id}" in err, err[-3000:]
        assert f"resume from the last checkpoint (step {steps[-1]}): trainer.resume={run_dir}" in err, err[-3000:]
        cluster.add_node(**NODE)  # a replacement node; the next start continues
        again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
        assert again.returncode == 0, again.stderr[-4000:]
        assert "trainer.resume=auto: continuing from" in again.stderr
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
    assert [r["step"] for r in _steps(run_dir)] == list(range(1, STEPS + 1))


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_no_node_has_room_so_the_run_goes_on_with_one_worker_and_takes_the_other_back_when_a_node_joins(tmp_path):
    """Two rollout workers on two nodes, ``rollout.min_workers=1``, collective weight sync: one
    worker node is lost and none has room, so the run trains on with the other worker (the
    weight group formed again around the survivors); a node joins, the worker is placed there and
    rejoins the weight group with the current weights; every step is trained."""
    from ray.cluster_utils import Cluster

    steps = 100  # the node joins and the worker comes back in about 20 s (0.5 s a step): margin under load
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})
    run_dir, proc = tmp_path / "run", None
    args = [
        *(a for a in ARGS if not a.startswith("trainer.total_steps=") and not a.startswith("trainer.groups_per_step=")),
        f"trainer.total_steps={steps}",
        "trainer.groups_per_step=2",  # a rollout loop per worker
        "rollout.num_workers=2",
        "rollout.min_workers=1",
        "cluster.weight_sync=collective",
        # A node lost during a broadcast can leave learner rank 0 in it until this timeout (gloo
        # does not always see the peer go): the group is formed again after it (default 600 s).
        "cluster.sync_timeout_s=20",
        f"cluster.address={cluster.address}",
        f"trainer.run_dir={run_dir}",
    ]
    try:
        learner_node = cluster.add_node(**NODE)
        proc = _start(args, tmp_path)
        _wait(lambda: _actor_on(learner_node, "LearnerActor"), "learner on its node", proc)
        nodes = [cluster.add_node(**NODE), cluster.add_node(**NODE)]
        for node in nodes:
            _wait(lambda n=node: _actor_on(n, "RolloutWorker"), "a rollout worker on each node", proc)
        _wait(lambda: len(_steps(run_dir)) >= 2, "step 2", proc)
        cluster.remove_node(nodes[0], allow_graceful=False)
        _wait(lambda: any(e["event"] == "degraded" for e in _events(run_dir)), "the run saying it is degraded", proc)
        lost_at = len(_steps(run_dir))
        _wait(lambda: len(_steps(run_dir)) >= lost_at + 2, "two steps with one worker", proc)
        joined = cluster.add_node(**NODE)
        _wait(lambda: _actor_on(joined, "RolloutWorker"), "the lost worker placed on the node that joined", proc)
        _wait(lambda: any(e["event"] == "worker_back" for e in _events(run_dir)), "the worker back", proc)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    live = [r["rollout/live_workers"] for r in rows]
    assert live[0] == 2 and 1 in live and live[-1] == 2, live
    events = _events(run_dir)
    names = [e["event"] for e in events]
    assert names.index("degraded") < names.index("worker_back"), names
    groups = [e["workers"] for e in events if e["event"] == "weight_group_reformed"]
    assert 1 in groups and groups[-1] == 2, events  # around the survivor, then with the worker back
    for r in rows:  # every step trained on complete, teacher-scored groups with fresh weights
        assert r["teacher/rows_scored_frac"] == 1.0 and r["rollout/policy_lag_max"] <= 1, r["step"]
