"""pipeline/distributed/collective_sync.py: the bucket plan (pure), and real gloo broadcasts on this machine.

The round trip runs between 3 processes (this one sends, two spawned ones receive); the error
cases run the group members as threads of this process (a gloo group does not care), with real
broadcasts: a receiver must raise WeightSyncError on a wrong version, a payload that does not match
the trailer's checksum, or counts that differ, and must return nothing in that case.
"""

from __future__ import annotations

import io
import threading
import traceback

import pytest
import torch

from pipeline.distributed.collective_sync import (
    Bucket,
    broadcast_state_dict,
    init_group,
    meta_of,
    plan_buckets,
    receive_state_dict,
    send_buckets,
)
from pipeline.distributed.rendezvous import host_store
from pipeline.distributed.weight_sync import WeightSyncError, _checksum

F32, BF16 = torch.float32, torch.bfloat16
TIMEOUT_S = 60.0


# ----- bucket plan -------------------------------------------------------------------------------
def _names(b: Bucket) -> list[str]:
    return [s.name for s in b.slots]


def test_plan_packs_greedily_up_to_the_bucket_size():
    meta = [(f"t{i}", F32, (10,)) for i in range(5)]  # 40 bytes each
    plan = plan_buckets(meta, bucket_bytes=100)  # two fit (80), a third would be 120
    assert [_names(b) for b in plan] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert [b.nbytes for b in plan] == [80, 80, 40]
    assert all(b.nbytes <= 100 for b in plan)
    assert [(s.offset, s.numel) for s in plan[0].slots] == [(0, 10), (10, 10)]


def test_plan_fills_a_bucket_exactly():
    plan = plan_buckets([(f"t{i}", F32, (5,)) for i in range(4)], bucket_bytes=40)
    assert [_names(b) for b in plan] == [["t0", "t1"], ["t2", "t3"]]


def test_plan_groups_by_dtype_in_order_of_first_appearance_and_keeps_meta_order():
    meta = [("a", BF16, (4,)), ("b", F32, (2, 2)), ("c", BF16, (3,)), ("d", torch.int64, ()), ("e", F32, (1,))]
    plan = plan_buckets(meta, bucket_bytes=1 << 20)
    assert [(b.dtype, _names(b)) for b in plan] == [(BF16, ["a", "c"]), (F32, ["b", "e"]), (torch.int64, ["d"])]
    assert [b.nbytes for b in plan] == [(4 + 3) * 2, (4 + 1) * 4, 8]
    assert plan[1].slots[0].shape == (2, 2) and plan[2].slots[0].shape == () and plan[2].numel == 1


def test_plan_puts_an_oversize_tensor_alone():
    meta = [("small0", F32, (2,)), ("big", F32, (100,)), ("small1", F32, (2,)), ("small2", F32, (2,))]
    plan = plan_buckets(meta, bucket_bytes=32)
    assert [_names(b) for b in plan] == [["small0"], ["big"], ["small1", "small2"]]
    assert plan[1].nbytes == 400  # over the 32-byte bucket size, so alone


def test_plan_is_deterministic_and_covers_every_tensor_once():
    g = torch.Generator().manual_seed(0)
    dtypes = [F32, BF16, torch.float16]
    meta = [(f"p{i}", dtypes[i % 3], tuple(torch.randint(1, 50, (2,), generator=g).tolist())) for i in range(60)]
    a, b = plan_buckets(meta, 1000), plan_buckets(meta, 1000)
    assert [(x.dtype, x.slots) for x in a] == [(y.dtype, y.slots) for y in b]
    names = [s.name for x in a for s in x.slots]
    assert sorted(names) == sorted(n for n, _, _ in meta) and len(names) == len(meta)
    for x in a:  # slots are contiguous and of one dtype
        assert sum(s.numel for s in x.slots) == x.numel
        assert [s.offset for s in x.slots] == [sum(s.numel for s in x.slots[:i]) for i in range(len(x.slots))]


def test_plan_rejects_a_non_positive_bucket():
    with pytest.raises(ValueError):
        plan_buckets([("a", F32, (1,))], 0)


# ----- real broadcasts ---------------------------------------------------------------------------
def _state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Mixed dtypes (fp32, bf16, fp16, int64, a 0-d tensor) with one tensor over 1 KiB (the
    bucket size the tests use) and a non-contiguous one."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 8, generator=g),  # 2 KiB fp32: alone in its bucket
        "layer.0.w": torch.randn(4, 6, generator=g).to(BF16),
        "layer.0.b": torch.randn(6, generator=g),
        "layer.1.w": torch.randn(6, 4, generator=g).t(),  # non-contiguous view
        "layer.1.scale": torch.randn(5, generator=g).to(torch.float16),
        "layer.1.b": torch.randn(3, generator=g).to(BF16),
        "step": torch.tensor(7, dtype=torch.int64),
        "head.weight": torch.randn(30, 8, generator=g),
    }


BUCKET = 1024


def _receiver(rank: int, port: int, world: int, meta, version: int, q) -> None:
    try:
        group = init_group("127.0.0.1", port, rank, world, "gloo", timeout_s=TIMEOUT_S)
        sd = receive_state_dict(group, meta, version, BUCKET, torch.device("cpu"))
        # Bytes, not tensors: torch.multiprocessing would share the storage through this process,
        # which may have exited by the time the parent reads it (FileNotFoundError, seen flaky).
        buf = io.BytesIO()
        torch.save({k: v.clone() for k, v in sd.items()}, buf)
        q.put((rank, buf.getvalue(), None))
    except BaseException:  # report it to the parent
        q.put((rank, None, traceback.format_exc()))


def test_round_trip_between_three_processes():
    import torch.multiprocessing as mp

    sd = _state_dict()
    meta = meta_of(sd)
    store, world, version = host_store(TIMEOUT_S), 3, 5  # bound before anyone needs its port
    port = store.port
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(r, port, world, meta, version, q), daemon=True) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        group = init_group("127.0.0.1", port, 0, world, "gloo", timeout_s=TIMEOUT_S, tcp=store)
        stats = broadcast_state_dict(group, sd, version, BUCKET)
        got = sorted([q.get(timeout=TIMEOUT_S) for _ in procs], key=lambda x: x[0])
    finally:
        for p in procs:
            p.join(timeout=TIMEOUT_S)
            if p.is_alive():
                p.kill()
    plan = plan_buckets(meta, BUCKET)
    assert stats["buckets"] == len(plan) and stats["bytes"] == sum(b.nbytes for b in plan)
    assert stats["bytes"] == sum(t.numel() * t.element_size() for t in sd.values())
    assert stats["gbps"] > 0 and stats["seconds"] > 0
    for rank, blob, err in got:
        assert err is None, f"receiver {rank} failed:\n{err}"
        rsd = torch.load(io.BytesIO(blob))
        assert list(rsd) == list(sd), "the received dict must keep the learner's key order"
        for k, v in sd.items():
            assert rsd[k].dtype == v.dtype and rsd[k].shape == v.shape, k
            assert torch.equal(rsd[k], v), k


def _run_members(fns, timeout: float = TIMEOUT_S) -> list:
    """Run ``fns[r](group_r)`` for every rank r in threads of this process; return results or
    the exceptions raised."""
    store, world = host_store(timeout), len(fns)
    port = store.port
    out: list = [None] * world

    def member(r):
        try:
            group = init_group("127.0.0.1", port, r, world, "gloo", timeout_s=timeout, tcp=store if r == 0 else None)
            out[r] = fns[r](group)
        except BaseException as e:
            out[r] = e

    threads = [threading.Thread(target=member, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    assert not any(t.is_alive() for t in threads), "a group member hung"
    return out


def _recv(meta, version):
    return lambda g: receive_state_dict(g, meta, version, BUCKET)


def test_threads_round_trip_and_the_fresh_dicts_do_not_alias():
    sd = _state_dict()
    meta = meta_of(sd)

    def send_twice(g):
        broadcast_state_dict(g, sd, 1, BUCKET)
        return broadcast_state_dict(g, _state_dict(seed=1), 2, BUCKET)

    def recv_twice(g):
        return receive_state_dict(g, meta, 1, BUCKET), receive_state_dict(g, meta, 2, BUCKET)

    out = _run_members([send_twice, recv_twice])
    assert isinstance(out[0], dict), out[0]
    first, second = out[1]
    sd2 = _state_dict(seed=1)
    assert all(torch.equal(first[k], sd[k]) for k in sd), "the second sync overwrote the first's tensors"
    assert all(torch.equal(second[k], sd2[k]) for k in sd2)


def test_wrong_version_raises():
    sd = _state_dict()
    out = _run_members([lambda g: broadcast_state_dict(g, sd, 3, BUCKET), _recv(meta_of(sd), 4)])
    assert isinstance(out[0], dict)
    assert isinstance(out[1], WeightSyncError) and "v3" in str(out[1]), out[1]


def test_payload_not_matching_the_trailer_raises():
    """The buckets of a corrupted state dict, then the trailer of the good one."""
    from pipeline.distributed.collective_sync import _broadcast, _trailer

    sd = _state_dict()
    bad = {k: v.clone() for k, v in sd.items()}
    bad["head.weight"][3, 1] += 1.0

    def sender(g):
        send_buckets(g, bad, plan_buckets(meta_of(bad), BUCKET), g.device)
        _broadcast(g, _trailer(1, sd, g.device))

    out = _run_members([sender, _recv(meta_of(sd), 1), _recv(meta_of(sd), 1)])
    for e in out[1:]:
        assert isinstance(e, WeightSyncError) and "checksum" in str(e), e


def test_corrupt_trailer_counts_raise():
    from pipeline.distributed.collective_sync import _broadcast

    sd = _state_dict()
    meta = meta_of(sd)
    n_params = sum(t.numel() for t in sd.values())

    def sender(g):
        send_buckets(g, sd, plan_buckets(meta, BUCKET), g.device)
        _broadcast(g, torch.tensor([1, len(sd) + 1, n_params, _checksum(sd)], dtype=torch.float64))

    out = _run_members([sender, _recv(meta, 1)])
    assert isinstance(out[1], WeightSyncError) and "tensors" in str(out[1]), out[1]


def test_a_tensor_larger_than_a_bucket_round_trips():
    sd = {"small": torch.arange(4, dtype=F32), "huge": torch.randn(1000, 3), "tail": torch.arange(6, dtype=F32)}
    meta = meta_of(sd)
    plan = plan_buckets(meta, 256)
    assert [[s.name for s in b.slots] for b in plan] == [["small"], ["huge"], ["tail"]]
    out = _run_members([lambda g: broadcast_state_dict(g, sd, 1, 256), lambda g: receive_state_dict(g, meta, 1, 256)])
    assert out[0]["buckets"] == 3 and out[0]["bytes"] == (4 + 3000 + 6) * 4
    assert all(torch.equal(out[1][k], sd[k]) for k in sd)


def test_a_sender_whose_state_dict_left_the_meta_refuses_and_the_receiver_times_out():
    """gloo aborts a receiver whose buffer is shorter than the message, so a plan mismatch must be
    caught by the sender before anything is sent; the receiver then fails by timeout, cleanly."""
    sd = _state_dict()
    meta = meta_of(sd)
    grown = {**sd, "extra": torch.zeros(400)}
    out = _run_members(
        [
            lambda g: broadcast_state_dict(g, grown, 1, BUCKET, meta=meta),
            lambda g: receive_state_dict(g, meta, 1, BUCKET),
        ],
        timeout=3.0,
    )
    assert isinstance(out[0], WeightSyncError) and "meta" in str(out[0]), out[0]
    assert isinstance(out[1], WeightSyncError) and "broadcast failed" in str(out[1]), out[1]


def test_config_refuses_an_nccl_weight_group_with_colocated_pairs():
    from pipeline.core.config import ConfigError, PrivyConfig, validate

    cfg = PrivyConfig()
    cfg.cluster.placement, cfg.cluster.colocate, cfg.cluster.weight_sync = "pack", True, "collective"
    for backend in ("auto", "nccl"):
        cfg.cluster.sync_backend = backend
        with pytest.raises(ConfigError, match="weight_sync=object_store or cluster.sync_backend=gloo"):
            validate(cfg)
    cfg.cluster.sync_backend = "gloo"  # CPU buffers: no device is shared by two ranks
    try:
        validate(cfg)
    except ConfigError as e:
        assert "sync_backend" not in str(e)
