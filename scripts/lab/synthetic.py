"""Synthetic training batches for the learner's probes (docs/results/layer_checkpoint_probe,
docs/results/learner_rss_growth): random ids in the shapes of make train's Search-QA steps."""

from __future__ import annotations

import random

import torch

from pipeline.core.types import TrainBatch


def search_qa_batch(rng: random.Random) -> TrainBatch:
    """4 groups x 4 rows: a 250-token prefix per group, 50-1100 tokens more per row, then 30-90
    response tokens; advantages +-1 per row, behaviour log-probs -2."""
    rows = []
    for _group in range(4):
        prefix = [rng.randint(10, 49000) for _ in range(250)]
        for _episode in range(4):
            rows.append((prefix + [rng.randint(10, 49000) for _ in range(rng.randint(50, 1100))], rng.randint(30, 90)))
    T = max(len(p) + r for p, r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(len(rows), T)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + r] = torch.tensor(p + [rng.randint(10, 49000) for _ in range(r)])
        attn[i, : len(p) + r] = 1
        resp[i, len(p) : len(p) + r] = 1
    adv = torch.tensor([rng.choice([-1.0, 1.0]) for _ in rows])[:, None].expand(len(rows), T) * resp
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=torch.full((len(rows), T), -2.0) * resp,
        advantages=adv.contiguous(),
        entropy_coef=0.0,
        versions=[0] * len(rows),
    )
