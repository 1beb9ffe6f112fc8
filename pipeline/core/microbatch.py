"""Splitting a TrainBatch into micro-batches by token budget.

A micro-batch holds consecutive rows whose padded size (rows x longest row) fits the budget; each
micro-batch is cut to its own longest row so padding is not carried through the forward pass.
A single row longer than the budget still forms a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from pipeline.core.types import TrainBatch

# TrainBatch fields that are [B, T] tensors aligned with input_ids.
_ALIGNED = ("input_ids", "attention_mask", "response_mask", "behaviour_logprobs", "advantages")
_TEACHER = ("teacher_input_ids", "teacher_attention_mask", "teacher_response_mask")


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Last attended position + 1 of each row (right padding)."""
    pos = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
    return ((pos + 1) * attention_mask.bool()).amax(dim=1).tolist()


def split_by_tokens(batch: TrainBatch, budget: int) -> list[TrainBatch]:
    lengths = row_lengths(batch.attention_mask)
    t_lengths = (
        row_lengths(batch.teacher_attention_mask) if batch.teacher_attention_mask is not None else [0] * len(lengths)
    )
    spans: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, (n, nt) in enumerate(zip(lengths, t_lengths)):
        cand = max(longest, n, nt)
        if i > start and cand * (i - start + 1) > budget:
            spans.append((start, i))
            start, cand = i, max(n, nt)
        longest = cand
    spans.append((start, len(lengths)))
    return [slice_rows(batch, a, b) for a, b in spans]


def sort_by_length(batch: TrainBatch) -> TrainBatch:
    """The batch's rows longest first (stable), so that token-budget micro-batches hold rows of
    similar length and carry little padding. The loss and every metric are sums over rows, so the
    row order changes nothing but the padding (``padded_tokens`` measures it)."""
    lengths = row_lengths(batch.attention_mask)
    if batch.teacher_attention_mask is not None:  # a micro-batch is as wide as its widest forward
        lengths = [max(n, nt) for n, nt in zip(lengths, row_lengths(batch.teacher_attention_mask))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if order == list(range(len(lengths))):
        return batch
    return take_rows(batch, order)


def _seqs(batch: TrainBatch) -> list[list[int]]:
    """Each row's tokens (prompt and response)."""
    return [batch.input_ids[i, :n].tolist() for i, n in enumerate(row_lengths(batch.attention_mask))]


def sort_by_tokens(batch: TrainBatch) -> TrainBatch:
    """The batch's rows in the order of their token ids (stable), so that rows sharing a prefix sit
    together and cut into runs that share it (``prefix_runs``); loss and metrics are sums over
    rows, so the order changes nothing else."""
    seqs = _seqs(batch)
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    return batch if order == list(range(len(seqs))) else take_rows(batch, order)


def prefix_runs(batch: TrainBatch, budget: int) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` whose rows, forwarded through their shared prefixes, carry at most
    ``budget`` tokens (a row longer than that alone); rows sorted by ``sort_by_tokens``. In
    sorted order the tokens a run carries are its rows' lengths less what each shares with the
    row before it (``pipeline.algorithm.shared_prefix.unique_tokens``)."""
    seqs = _seqs(batch)
    runs, start, cost = [], 0, 0
    for i, s in enumerate(seqs):
        shared = 0
        if i > start:
            prev = seqs[i - 1]
            limit = min(len(s), len(prev))
            while shared < limit and s[shared] == prev[shared]:
                shared += 1
        if i > start and cost + len(s) - shared > budget:
            runs.append((start, i))
            start, cost, shared = i, 0, 0
        cost += len(s) - shared
    runs.append((start, len(seqs)))
    return runs


def take_rows(batch: TrainBatch, rows: list[int]) -> TrainBatch:
    """The given rows of the batch, in that order, trimmed to their longest row (new tensors)."""
    idx = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    t = max(row_lengths(batch.attention_mask.index_select(0, idx)))

    def take(x: torch.Tensor, width: int) -> torch.Tensor:
        return x.index_select(0, idx)[:, :width]

    kw = {name: take(getattr(batch, name), t) for name in _ALIGNED}
    kw["distill"] = batch.distill.map(lambda v: take(v, t))
    if batch.teacher_input_ids is not None:
        tt = max(row_lengths(batch.teacher_attention_mask.index_select(0, idx)))
        kw.update({name: take(getattr(batch, name), tt) for name in _TEACHER})
    kw["versions"] = [batch.versions[i] for i in rows]
    return replace(batch, **kw)


def padded_tokens(mbs: list[TrainBatch]) -> tuple[int, int]:
    """(attended tokens, rows x width summed over micro-batches): what the forward passes carry."""
    real = sum(int(mb.attention_mask.sum()) for mb in mbs)
    return real, sum(mb.input_ids.shape[0] * mb.input_ids.shape[1] for mb in mbs)


def slice_rows(batch: TrainBatch, a: int, b: int, *, copy: bool = False) -> TrainBatch:
    """Rows [a, b) of the batch, trimmed to their longest row. Views share the batch's storage;
    ``copy=True`` gives compact tensors of their own (a view pickles its whole storage, so a
    slice sent to another process must be copied)."""
    t = max(row_lengths(batch.attention_mask[a:b]))

    def cut(x: torch.Tensor, width: int) -> torch.Tensor:
        return x[a:b, :width].clone() if copy else x[a:b, :width]

    kw = {name: cut(getattr(batch, name), t) for name in _ALIGNED}
    kw["distill"] = batch.distill.map(lambda v: cut(v, t))
    if batch.teacher_input_ids is not None:
        tt = max(row_lengths(batch.teacher_attention_mask[a:b]))
        kw.update({name: cut(getattr(batch, name), tt) for name in _TEACHER})
    kw["versions"] = batch.versions[a:b]
    return replace(batch, **kw)


def null_micro_batch(mb: TrainBatch) -> TrainBatch:
    """The first row of ``mb`` with no response token: its loss is exactly 0 and its gradient
    zero, but its forward and backward run the same collectives as a real micro-batch."""
    one = slice_rows(mb, 0, 1, copy=True)
    one.response_mask.zero_()
    for v in one.distill.present().values():
        v.zero_()
    if one.teacher_response_mask is not None:
        one.teacher_response_mask.zero_()
    return one


def split_rows(batch: TrainBatch, n_parts: int) -> list[TrainBatch]:
    """``n_parts`` contiguous row slices of near-equal size (data-parallel shards), each with
    tensors of its own: a shard travels to its rank alone, not with the whole batch's storage.
    The batch's ``extra_loss_tokens`` go to the first shard only (the ranks sum them)."""
    b = batch.n_rows
    bounds = [round(i * b / n_parts) for i in range(n_parts + 1)]
    shards = [
        slice_rows(batch, bounds[i], bounds[i + 1], copy=True) for i in range(n_parts) if bounds[i + 1] > bounds[i]
    ]
    return [replace(s, extra_loss_tokens=0.0) if i else s for i, s in enumerate(shards)]


def to_device(batch: TrainBatch, device: "str | torch.device") -> TrainBatch:
    """The batch with every tensor on ``device`` (the same object when they are there already)."""
    device = torch.device(device)
    here = batch.input_ids.device
    if here.type == device.type and (device.index is None or here.index == device.index or device.type == "cpu"):
        return batch
    kw = {name: getattr(batch, name).to(device, non_blocking=True) for name in _ALIGNED}
    kw["distill"] = batch.distill.map(lambda v: v.to(device, non_blocking=True))
    if batch.teacher_input_ids is not None:
        kw.update({name: getattr(batch, name).to(device, non_blocking=True) for name in _TEACHER})
    return replace(batch, **kw)


assert {f.name for f in fields(TrainBatch)} >= set(_ALIGNED) | set(_TEACHER)
