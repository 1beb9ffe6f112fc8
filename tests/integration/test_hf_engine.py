"""HFEngine on the tiny model: determinism, EOS handling, weight swaps, and log-prob parity with
the learner's ``forward_response`` (the behaviour log-probs must be what the learner would compute).

Parity tolerance: 1e-4 absolute in fp32 (measured about 1e-6: the KV-cached decode and the full
forward differ only in summation order). bf16 is checked loosely (0.15), since there the two
paths round differently.
"""

from __future__ import annotations

import pytest
import torch

from actors.engines.base import FinishReason, Generation
from actors.engines.hf import HFEngine
from pipeline.algorithm.logprobs import response_logprobs

pytestmark = pytest.mark.integration

PARITY_ATOL_FP32 = 1e-4


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> HFEngine:
    return HFEngine.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def chat_prompts(engine) -> list[list[int]]:
    """Chat-templated prompts of different lengths (so the batch is really left-padded)."""
    tok = engine.tokenizer
    questions = ["hi", "What is the capital of France?", "Put a clean mug on the table, then look around the room."]
    out = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if not isinstance(ids, list) else ids))
    assert len({len(p) for p in out}) == len(out)
    return out


def _score(model, prompts, generations, temperature):
    """The learner's log-probs of each response (forward_response on right-padded rows)."""
    return response_logprobs(model, prompts, [g.token_ids for g in generations], temperature=temperature)


def _max_gap(engine, prompts, generations, temperature) -> float:
    scored = _score(engine.model, prompts, generations, temperature)
    return max((ref - torch.tensor(g.logprobs)).abs().max().item() for ref, g in zip(scored, generations))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_forward_response(engine, chat_prompts, temperature):
    gens = engine.generate(chat_prompts, max_new_tokens=12, temperature=temperature, seed=11)
    assert all(len(g.logprobs) == len(g.token_ids) > 0 for g in gens)
    assert _max_gap(engine, chat_prompts, gens, temperature) < PARITY_ATOL_FP32


def test_greedy_logprobs_are_the_raw_distribution(engine, chat_prompts):
    gens = engine.generate(chat_prompts, max_new_tokens=8, temperature=0.0)
    assert _max_gap(engine, chat_prompts, gens, 1.0) < PARITY_ATOL_FP32
    again = engine.generate(chat_prompts, max_new_tokens=8, temperature=0.0, seed=123)
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]


def test_generation_is_deterministic_by_seed_and_leaves_global_rng_alone(engine, chat_prompts):
    state = torch.get_rng_state()
    a = engine.generate(chat_prompts, max_new_tokens=10, temperature=1.0, seed=5)
    b = engine.generate(chat_prompts, max_new_tokens=10, temperature=1.0, seed=5)
    c = engine.generate(chat_prompts, max_new_tokens=10, temperature=1.0, seed=6)
    assert torch.equal(torch.get_rng_state(), state)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_top_p_reports_the_renormalised_nucleus_distribution(engine, chat_prompts):
    gens = engine.generate(chat_prompts, max_new_tokens=10, temperature=1.0, top_p=0.5, seed=2)
    full = _score(engine.model, chat_prompts, gens, 1.0)
    for ref, g in zip(full, gens):
        nucleus = torch.tensor(g.logprobs)
        # Renormalising over the nucleus raises every kept token's log-prob by -log(mass) >= log 2.
        assert (nucleus - ref >= torch.log(torch.tensor(2.0)) - 1e-4).all()
        assert (nucleus <= 0).all()


def _swap_embedding_rows(state_dict, i, j):
    table = state_dict["model.embed_tokens.weight"].clone()
    table[[i, j]] = table[[j, i]]
    swapped = {**state_dict, "model.embed_tokens.weight": table}
    swapped.pop("lm_head.weight", None)  # its tied alias: send the weight under one name only
    return swapped


def _context(prompts, generations) -> set[int]:
    return {t for p, g in zip(prompts, generations) for t in p + g.token_ids}


def test_response_stops_at_eos_and_drops_what_follows(engine):
    """Swapping the (tied) embedding rows of EOS and a token that greedy decoding first emits at
    step k >= 1 makes the model say EOS there instead; rows that never touch that token are
    unchanged and run to max_new_tokens."""
    eos = engine.tokenizer.eos_token_id
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in (5, 9, 4, 7, 6, 8)]
    before = engine.generate(prompts, max_new_tokens=8, temperature=0.0)
    row, k = next(
        (b, k)
        for b, gen in enumerate(before)
        for k in range(1, len(gen.token_ids))
        if gen.token_ids[k] not in prompts[b] + gen.token_ids[:k]
    )
    target = before[row].token_ids[k]
    untouched = [b for b in range(len(prompts)) if target not in prompts[b] + before[b].token_ids]
    assert eos not in _context(prompts, before) and untouched

    original = {key: v.clone() for key, v in engine.model.state_dict().items()}
    try:
        engine.load_state_dict(_swap_embedding_rows(original, eos, target), version=1)
        after = engine.generate(prompts, max_new_tokens=8, temperature=0.0)
    finally:
        engine.load_state_dict(original, version=0)
    assert after[row].token_ids == before[row].token_ids[:k] + [eos]
    assert after[row].finish_reason == FinishReason.STOP == "stop"
    assert len(after[row].logprobs) == k + 1
    for b in untouched:
        assert after[b].token_ids == before[b].token_ids and after[b].finish_reason == "length"
        assert len(after[b].token_ids) == 8


def test_load_state_dict_swaps_weights_in_place_and_sets_the_version(engine, chat_prompts):
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    storage = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    before = engine.generate(chat_prompts, max_new_tokens=6, temperature=1.0, seed=3)
    g = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    perturbed.pop("lm_head.weight", None)  # tied to the embeddings: sending one name is enough
    try:
        engine.load_state_dict(perturbed, version=7)
        assert engine.version == 7
        assert {n: p.data_ptr() for n, p in engine.model.named_parameters()} == storage
        changed = engine.generate(chat_prompts, max_new_tokens=6, temperature=1.0, seed=3)
        assert [g.logprobs for g in changed] != [g.logprobs for g in before]
    finally:
        engine.load_state_dict(original, version=8)
    restored = engine.generate(chat_prompts, max_new_tokens=6, temperature=1.0, seed=3)
    assert [g.token_ids for g in restored] == [g.token_ids for g in before]
    assert engine.version == 8


def test_load_state_dict_rejects_unknown_and_missing_keys(engine):
    state = engine.model.state_dict()
    with pytest.raises(KeyError, match="not in the model"):
        engine.load_state_dict({**state, "extra.weight": torch.zeros(1)}, version=1)
    partial = {k: v for k, v in state.items() if "layers.1." not in k}
    with pytest.raises(KeyError, match="not given"):
        engine.load_state_dict(partial, version=1)
    assert engine.version != 1


def test_prompts_beyond_the_model_limit_raise_instead_of_truncating(tiny_model_dir, engine):
    too_long = [[5] * (engine.model.config.max_position_embeddings - 4)]
    with pytest.raises(ValueError, match="exceeds the model's 2048 positions"):
        engine.generate(too_long, max_new_tokens=8, temperature=1.0)
    capped = HFEngine(engine.model, engine.tokenizer, max_prompt_len=4)
    with pytest.raises(ValueError, match="more than max_prompt_len=4"):
        capped.generate([[5, 6], [5] * 5], max_new_tokens=2, temperature=0.0)


def test_empty_prompt_list_gives_no_generations(engine):
    assert engine.generate([], max_new_tokens=4, temperature=1.0) == []


def test_bf16_engine_samples_and_roughly_matches_its_own_forward(tiny_model_dir, chat_prompts):
    engine = HFEngine.from_pretrained(tiny_model_dir, dtype="bf16")
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    gens = engine.generate(chat_prompts, max_new_tokens=8, temperature=1.0, seed=0)
    assert all(isinstance(g, Generation) and len(g.token_ids) == 8 for g in gens)
    assert _max_gap(engine, chat_prompts, gens, 1.0) < 0.15


@pytest.mark.slow
def test_smollm2_engine_logprobs_match_forward_response(smollm2_model_dir):
    engine = HFEngine.from_pretrained(smollm2_model_dir, dtype="fp32")
    tok = engine.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in ("What is the capital of France?", "Say hello.")
    ]
    prompts = [list(p["input_ids"] if not isinstance(p, list) else p) for p in prompts]
    gens = engine.generate(prompts, max_new_tokens=12, temperature=0.7, seed=0)
    assert _max_gap(engine, prompts, gens, 0.7) < PARITY_ATOL_FP32
    greedy = engine.generate(prompts[:1], max_new_tokens=8, temperature=0.0)
    assert "Paris" in tok.decode(greedy[0].token_ids)


def test_a_requests_sample_does_not_depend_on_the_other_requests_of_its_batch(engine, chat_prompts):
    alone = engine.generate(chat_prompts[:1], max_new_tokens=12, temperature=1.0, seeds=[41])
    batched = engine.generate(
        [*chat_prompts, chat_prompts[0]],
        max_new_tokens=12,
        temperature=1.0,
        seeds=[41, *range(100, 100 + len(chat_prompts))],
    )
    assert batched[0].token_ids == alone[0].token_ids
    second = engine.generate(chat_prompts[1:2], max_new_tokens=12, temperature=1.0, seeds=[101])
    assert batched[2].token_ids == second[0].token_ids  # the same prompt and seed, another batch
    with pytest.raises(ValueError, match="seeds for"):
        engine.generate(chat_prompts, max_new_tokens=2, temperature=1.0, seeds=[1])
