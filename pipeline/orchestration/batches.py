"""From scored groups and a method's credit assignment to the learner's padded TrainBatch.

Rows are the turn records of the groups in order (group, episode, turn). Each row is
``prompt_ids + response_ids``, right-padded; per-token values sit at the positions of the response
tokens they describe (see ``TrainBatch``).
"""

from __future__ import annotations

import torch

from pipeline.core.microbatch import take_rows
from pipeline.core.types import Credit, Distill, EpisodeGroup, TrainBatch, TurnRecord, distill_dtype


def rows_of(groups: list[EpisodeGroup]) -> list[TurnRecord]:
    """The learner's rows, group by group (each group's demonstrations after its own rows)."""
    return [t for g in groups for t in g.train_rows()]


def unique_tokens(rows: list[TurnRecord]) -> int:
    """Tokens of the rows once every shared prefix is counted once (the nodes of their prefix
    trie): what a learner that forwards each distinct token once would carry, against the
    ``learner/forwarded_tokens`` it does carry. Rows that re-render an episode's history share
    little beyond their first tokens; rows of one task's first turn share their whole prompt."""
    root: dict = {}
    count = 0
    for r in rows:
        node = root
        for t in (*r.prompt_ids, *r.response_ids):
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                count += 1
            node = nxt
    return count


def _pad(seqs: list[list], value, dtype) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=dtype)
    return out


def _place(rows_prompt_len: list[int], values: list[list], width: int, dtype=torch.float32) -> torch.Tensor:
    """Per-response-token values -> [B, width] at the response positions; per-token vectors of k
    values (the student's support, estimator topk_rkl) -> [B, width, k]."""
    k = next((len(v[0]) for v in values if v and isinstance(v[0], (list, tuple))), None)
    out = torch.zeros((len(values), width) if k is None else (len(values), width, k), dtype=dtype)
    for i, (p, v) in enumerate(zip(rows_prompt_len, values)):
        if v:
            out[i, p : p + len(v)] = torch.tensor(v, dtype=dtype)
    return out


def build_train_batch(
    rows: list[TurnRecord], credit: Credit, *, pad_id: int, default_entropy_coef: float
) -> TrainBatch:
    if len(rows) != len(credit.advantages):
        raise ValueError(f"credit has {len(credit.advantages)} rows for {len(rows)} turn records")
    for i, (r, a) in enumerate(zip(rows, credit.advantages)):
        if len(a) != r.n_response:
            raise ValueError(f"row {i}: {len(a)} advantages for {r.n_response} response tokens")
    seqs = [r.prompt_ids + r.response_ids for r in rows]
    input_ids = _pad(seqs, pad_id, torch.long)
    width = input_ids.shape[1]
    attention = _pad([[1] * len(s) for s in seqs], 0, torch.long)
    plen = [len(r.prompt_ids) for r in rows]
    response_mask = _place(plen, [[1.0] * r.n_response for r in rows], width)
    batch = TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response_mask,
        behaviour_logprobs=_place(plen, [r.behaviour_logprobs for r in rows], width),
        advantages=_place(plen, credit.advantages, width),
        distill=Distill(
            **{k: _place(plen, v, width, getattr(torch, distill_dtype(k))) for k, v in credit.distill.present().items()}
        ),
        aux_terms=list(credit.aux_terms),
        policy_loss_coef=credit.policy_loss_coef,
        entropy_coef=default_entropy_coef if credit.entropy_coef is None else credit.entropy_coef,
        versions=[r.policy_version for r in rows],
    )
    if credit.teacher_prompt_ids is not None:
        tseqs = [p + r.response_ids for p, r in zip(credit.teacher_prompt_ids, rows)]
        batch.teacher_input_ids = _pad(tseqs, pad_id, torch.long)
        batch.teacher_attention_mask = _pad([[1] * len(s) for s in tseqs], 0, torch.long)
        tplen = [len(p) for p in credit.teacher_prompt_ids]
        batch.teacher_response_mask = _place(
            tplen, [[1.0] * r.n_response for r in rows], batch.teacher_input_ids.shape[1]
        )
    return batch


def minibatch_bounds(groups: list[EpisodeGroup], n: int) -> list[tuple[int, int]]:
    """Row ranges of ``n`` mini-batches made of whole groups, so that a group's rows (the unit of
    its advantage statistics) never straddle two optimizer steps."""
    sizes = [len(g.train_rows()) for g in groups]
    cuts = [round(i * len(groups) / n) for i in range(n + 1)]
    starts = [sum(sizes[:c]) for c in cuts]
    return [(starts[i], starts[i + 1]) for i in range(n) if starts[i + 1] > starts[i]]


def drop_silent_rows(batch: TrainBatch, *, min_rows: int = 1) -> TrainBatch:
    """The batch without the rows whose every advantage is 0, when nothing else acts on them.

    Under PPO's clipped surrogate (dual clip included) a row with advantage 0 has loss 0 and
    gradient 0, so leaving it out changes no gradient as long as token_mean's denominator still
    counts its tokens (``extra_loss_tokens``) and no other term reads it. Aux terms (a teacher's
    distillation, NLL) and teacher forwards do, so such batches are returned whole. The entropy
    bonus then covers the kept rows only. GRPO groups whose episodes all fail (or all win) are
    such rows: on ALFWorld they are most of a step's learner time. ``min_rows`` rows (the first
    ones) are always kept, so that every learner rank gets a row and the step still runs.
    """
    if batch.aux_terms or batch.teacher_input_ids is not None:
        return batch
    keep = (batch.advantages != 0).any(dim=1)
    keep[: min(min_rows, batch.n_rows)] = True
    if bool(keep.all()):
        return batch
    dropped = float(batch.response_mask[~keep].sum())
    kept = take_rows(batch, keep.nonzero().squeeze(1).tolist())
    kept.extra_loss_tokens = batch.extra_loss_tokens + dropped
    return kept
