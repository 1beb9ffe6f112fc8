"""``layer_checkpoint``: the shared-prefix forward with each decoder layer recomputed in backward
(``learner.gradient_checkpointing`` with ``learner.shared_tokens``) really recomputes, and gives
the plain forward's log-probs and gradients (fp32, a random 2-layer Llama; real Search-QA rows in
tests/unit/test_unpadded.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pipeline.algorithm.layer_checkpoint import check_supported
from pipeline.algorithm.logprobs import decoder_and_head
from pipeline.algorithm.shared_prefix import forward_shared
from pipeline.models import load_model


def _rows():
    """Three right-padded rows: two share 9 tokens, each with a response of its own."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 250, (9,), generator=g).tolist()
    seqs = [
        prefix + torch.randint(3, 250, (6,), generator=g).tolist(),
        prefix + torch.randint(3, 250, (4,), generator=g).tolist(),
        torch.randint(3, 250, (12,), generator=g).tolist(),
    ]
    width = max(map(len, seqs))
    ids = torch.zeros(3, width, dtype=torch.long)
    attn, resp = torch.zeros_like(ids), torch.zeros(3, width)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], attn[i, : len(s)] = torch.tensor(s), 1
        resp[i, len(s) - 3 : len(s)] = 1
    return ids, attn, resp


def _run(model, checkpoint: bool, calls: Counter):
    model.zero_grad()
    calls.clear()
    out = forward_shared(model, *_rows(), checkpoint=checkpoint)
    forwards = dict(calls)
    (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
    return out, forwards, dict(calls), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_each_layer_is_run_again_in_backward_with_the_plain_forwards_numbers(tiny_bytes_model_dir):
    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    decoder, _ = decoder_and_head(model)
    calls: Counter = Counter()
    for i, layer in enumerate(decoder.layers):
        layer.register_forward_pre_hook(lambda *_, i=i: calls.update([i]))  # recompute stops early: no post-hook
    plain, plain_fw, plain_all, plain_grads = _run(model, False, calls)
    ckpt, ckpt_fw, ckpt_all, ckpt_grads = _run(model, True, calls)
    # the tree's 4 runs: the 9 shared tokens, the rest of rows 0 and 1, row 2 whole
    assert plain_fw == plain_all == ckpt_fw == {0: 4, 1: 4}
    assert ckpt_all == {0: 8, 1: 8}  # every run of every layer recomputed once in backward
    assert torch.allclose(ckpt.logprobs, plain.logprobs, atol=1e-6)
    assert torch.allclose(ckpt.entropy, plain.entropy, atol=1e-6)
    assert len(ckpt_grads) == len(plain_grads) and max(p.abs().max() for p in plain_grads) > 1e-3
    assert max((a - b).abs().max().item() for a, b in zip(ckpt_grads, plain_grads)) < 1e-6
    with torch.no_grad():  # the learner's reads: nothing to recompute, each layer once per run
        calls.clear()
        read = forward_shared(model, *_rows(), checkpoint=True)
    assert dict(calls) == {0: 4, 1: 4} and torch.allclose(read.logprobs, plain.logprobs, atol=1e-6)


def test_one_row_is_one_run_of_the_whole_row(tiny_bytes_model_dir):
    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    ids, attn, resp = (x[2:] for x in _rows())
    calls: Counter = Counter()
    decoder_and_head(model)[0].layers[0].register_forward_pre_hook(lambda *_: calls.update([0]))
    out = forward_shared(model, ids, attn, resp, checkpoint=True)
    assert calls[0] == 1
    want = forward_shared(model, ids, attn, resp)
    assert torch.allclose(out.logprobs, want.logprobs, atol=1e-6)


def test_a_decoder_it_was_not_written_for_is_refused_naming_the_way_out(tiny_bytes_model_dir):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_bytes_model_dir, attn_implementation="eager")
    with pytest.raises(NotImplementedError, match="learner.shared_tokens=0"):
        check_supported(decoder_and_head(eager)[0])
    with pytest.raises(NotImplementedError, match="LlamaModel"):
        check_supported(torch.nn.Linear(2, 2))


def test_a_run_keeps_its_own_keys_and_values_and_reads_its_parents_without_copying_them(tiny_bytes_model_dir):
    """What a tree forward holds until backward is each edge's keys and values once: a child run
    gets its path's tensors themselves and returns them beside its own, not one copy of the path
    per edge (which held a prefix's keys and values again at every edge below it)."""
    from pipeline.algorithm.layer_checkpoint import decoder_forward

    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    decoder, _ = decoder_and_head(model)
    g = torch.Generator().manual_seed(1)
    first, second, third = (torch.randint(3, 250, (1, n), generator=g) for n in (9, 5, 4))
    pos = lambda start, ids: torch.arange(start, start + ids.shape[1]).unsqueeze(0)  # noqa: E731
    _, a = decoder_forward(decoder, first, pos(0, first), None)
    _, b = decoder_forward(decoder, second, pos(9, second), a)
    hidden, c = decoder_forward(decoder, third, pos(14, third), b)
    for la, lb, lc in zip(a, b, c):
        assert len(la) == 1 and len(lb) == 2 and len(lc) == 3
        assert lb[0] is la[0] and lc[0] is la[0] and lc[1] is lb[1]  # the same tensors: no copy
        assert [k.shape[-2] for k, _ in lc] == [9, 5, 4] and [v.shape[-2] for _, v in lc] == [9, 5, 4]
    # the same hidden states as the whole sequence in one run
    whole = torch.cat([first, second, third], 1)
    want, _ = decoder_forward(decoder, whole, pos(0, whole), None)
    assert torch.allclose(hidden, want[:, 14:], atol=1e-5)
