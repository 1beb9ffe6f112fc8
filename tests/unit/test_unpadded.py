"""``learner.unpadded``: one row per micro-batch, cut to its length, and rows that share a prefix
forwarded once for it (``learner.shared_tokens``, ``pipeline/algorithm/shared_prefix.py``), give
the loss and the gradients of right-padded token-budget micro-batches, on real episodes (the
scripted experts' turns of Search-QA and ALFWorld through the real prompt builder, each task
played by a group of three whose replies differ), fp32, to 1e-5."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch

from pipeline.algorithm.logprobs import forward_response, score_responses
from pipeline.algorithm.objective import denominators, micro_batch_objective
from pipeline.algorithm.shared_prefix import forward_shared, unique_tokens
from pipeline.context.student_prompts import StudentPrompts
from pipeline.core.microbatch import prefix_runs, slice_rows, sort_by_length, sort_by_tokens, split_by_tokens
from pipeline.core.schema import LearnerConfig
from pipeline.core.types import AuxTerm, Credit, Distill
from pipeline.models import load_model, load_tokenizer
from pipeline.orchestration.batches import build_train_batch
from pipeline.orchestration.warm_start import expert_rows
from pipeline.tools.cli import compose


def _objective_and_gradients(model, batch, micro_batches, forward=forward_response):
    model.zero_grad()
    den = denominators(batch, lambda x: x, 1)
    total = 0.0
    for mb in micro_batches:
        loss, _ = micro_batch_objective(model, mb, den, LearnerConfig(), temperature=1.0, forward=forward)
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("env", ["search_qa", "alfworld"])
def test_one_row_micro_batches_give_the_padded_micro_batches_loss_and_gradients(tiny_model_dir, env):
    # ALFWorld as its warm start clones it: episodes long enough for its expert to win
    cfg = compose(["model=tiny", f"env={env}", *(["+experiment=alfworld_warm_start"] if env == "alfworld" else [])])
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = StudentPrompts(
        tok, max_prompt_tokens=cfg.rollout.max_prompt_tokens, history_length=cfg.env.history_length
    )
    played = expert_rows(cfg.env, prompts, tasks=3).rows[:6]
    assert len(played) >= 3 and len({len(r.prompt_ids) + r.n_response for r in played}) > 1  # real, unequal rows
    # a group: each row's prompt three times, the reply as played and with two tokens changed
    rows = []
    for r in played:
        for k in range(3):
            reply = list(r.response_ids)
            if k:
                reply[-1], reply[0] = (reply[-1] + 7 * k) % 1000, (reply[0] + k) % 1000
            rows.append(dataclasses.replace(r, response_ids=reply, behaviour_logprobs=[0.0] * len(reply)))
    model = load_model(str(tiny_model_dir), torch.float32, "cpu")
    # the behaviour = the model itself (ratios 1: no token clipped, every gradient alive), a
    # teacher off by a row-dependent shift, advantages of both signs
    lps = score_responses(model, [(r.prompt_ids, r.response_ids) for r in rows], temperature=1.0)
    for r, lp in zip(rows, lps):
        r.behaviour_logprobs = lp
    credit = Credit(
        advantages=[[(-1.0) ** i * (0.5 + 0.1 * i)] * r.n_response for i, r in enumerate(rows)],
        distill=Distill(teacher_logprobs=[[x - 0.05 * i for x in lp] for i, lp in enumerate(lps)]),
        aux_terms=[AuxTerm(name="sd", kind="k3_is", coef=0.1)],
    )
    batch = build_train_batch(rows, credit, pad_id=tok.pad_token_id, default_entropy_coef=0.01)
    padded = [*split_by_tokens(sort_by_length(batch), 2048)]
    assert any((mb.attention_mask == 0).any() for mb in padded)  # the padded cut does pad
    want, want_grads = _objective_and_gradients(model, batch, padded)
    one_row = [slice_rows(batch, i, i + 1) for i in range(batch.n_rows)]
    by_tokens = sort_by_tokens(batch)
    runs = prefix_runs(by_tokens, 1024)
    shared = [slice_rows(by_tokens, a, b) for a, b in runs]
    assert any(b - a > 1 for a, b in runs)  # some rows do share a micro-batch
    seqs = [r.prompt_ids + r.response_ids for r in rows]
    assert unique_tokens(seqs) < 0.6 * sum(map(len, seqs))  # and carry far fewer tokens
    scale = max(w.abs().max().item() for w in want_grads)
    assert scale > 1e-3
    routes = {"one_row": (one_row, forward_response), "shared": (shared, forward_shared)}
    if env == "search_qa":  # and with each layer recomputed in backward (learner.gradient_checkpointing)
        checkpointed = partial(forward_shared, checkpoint=True)
        routes |= {"one_row_checkpointed": (one_row, checkpointed), "shared_checkpointed": (shared, checkpointed)}
    for name, (cut, forward) in routes.items():
        got, got_grads = _objective_and_gradients(model, batch, cut, forward)
        assert got == pytest.approx(want, abs=1e-5), name
        assert len(got_grads) == len(want_grads)
        worst = max((g - w).abs().max().item() for g, w in zip(got_grads, want_grads))
        assert worst < 1e-5, (name, worst, scale)
