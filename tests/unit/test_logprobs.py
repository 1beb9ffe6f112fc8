"""forward_response against a slow full-logits reference on tiny random Llama / Qwen2 models."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pipeline.algorithm.logprobs import forward_response, position_ids_from_mask

VOCAB = 128


def _tiny(arch: str, seed: int = 0) -> torch.nn.Module:
    dims = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2,  # peaked distributions, so misaligned positions would show
    )  # fmt: skip
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**dims, tie_word_embeddings=True))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**dims, tie_word_embeddings=False))
    return model.eval()


def _batch(seed: int, padding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random rows of prompt + response with different lengths, padded on ``padding``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(4):
        n_prompt = int(torch.randint(1, 9, (1,), generator=g))
        n_resp = int(torch.randint(1, 7, (1,), generator=g))
        rows.append((torch.randint(0, VOCAB, (n_prompt + n_resp,), generator=g), n_prompt))
    width = max(len(ids) for ids, _ in rows) + 1
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros_like(input_ids)
    for b, (ids, n_prompt) in enumerate(rows):
        start = 0 if padding == "right" else width - len(ids)
        input_ids[b, start : start + len(ids)] = ids
        attention_mask[b, start : start + len(ids)] = 1
        response_mask[b, start + n_prompt : start + len(ids)] = 1
    return input_ids, attention_mask, response_mask


def _naive(model, input_ids, attention_mask, response_mask, temperature):
    """Full [B, T, V] logits, then a Python loop over response positions."""
    logits = (
        model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
        ).logits.float()
        / temperature
    )
    logp_full = torch.log_softmax(logits, dim=-1)
    logprobs = torch.zeros(input_ids.shape)
    entropy = torch.zeros(input_ids.shape)
    selected = []
    for b in range(input_ids.shape[0]):
        for t in range(input_ids.shape[1]):
            if response_mask[b, t]:
                dist = logp_full[b, t - 1]
                logprobs[b, t] = dist[input_ids[b, t]]
                entropy[b, t] = -(dist.exp() * dist).sum()
                selected.append(logits[b, t - 1])
    return logprobs, entropy, torch.stack(selected)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_response_matches_full_logits_reference(arch, padding, temperature):
    model = _tiny(arch)
    for seed in range(3):
        batch = _batch(seed, padding)
        with torch.no_grad():
            out = forward_response(model, *batch, temperature=temperature, with_logits=True)
            ref_lp, ref_ent, ref_logits = _naive(model, *batch, temperature)
        torch.testing.assert_close(out.logprobs, ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.logits, ref_logits, atol=1e-5, rtol=0)
        assert out.logits.shape == (int(batch[2].sum()), VOCAB)


def test_left_and_right_padding_give_the_same_logprobs():
    model = _tiny("llama")
    left, right = _batch(7, "left"), _batch(7, "right")
    with torch.no_grad():
        lp_left = forward_response(model, *left).logprobs
        lp_right = forward_response(model, *right).logprobs
    torch.testing.assert_close(lp_left[left[2].bool()], lp_right[right[2].bool()], atol=1e-5, rtol=0)


def test_values_are_zero_outside_the_response():
    model = _tiny("llama")
    input_ids, attention_mask, response_mask = _batch(1, "right")
    with torch.no_grad():
        out = forward_response(model, input_ids, attention_mask, response_mask)
    outside = ~response_mask.bool()
    assert (out.logprobs[outside] == 0).all() and (out.entropy[outside] == 0).all()
    assert (out.logprobs[~outside] < 0).all() and (out.entropy[~outside] > 0).all()


def test_entropy_equals_the_direct_formula_on_the_returned_logits():
    model = _tiny("qwen2")
    batch = _batch(3, "left")
    with torch.no_grad():
        out = forward_response(model, *batch, temperature=0.7, with_logits=True)
    p = torch.softmax(out.logits.double(), dim=-1)
    direct = -(p * p.log()).sum(-1)
    torch.testing.assert_close(out.entropy[batch[2].bool()].double(), direct, atol=1e-5, rtol=0)


def test_lm_head_sees_only_the_positions_that_predict_response_tokens():
    model = _tiny("llama")
    batch = _batch(2, "right")
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    try:
        with torch.no_grad():
            forward_response(model, *batch)
    finally:
        hook.remove()
    assert seen == [(int(batch[2].sum()), model.config.hidden_size)]


def test_gradient_matches_the_reference_gradient():
    model = _tiny("llama")
    batch = _batch(4, "left")
    weights = torch.randn(batch[0].shape)  # a stand-in for advantages

    out = forward_response(model, *batch, temperature=0.7)
    (-(out.logprobs * weights).sum() - 0.1 * out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_lp, ref_ent, _ = _naive(model, *batch, 0.7)
    (-(ref_lp * weights).sum() - 0.1 * ref_ent.sum()).backward()

    assert grads["model.embed_tokens.weight"].abs().sum() > 0
    assert grads["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)


class _EngineLike(torch.nn.Module):
    """Stands in for a DeepSpeed engine: the HF model as ``.module``, its own ``config``, and
    unknown attributes forwarded to the model."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.config = {"train_batch_size": 1}

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)


def test_wrapped_models_are_unwrapped_to_the_hf_model():
    model = _tiny("llama")
    batch = _batch(6, "left")
    with torch.no_grad():
        direct = forward_response(model, *batch).logprobs
        wrapped = forward_response(_EngineLike(model), *batch).logprobs
    torch.testing.assert_close(wrapped, direct, atol=0, rtol=0)


def test_no_grad_mode_builds_no_graph():
    model = _tiny("llama")
    with torch.no_grad():
        out = forward_response(model, *_batch(0, "right"))
    assert not out.logprobs.requires_grad and out.logits is None


def test_bf16_model_returns_float32_close_to_fp32():
    model = _tiny("llama")
    batch = _batch(5, "right")
    with torch.no_grad():
        fp32 = forward_response(model, *batch).logprobs
        bf16 = forward_response(model.to(torch.bfloat16), *batch).logprobs
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0)


def test_a_response_token_at_position_zero_is_rejected():
    model = _tiny("llama")
    input_ids, attention_mask, response_mask = _batch(0, "right")
    response_mask[:, 0] = 1
    with pytest.raises(ValueError, match="first token"):
        forward_response(model, input_ids, attention_mask, response_mask)


def test_nonpositive_temperature_is_rejected():
    with pytest.raises(ValueError, match="temperature"):
        forward_response(_tiny("llama"), *_batch(0, "right"), temperature=0.0)


@pytest.mark.parametrize("shared", [False, True])
def test_the_head_in_chunks_gives_the_same_numbers_and_gradients(tiny_bytes_model_dir, shared):
    """``head_chunk`` runs the LM head, its float32 log-softmax and entropy over at most that many
    response tokens at a time, each chunk recomputed in backward: only one chunk's [tokens, vocab]
    tensors exist at once. The same log-probs, entropies and gradients as the whole head (fp32);
    logits asked for (a full-KL term) come whole."""
    from pipeline.algorithm.shared_prefix import forward_shared
    from pipeline.models import load_model

    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 250, (3, 40), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 30:] = 0
    resp = torch.zeros(3, 40)
    resp[0, 12:40], resp[1, 5:30], resp[2, 20:40] = 1.0, 1.0, 1.0
    forward = forward_shared if shared else forward_response

    def run(**kw):
        model.zero_grad()
        out = forward(model, ids, attn, resp, temperature=0.7, **kw)
        (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
        return out, [p.grad.clone() for p in model.parameters()]

    whole, want = run()
    calls = []
    handle = model.lm_head.register_forward_hook(lambda _m, inp, _o: calls.append(inp[0].shape[0]))
    chunked, got = run(head_chunk=16)
    handle.remove()
    assert max(calls) <= 16 and sum(calls) >= 2 * 73  # 73 tokens in chunks, forward and recomputation
    assert torch.allclose(chunked.logprobs, whole.logprobs, atol=1e-6)
    assert torch.allclose(chunked.entropy, whole.entropy, atol=1e-6)
    scale = max(x.abs().max().item() for x in want)
    assert scale > 1e-3 and max((a - b).abs().max().item() for a, b in zip(got, want)) < 1e-5 * max(scale, 1.0)
    with torch.no_grad():
        logits = forward(model, ids, attn, resp, head_chunk=16, with_logits=True).logits
    assert logits.shape == (73, model.config.vocab_size)
