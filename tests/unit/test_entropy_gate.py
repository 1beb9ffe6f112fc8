"""``signal: entropy_gate`` (pipeline/methods/parts/entropy_gate.py): the teacher's entropy is a
channel the scorer's forward computes (the same quantity as the learner's entropy at those
positions), and the signal weighs the estimator's tokens by sigmoid(-sharpness (H - h0))."""

from __future__ import annotations

import math

import pytest
import torch
from method_groups import build, scored_groups
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.algorithm.logprobs import forward_response, score_responses, score_teacher
from pipeline.core.types import TeacherNeeds
from pipeline.methods.parts.entropy_gate import ENTROPY
from pipeline.orchestration.batches import rows_of


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def test_the_entropy_channel_is_the_teachers_entropy_at_each_response_position():
    model = _model()
    items = [([1, 2, 3, 4], [5, 6, 7]), ([8, 9], [10, 11, 12, 13, 14])]
    out = score_teacher(model, items, [], TeacherNeeds(channels=(ENTROPY,)), temperature=0.7, micro_batch_tokens=8)
    for got, want in zip(out.logprobs, score_responses(model, items, temperature=0.7), strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    for (p, r), h in zip(items, out.channels["entropy"]):
        x = torch.tensor([p + r])
        mask = torch.zeros_like(x, dtype=torch.float32)
        mask[0, len(p) :] = 1
        with torch.no_grad():
            want = forward_response(model, x, torch.ones_like(x), mask, temperature=0.7).entropy[0, len(p) :]
        assert h == pytest.approx(want.tolist(), abs=1e-5)
        assert all(0.0 < v <= math.log(64) for v in h)


def test_the_gate_weighs_each_token_by_the_teachers_entropy_and_the_term_is_the_estimators():
    groups = scored_groups()
    rows = rows_of(groups)
    for i, r in enumerate(rows):
        r.teacher_channels = {"entropy": [0.5 * (i + j) for j in range(r.n_response)]}
    method = build("entropy_gated_hints", lam=0.3, h0=1.0, sharpness=2.0, estimator="sampled_surrogate")
    credit = method.credit(groups, 0)
    [term] = credit.aux_terms
    assert (term.kind, term.coef, term.gate_beta) == ("sampled_surrogate", pytest.approx(0.3), None)
    want = [[1 / (1 + math.exp(2.0 * (h - 1.0))) for h in r.teacher_channels["entropy"]] for r in rows]
    assert credit.distill.distill_mask == [pytest.approx(w) for w in want]
    assert credit.distill.teacher_logprobs == [r.teacher_logprobs for r in rows]
    assert credit.metrics["eg/entropy_gate_mean"] == pytest.approx(sum(map(sum, want)) / sum(map(len, want)))


def test_without_sharpness_every_token_weighs_one_half():
    groups = scored_groups()
    for r in rows_of(groups):
        r.teacher_channels = {"entropy": [9.0] * r.n_response}
    credit = build("entropy_gated_hints", sharpness=0.0).credit(groups, 0)
    assert {w for row in credit.distill.distill_mask for w in row} == {0.5}


def test_a_row_scored_without_the_channel_is_refused_and_a_sampled_estimator_is_required():
    with pytest.raises(ValueError, match="without the teacher's 'entropy'"):
        build("entropy_gated_hints").credit(scored_groups(), 0)
    with pytest.raises(ValueError, match="method.estimator='full_kl'"):
        build("entropy_gated_hints", estimator="full_kl")
