"""Rows whose advantage is 0 leave the learner's batch (``trainer.skip_zero_advantage_rows``) and
their tokens stay in token_mean's denominator, so the policy gradient is that of the whole batch."""

import torch

from pipeline.algorithm.losses import policy_loss
from pipeline.core.microbatch import split_rows
from pipeline.core.types import AuxTerm, Distill, TrainBatch
from pipeline.orchestration.batches import drop_silent_rows


def _batch(advantages: list[float], lengths: list[int]) -> TrainBatch:
    """Rows of the given lengths (prompt 3 tokens, the rest response), one advantage per row."""
    width = max(lengths)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (len(lengths), width), generator=g)
    attn = torch.zeros(len(lengths), width, dtype=torch.long)
    resp = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        resp[i, 3:n] = 1.0
    adv = torch.tensor(advantages).unsqueeze(1) * resp
    return TrainBatch(
        input_ids=ids * attn,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=-torch.rand(len(lengths), width, generator=g) * resp,
        advantages=adv,
        versions=list(range(len(lengths))),
    )


def test_zero_advantage_rows_leave_and_their_tokens_stay_in_the_denominator():
    batch = _batch([0.0, 1.5, 0.0, -0.7, 0.0], [9, 7, 12, 6, 5])
    kept = drop_silent_rows(batch)
    assert kept.versions == [0, 1, 3]  # the first row stays (min_rows=1), then the non-zero ones
    assert kept.extra_loss_tokens == float(batch.response_mask[[2, 4]].sum())
    assert kept.n_tokens + kept.extra_loss_tokens == batch.n_tokens
    assert kept.input_ids.shape[1] == 9  # trimmed to its longest kept row
    assert torch.equal(kept.advantages[1, :7], batch.advantages[1, :7])


def test_the_policy_gradient_is_the_whole_batchs():
    batch = _batch([0.0, 1.5, 0.0, -0.7, 2.0, 0.0], [9, 7, 12, 6, 8, 5])
    kept = drop_silent_rows(batch)
    cur = batch.behaviour_logprobs + 0.3 * torch.randn(
        batch.behaviour_logprobs.shape, generator=torch.Generator().manual_seed(1)
    )

    def grad(b: TrainBatch, rows: list[int]) -> torch.Tensor:
        lp = cur[rows, : b.input_ids.shape[1]].clone().requires_grad_(True)
        n_total = b.response_mask.sum() + b.extra_loss_tokens
        loss, _ = policy_loss(
            lp,
            b.behaviour_logprobs,
            b.advantages,
            b.response_mask,
            n_total,
            clip_low=0.2,
            clip_high=0.2,
            dual_clip=3.0,
            correction="none",
        )
        loss.backward()
        return lp.grad

    full = grad(batch, list(range(6)))
    part = grad(kept, kept.versions)
    assert torch.allclose(full[kept.versions, : part.shape[1]], part, atol=1e-7)
    assert float(full.abs().sum()) > 0 and float(full[[2, 5]].abs().sum()) == 0.0


def test_batches_that_an_aux_term_reads_stay_whole():
    batch = _batch([0.0, 1.0, 0.0], [6, 6, 6])
    batch.distill = Distill(teacher_logprobs=torch.zeros_like(batch.advantages))
    batch.aux_terms = [AuxTerm(name="sdar", kind="sampled_surrogate", coef=0.1)]
    assert drop_silent_rows(batch) is batch


def test_every_rank_keeps_a_row_and_only_the_first_shard_carries_the_extra_tokens():
    batch = _batch([0.0, 0.0, 0.0, 0.0], [6, 7, 8, 9])
    kept = drop_silent_rows(batch, min_rows=2)
    assert kept.versions == [0, 1]
    shards = split_rows(kept, 2)
    assert [s.extra_loss_tokens for s in shards] == [kept.extra_loss_tokens, 0.0]
    assert kept.extra_loss_tokens == float(batch.response_mask[2:].sum())
