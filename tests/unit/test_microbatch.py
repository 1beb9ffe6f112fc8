"""Micro-batching and data-parallel sharding of a TrainBatch."""

import pickle

import torch

from pipeline.core.microbatch import slice_rows, split_by_tokens, split_rows
from pipeline.core.types import Distill, TrainBatch


def batch_of(lengths: list[int], width: int | None = None) -> TrainBatch:
    """Right-padded rows of the given lengths, the last half of each row a response."""
    width = width or max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.arange(1, n + 1)
        attn[i, :n] = 1
        resp[i, n // 2 : n] = 1
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=torch.zeros(len(lengths), width),
        advantages=torch.ones(len(lengths), width),
        distill=Distill(teacher_logprobs=torch.zeros(len(lengths), width)),
        versions=list(range(len(lengths))),
    )


def test_each_data_parallel_shard_pickles_only_its_own_rows():
    batch = batch_of([512] * 8)
    whole = len(pickle.dumps(batch))
    shards = split_rows(batch, 4)
    assert [s.n_rows for s in shards] == [2, 2, 2, 2]
    for shard in shards:
        assert len(pickle.dumps(shard)) < 0.3 * whole  # a quarter of the rows, not the whole storage
        assert torch.equal(shard.input_ids, batch.input_ids[shard.versions[0] : shard.versions[-1] + 1])


def test_slices_are_views_unless_copied():
    batch = batch_of([8, 6, 4])
    view = slice_rows(batch, 0, 2)
    assert view.input_ids.untyped_storage().data_ptr() == batch.input_ids.untyped_storage().data_ptr()
    own = slice_rows(batch, 0, 2, copy=True)
    assert own.input_ids.untyped_storage().data_ptr() != batch.input_ids.untyped_storage().data_ptr()
    assert torch.equal(own.input_ids, view.input_ids) and own.input_ids.shape == (2, 8)


def test_micro_batches_fit_the_token_budget_and_trim_their_padding():
    batch = batch_of([10, 10, 3, 3, 3, 3])
    mbs = split_by_tokens(batch, budget=20)
    assert [m.n_rows for m in mbs] == [2, 4]
    assert [m.input_ids.shape[1] for m in mbs] == [10, 3]


def test_sorting_rows_by_length_cuts_padding_and_keeps_every_row_whole():
    from pipeline.core.microbatch import padded_tokens, row_lengths, sort_by_length

    lengths = [3, 12, 4, 11, 5, 12, 3]
    b = batch_of(lengths)
    b.advantages = torch.arange(len(lengths), dtype=torch.float).unsqueeze(1).expand_as(b.advantages).clone()
    s = sort_by_length(b)
    assert row_lengths(s.attention_mask) == sorted(lengths, reverse=True)
    assert s.versions == [1, 5, 3, 4, 2, 0, 6]  # stable: equal lengths keep their order
    for j, v in enumerate(s.versions):  # each row moved whole, every field with it
        for name in ("input_ids", "attention_mask", "response_mask", "behaviour_logprobs", "advantages"):
            assert torch.equal(getattr(s, name)[j], getattr(b, name)[v])
        assert torch.equal(s.distill.teacher_logprobs[j], b.distill.teacher_logprobs[v])
    before = padded_tokens(split_by_tokens(b, 24))
    after = padded_tokens(split_by_tokens(s, 24))
    assert before[0] == after[0] == sum(lengths)
    assert after[1] < before[1]
    assert sort_by_length(s) is s  # sorted already: nothing copied
