"""Moving learner weights to rollout workers and the self-teacher scorer.

Two routes (``cluster.weight_sync``). ``object_store``, the CPU default: learner rank 0 returns a
``WeightPacket`` (put once, read by every consumer). ``collective``: learner rank 0 broadcasts
over a torch.distributed group (``pipeline/distributed/collective_sync.py``). Either way every sync carries
the weights version, the tensor count, the parameter count and a checksum; the receiver checks
them before it swaps anything in, so a partial or corrupted sync is detected and refused, never
silently trained or sampled on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class WeightSyncError(RuntimeError):
    pass


@dataclass
class WeightPacket:
    version: int
    state_dict: dict[str, torch.Tensor]
    n_tensors: int
    n_params: int
    checksum: float  # sum over tensors of the float64 sum of their values

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict.values())


def _checksum(sd: dict[str, torch.Tensor]) -> float:
    return float(sum(t.detach().double().sum().item() for t in sd.values()))


def checksum_matches(got: float, expected: float) -> bool:
    """Equal up to float64 summation order (a CUDA sum adds in another order than a CPU one)."""
    return abs(got - expected) <= 1e-6 * max(1.0, abs(expected))


def pack(state_dict: dict[str, torch.Tensor], version: int) -> WeightPacket:
    return WeightPacket(version=version, state_dict=state_dict, n_tensors=len(state_dict),
                        n_params=sum(t.numel() for t in state_dict.values()),
                        checksum=_checksum(state_dict))


def verify(packet: WeightPacket, expected_keys: set[str] | None = None) -> None:
    """Raise WeightSyncError unless the packet is complete and intact."""
    sd = packet.state_dict
    if len(sd) != packet.n_tensors or sum(t.numel() for t in sd.values()) != packet.n_params:
        raise WeightSyncError(f"weights v{packet.version}: got {len(sd)} tensors, "
                              f"expected {packet.n_tensors} ({packet.n_params} params)")
    if expected_keys is not None:
        missing = expected_keys - set(sd)
        if missing:
            raise WeightSyncError(f"weights v{packet.version}: {len(missing)} tensors missing, "
                                  f"e.g. {sorted(missing)[:3]}")
    got = _checksum(sd)
    if not checksum_matches(got, packet.checksum):
        raise WeightSyncError(f"weights v{packet.version}: checksum {got} != {packet.checksum}")
