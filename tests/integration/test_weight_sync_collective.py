"""``cluster.weight_sync=collective``: bucketed gloo broadcasts from learner rank 0, for real.

* In-process, no Ray: a real RolloutWorker (HF engine, tiny model) and a real TeacherScorerWorker
  in one gloo group with a sender thread. A sync whose payload does not match its trailer raises
  WeightSyncError and queues / loads nothing; the next good sync is queued (worker: applied at the
  next turn boundary) and loaded (scorer).
* Through ``run_training`` in Ray: after training, the rollout engine's weights equal the
  learner's (per-tensor float64 sums fetched from both before the actors are freed), and the
  collective route's metrics were logged. Once with one learner (GRPO), once with M=2 ZeRO-3
  learners and a self-teacher scorer in the group (SDAR).
"""

from __future__ import annotations

import threading

import pytest
import torch

from pipeline.distributed.weight_sync import WeightSyncError
from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = pytest.mark.integration

BASE = [
    "model=tiny",
    "env=keyword",
    "rollout.max_new_tokens=8",
    "rollout.group_size=3",
    "trainer.groups_per_step=2",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.lr=1e-3",
    "cluster.weight_sync=collective",
    "cluster.sync_backend=auto",
    "rollout.precision=bf16",
]
TIMEOUT = 300


# ----- consumers, in process ---------------------------------------------------------------------
def test_rollout_worker_and_scorer_apply_only_checked_weights(tiny_model_dir):
    from actors.rollout import RolloutWorker
    from actors.scorer import TeacherScorerWorker
    from pipeline.core.config import EnvConfig, RolloutConfig
    from pipeline.distributed.collective_sync import (
        _broadcast,
        _trailer,
        broadcast_state_dict,
        init_group,
        meta_of,
        plan_buckets,
        send_buckets,
    )

    worker = RolloutWorker(RolloutConfig(precision="fp32"), EnvConfig(name="keyword"), str(tiny_model_dir))
    scorer = TeacherScorerWorker(str(tiny_model_dir), temperature=1.0, micro_batch_tokens=256, precision="fp32")
    base = {k: v.detach().clone() for k, v in worker.engine.model.state_dict().items()}
    # New weights as a function of the old (tied aliases stay equal), and a corrupted copy.
    new = {k: v * 1.5 + 0.01 for k, v in base.items()}
    bad = {k: v.clone() for k, v in new.items()}
    name = next(iter(bad))
    bad[name].view(-1)[0] += 1.0
    from pipeline.distributed.rendezvous import host_store

    store = host_store(60.0)
    meta, bucket, port = meta_of(new), 1 << 20, store.port
    seen: dict = {}

    def sender():
        g = init_group("127.0.0.1", port, 0, 3, "gloo", timeout_s=60, tcp=store)
        send_buckets(g, bad, plan_buckets(meta, bucket), g.device)  # v1: payload != trailer
        _broadcast(g, _trailer(1, new, g.device))
        seen["stats"] = broadcast_state_dict(g, new, 2, bucket, meta=meta)  # v2: good

    def consumer(tag, obj, rank):
        try:
            obj.init_weight_group("127.0.0.1", port, rank, 3, "gloo", meta, bucket, timeout_s=60)
            try:
                obj.receive_weights(1)
                seen[tag + "_v1"] = "accepted"
            except WeightSyncError as e:
                seen[tag + "_v1"] = e
            seen[tag + "_after_v1"] = (getattr(obj, "_pending", None), obj.version)
            seen[tag + "_v2"] = obj.receive_weights(2)
        except BaseException as e:
            seen[tag] = e

    threads = [
        threading.Thread(target=sender, daemon=True),
        threading.Thread(target=consumer, args=("worker", worker, 1), daemon=True),
        threading.Thread(target=consumer, args=("scorer", scorer, 2), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a group member hung"
    assert "worker" not in seen and "scorer" not in seen, seen
    for tag in ("worker", "scorer"):
        assert isinstance(seen[tag + "_v1"], WeightSyncError), seen[tag + "_v1"]
        assert "checksum" in str(seen[tag + "_v1"])
        assert seen[tag + "_after_v1"] == (None, 0), f"{tag} took a corrupt sync"
        assert seen[tag + "_v2"] == 2
    # The worker queued v2 without touching the engine; the next turn boundary applies it.
    assert worker.version == 0 and worker._pending[1] == 2
    assert worker.apply_pending_weights() and worker.version == 2
    for k, v in worker.engine.model.state_dict().items():
        assert torch.equal(v, new[k]), k
    assert scorer.version == 2
    for k, v in scorer.model.state_dict().items():
        assert torch.equal(v, new[k]), k
    assert seen["stats"]["bytes"] == sum(t.numel() * t.element_size() for t in new.values())


# ----- whole runs in Ray -------------------------------------------------------------------------
def _capture_final_weights(monkeypatch) -> dict:
    """Before ``run_training`` frees its actors: the learner's weights (rank 0's packet; every
    rank takes part, as ZeRO-3 needs) and every rollout worker's (version, per-tensor sums)."""
    import ray

    import pipeline.orchestration.run as run_mod

    captured: dict = {}
    kill = run_mod.free_actors

    def capture_then_kill(actors):
        try:
            learners = [a for a in actors if hasattr(a, "broadcast_weights")]
            rollouts = [a for a in actors if hasattr(a, "weights_checksums")]
            packets = ray.get([a.weight_packet.remote(-1) for a in learners], timeout=TIMEOUT)
            captured["learner"] = packets[0].state_dict
            captured["rollouts"] = ray.get([a.weights_checksums.remote() for a in rollouts], timeout=TIMEOUT)
        finally:
            kill(actors)

    monkeypatch.setattr(run_mod, "free_actors", capture_then_kill)
    return captured


def _assert_engine_equals_learner(captured: dict, version: int) -> None:
    learner = captured["learner"]
    assert captured["rollouts"], "no rollout worker was captured"
    for got_version, sums in captured["rollouts"]:
        assert got_version == version
        assert set(learner) <= set(sums)
        for k, v in learner.items():
            want = float(v.to(torch.bfloat16).double().sum())  # the engine runs in bf16
            assert sums[k] == pytest.approx(want, rel=1e-9, abs=1e-9), k


def _assert_sync_metrics(history: list[dict]) -> None:
    for step, h in enumerate(history, 1):
        assert h["sync/gbps"] > 0 and h["sync/bytes"] > 0 and h["sync/seconds"] > 0
        assert h["sync/buckets"] > 1  # 1 MiB buckets: the tiny model takes several
        assert h["sync/version"] == step


def test_tiny_run_syncs_by_broadcast(ray_local, tmp_path, monkeypatch):
    captured = _capture_final_weights(monkeypatch)
    history = run_training(compose(BASE + ["trainer.total_steps=2", "cluster.sync_bucket_mb=1"]), tmp_path)
    assert len(history) == 2
    _assert_sync_metrics(history)
    _assert_engine_equals_learner(captured, version=2)
    # The weights did move, so equality is not the initial weights on both sides.
    from safetensors.torch import load_file

    from pipeline.models import resolve_model

    init = load_file(str(next(resolve_model("tiny").glob("*.safetensors"))))
    assert any(not torch.equal(init[k], captured["learner"][k]) for k in init if k in captured["learner"])


def test_two_zero3_learners_and_a_self_teacher_sync_by_broadcast(ray_local, tmp_path, monkeypatch):
    captured = _capture_final_weights(monkeypatch)
    cfg = compose(
        BASE
        + [
            "method=sdar",
            "trainer.total_steps=2",
            "cluster.sync_bucket_mb=1",
            "learner.num_learners=2",
            "learner.zero_stage=3",
            "learner.num_cpus=0.5",
        ]
    )
    history = run_training(cfg, tmp_path)
    assert len(history) == 2
    _assert_sync_metrics(history)
    _assert_engine_equals_learner(captured, version=2)
    # The scorer is in the group too: at lag 0 it scored with the behaviour weights every step.
    assert all(h["teacher/staleness"] == 0.0 for h in history)
