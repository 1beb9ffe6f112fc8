"""Weights out of the learner: its full state dict (consolidated under ZeRO-3) and the collective
route of weight sync (``pipeline/distributed/collective_sync.py``).

A mixin of ``LearnerWorker`` (``actors/learner.py``): it reads the worker's ``cfg``, ``rank``,
``engine`` and ``module``.
"""

from __future__ import annotations

import torch

from pipeline.core.errors import NonFiniteWeights
from pipeline.distributed.weight_sync import without_aliases


def check_finite(sd: dict[str, torch.Tensor], what: str) -> None:
    """Raise NonFiniteWeights naming how many tensors of ``sd`` hold NaN or inf (and the first
    few): such weights must never leave the learner, be saved or marked latest."""
    bad = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise NonFiniteWeights(
            f"{what}: {len(bad)} of {len(sd)} weight tensors hold NaN or inf ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}) although the update's loss and gradients were finite; "
            "they are not published or saved"
        )


class WeightSource:
    def state_dict_for_sync(self, device: str | torch.device = "cpu", copy: bool = True) -> dict[str, torch.Tensor]:
        """The full weights on ``device`` in the module's dtype (consolidated under ZeRO-3), each
        storage once (a tied LM head goes under its embedding's name only), rank 0 only. Under ZeRO-3
        every rank must call it (the gather is collective). ``copy=False`` may return the live
        parameters themselves (fine for a read-only use such as a broadcast). Every sync and save
        goes through here, so weights that are not finite stop here (NonFiniteWeights)."""
        if self.cfg.zero_stage == 3:
            sd = self.engine._zero3_consolidated_16bit_state_dict()
        else:
            sd = self.module.state_dict()
        out = {k: v.detach().to(device, copy=copy) for k, v in without_aliases(sd or {}).items()}
        check_finite(out, f"the weights after step {self.version}")
        return out

    # Collective route (pipeline/distributed/collective_sync.py): rank 0 is rank 0 of a weight group of its
    # own; the consumers (rollout workers, a self-teacher scorer) are ranks 1..N.
    def sync_meta(self):
        """Ordered (name, dtype, shape) of the weights ``broadcast_weights`` sends (rank 0; other
        ranks return None). Every rank must call it under ZeRO-3."""
        from pipeline.distributed.collective_sync import meta_of

        if self.rank != 0 and self.cfg.zero_stage != 3:
            return None
        sd = self.state_dict_for_sync(copy=False)
        if self.rank != 0:
            return None
        self._sync_meta = meta_of(sd)  # broadcast_weights refuses a state dict that differs
        return self._sync_meta

    def init_weight_group(
        self,
        host: str,
        port: int,
        world_size: int,
        backend: str,
        *,
        bucket_bytes: int,
        timeout_s: float | None = None,
        store=None,
    ) -> str | None:
        """Rank 0 joins (and hosts, on ``store`` if it bound one already) the weight group as its
        rank 0; other ranks do nothing. Blocks until every member has joined. Returns the backend
        in use (rank 0)."""
        from pipeline.distributed.collective_sync import DEFAULT_TIMEOUT_S, init_group

        if self.rank != 0:
            return None
        self._weight_group = init_group(
            host, port, 0, world_size, backend, timeout_s=timeout_s or DEFAULT_TIMEOUT_S, tcp=store
        )
        self._sync_bucket_bytes = bucket_bytes
        return self._weight_group.backend

    def broadcast_weights(self, version: int) -> dict[str, float] | None:
        """Every rank calls it (ZeRO-3 gathers collectively); rank 0 broadcasts and returns the
        stats (seconds, bytes, buckets, gbps). With NCCL the weights go out from the current
        CUDA device, with gloo from CPU memory."""
        from pipeline.distributed.collective_sync import broadcast_state_dict

        if self.rank != 0:
            if self.cfg.zero_stage == 3:
                self.state_dict_for_sync(copy=False)  # take part in the gather
            return None
        group = self._weight_group
        sd = self.state_dict_for_sync(device=group.device, copy=False)  # read only: no copy
        return broadcast_state_dict(group, sd, version, self._sync_bucket_bytes, meta=getattr(self, "_sync_meta", None))
