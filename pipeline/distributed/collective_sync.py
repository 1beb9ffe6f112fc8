"""Weight sync over a torch.distributed group: learner rank 0 broadcasts, consumers receive.

This is the route GPU frameworks (verl, OpenRLHF, SkyRL) take from the trainer to the inference
engines; the object store route (``pipeline/distributed/weight_sync.py``) stays the CPU default.

* The group is NOT the default process group: learner ranks already use that one for DeepSpeed,
  and each rollout worker / the scorer is a separate process with no default group (or with
  vLLM's own). So, as vLLM's ``StatelessProcessGroup`` and verl's ``init_custom_process_group``
  do, we build the backend object directly from a TCPStore: learner rank 0 is group rank 0 and
  hosts the store; consumers are ranks 1..N.
* Weights travel in buckets: tensors of one dtype packed into one contiguous buffer of at most
  ``bucket_bytes`` (a bigger tensor goes alone), one broadcast per bucket. Few large messages
  suit NCCL (per-call latency) and keep extra memory bounded by one bucket on the sender.
* Both sides derive the bucket plan from the same ``meta`` (ordered ``(name, dtype, shape)``,
  fetched once at setup: shapes never change), so nothing but the payload is sent per sync...
* ...plus a float64 trailer ``[version, n_tensors, n_params, checksum]``. The receiver checks it
  against what it got and raises ``WeightSyncError``: a partial or corrupt sync is never applied.
* Plans must agree. gloo copies a shorter message into a longer buffer without complaint and
  aborts the receiving process on a longer one, so the sender refuses (before sending anything) a
  state dict that no longer matches the meta the receivers were given; the receivers then time
  out with a WeightSyncError.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pipeline.core.errors import WeightsLost
from pipeline.distributed.weight_sync import WeightSyncError, _checksum, checksum_matches

DEFAULT_TIMEOUT_S = 600.0  # per collective op (and for the group's rendezvous)

Meta = list[tuple[str, torch.dtype, tuple[int, ...]]]  # ordered (name, dtype, shape)


# ----- bucket plan (pure) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int  # in elements, inside the bucket
    numel: int


@dataclass
class Bucket:
    dtype: torch.dtype
    slots: list[Slot] = field(default_factory=list)
    numel: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def meta_of(state_dict: dict[str, torch.Tensor]) -> Meta:
    return [(k, v.dtype, tuple(v.shape)) for k, v in state_dict.items()]


def plan_buckets(meta: Meta, bucket_bytes: int) -> list[Bucket]:
    """Greedy packing, dtype by dtype (in order of first appearance), tensors in ``meta`` order.

    A bucket is closed when the next tensor of its dtype would push it past ``bucket_bytes``; a
    tensor bigger than ``bucket_bytes`` gets a bucket of its own. Deterministic: sender and
    receivers compute the same plan from the same meta.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    by_dtype: dict[torch.dtype, list[Bucket]] = {}
    for name, dtype, shape in meta:
        numel = 1
        for d in shape:
            numel *= int(d)
        buckets = by_dtype.setdefault(dtype, [Bucket(dtype)])
        cur = buckets[-1]
        if cur.slots and (cur.numel + numel) * _itemsize(dtype) > bucket_bytes:
            cur = Bucket(dtype)
            buckets.append(cur)
        cur.slots.append(Slot(name, tuple(int(d) for d in shape), cur.numel, numel))
        cur.numel += numel
    return [b for buckets in by_dtype.values() for b in buckets if b.slots]


# ----- the group ---------------------------------------------------------------------------------
@dataclass
class WeightGroup:
    pg: dist.ProcessGroup
    store: dist.Store  # the PrefixStore over the TCPStore; rank 0's holds the store's server
    rank: int
    world_size: int
    backend: str  # gloo | nccl

    @property
    def device(self) -> torch.device:
        """Where buffers live: NCCL moves CUDA memory, gloo CPU memory."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def resolve_backend(backend: str) -> str:
    """``auto`` -> nccl where this process sees CUDA, else gloo (call it in the learner process)."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"sync backend {backend!r}: auto | gloo | nccl")
    return backend


def init_group(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    name: str = "privy_weights",
    tcp: dist.TCPStore | None = None,
) -> WeightGroup:
    """Join the weight group; blocks until all ``world_size`` members have joined, so every
    member's call must be in flight at once (see ``LearnerGroup.init_weight_group``).

    Rank 0 runs the store's server: pass the one it already bound (``rendezvous.host_store``,
    whose port cannot have been taken since), or it binds ``port`` now. The others connect and
    retry until it is up or ``timeout_s`` passes."""
    from pipeline.distributed.rendezvous import host_store, join_store

    timeout = datetime.timedelta(seconds=timeout_s)
    backend = resolve_backend(backend)
    if tcp is None:
        tcp = host_store(timeout_s, port, host) if rank == 0 else join_store(host, port, timeout_s)
    store = dist.PrefixStore(name, tcp)  # a namespace of our own in case the port is ever shared
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    else:
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    return WeightGroup(pg, store, rank, world_size, backend)


def _broadcast(group: WeightGroup, t: torch.Tensor) -> None:
    group.pg.broadcast(t, 0).wait()


# ----- sender / receiver -------------------------------------------------------------------------
def _trailer(version: int, sd: dict[str, torch.Tensor], device) -> torch.Tensor:
    n_params = sum(t.numel() for t in sd.values())
    return torch.tensor([version, len(sd), n_params, _checksum(sd)], dtype=torch.float64, device=device)


def send_buckets(group: WeightGroup, state_dict: dict[str, torch.Tensor], plan: list[Bucket], device) -> None:
    for b in plan:
        if len(b.slots) == 1:  # alone in its bucket: send the tensor itself, no packing copy
            flat = state_dict[b.slots[0].name].detach().to(device).contiguous().view(-1)
        else:
            flat = torch.empty(b.numel, dtype=b.dtype, device=device)
            for s in b.slots:
                flat[s.offset : s.offset + s.numel].copy_(state_dict[s.name].detach().reshape(-1))
        _broadcast(group, flat)


def broadcast_state_dict(
    group: WeightGroup,
    state_dict: dict[str, torch.Tensor],
    version: int,
    bucket_bytes: int,
    device=None,
    meta: Meta | None = None,
) -> dict[str, float]:
    """Group rank 0: send ``state_dict`` (bucket by bucket, then the trailer); returns stats.
    ``meta``: what the receivers were given; a state dict that differs is refused unsent."""
    device = group.device if device is None else device
    t0 = time.perf_counter()
    own = meta_of(state_dict)
    if meta is not None and own != list(meta):
        diff = [m for m in own if m not in meta] + [m for m in meta if m not in own]
        raise WeightSyncError(
            f"weights v{version}: the state dict no longer matches the receivers' meta (e.g. {diff[:3]}); not sending"
        )
    plan = plan_buckets(own, bucket_bytes)
    try:
        send_buckets(group, state_dict, plan, device)
        _broadcast(group, _trailer(version, state_dict, device))
    except RuntimeError as e:  # a receiver died or timed out mid-sync
        raise WeightSyncError(f"weights v{version}: broadcast failed: {e}") from e
    seconds = time.perf_counter() - t0
    nbytes = sum(b.nbytes for b in plan)
    return {
        "seconds": seconds,
        "bytes": float(nbytes),
        "buckets": float(len(plan)),
        "gbps": nbytes / max(seconds, 1e-9) / 1e9,
    }


def receive_state_dict(
    group: WeightGroup, meta: Meta, version: int, bucket_bytes: int, device=None
) -> dict[str, torch.Tensor]:
    """Group ranks > 0: receive one sync and return it as a fresh state dict, or raise
    ``WeightSyncError`` if the trailer disagrees with what arrived (version, counts, checksum)."""
    device = group.device if device is None else device
    sd: dict[str, torch.Tensor] = {}
    try:
        for b in plan_buckets(meta, bucket_bytes):
            # A fresh buffer per bucket per sync: the returned tensors are views of it, and no
            # later sync writes into it, so they never alias weights still queued or in use.
            flat = torch.empty(b.numel, dtype=b.dtype, device=device)
            _broadcast(group, flat)
            for s in b.slots:
                sd[s.name] = flat[s.offset : s.offset + s.numel].view(s.shape)
        # Reorder as meta (the plan groups by dtype) so the dict matches the learner's. Our
        # checksum is computed before the trailer arrives: meanwhile the sender computes its own.
        sd = {name: sd[name] for name, _, _ in meta}
        got = _checksum(sd)
        trailer = torch.empty(4, dtype=torch.float64, device=device)
        _broadcast(group, trailer)
    except RuntimeError as e:  # a member died or timed out mid-sync
        raise WeightSyncError(f"weights v{version}: broadcast failed: {e}") from e
    got_version, n_tensors, n_params, checksum = trailer.tolist()
    if int(got_version) != version:
        raise WeightSyncError(f"weights v{version}: the sender sent v{int(got_version)}")
    got_params = sum(t.numel() for t in sd.values())
    if len(sd) != int(n_tensors) or got_params != int(n_params):
        raise WeightSyncError(
            f"weights v{version}: got {len(sd)} tensors ({got_params} params), "
            f"expected {int(n_tensors)} ({int(n_params)} params)"
        )
    if not checksum_matches(got, checksum):
        raise WeightSyncError(f"weights v{version}: checksum {got} != {checksum}")
    return sd


class WeightGroupMember:
    """The consumer side of the weight group, a mixin of the actors that follow the learner
    (rollout worker, self-teacher scorer): ``init_weight_group`` joins once, then
    ``_receive_weights_dict(version)`` takes one sync into a fresh dict."""

    _weight_group: tuple[object, Meta, int] | None = None  # (group, meta, bucket bytes) once joined

    def init_weight_group(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        meta: Meta,
        bucket_bytes: int,
        timeout_s: float | None = None,
    ) -> int:
        """Join the learner's weight group as ``rank``; ``meta`` = the learner's ``sync_meta()``."""
        group = init_group(host, port, rank, world_size, backend, timeout_s=timeout_s or DEFAULT_TIMEOUT_S)
        self._weight_group = (group, meta, bucket_bytes)
        return rank

    def _receive_weights_dict(self, version: int, member: str) -> dict[str, torch.Tensor]:
        """One broadcast, checked: WeightSyncError on a partial or corrupt sync. ``member`` names
        the actor in the WeightsLost of a process that is not in the group."""
        if self._weight_group is None:  # a process Ray restarted: not in the group yet
            raise WeightsLost(
                f"{member} is not in the weight group (a restarted process); weights v{version} cannot reach it"
            )
        group, meta, bucket_bytes = self._weight_group
        return receive_state_dict(group, meta, version, bucket_bytes)
