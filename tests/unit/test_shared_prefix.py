"""``forward_shared`` forwards each distinct token once: a reply two rows sampled alike, and a row
that a later turn's row continues (``env.prompt_format=chat``), are read from the edges that hold
them; log-probs, entropies and gradients equal each row forwarded alone (fp32, a random 2-layer
Llama), plain and checkpointed. Real Search-QA and ALFWorld rows: tests/unit/test_unpadded.py."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pipeline.algorithm.logprobs import decoder_and_head, forward_response
from pipeline.algorithm.shared_prefix import carried_tokens, forward_shared, unique_tokens
from pipeline.core.types import TurnRecord
from pipeline.models import load_model
from pipeline.orchestration.batches import unique_tokens as trie_tokens


def _seqs() -> tuple[list[list[int]], list[int]]:
    """Five rows and where each one's response starts."""
    g = torch.Generator().manual_seed(1)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 250, (n,), generator=g).tolist()

    prompt, reply, glue = rand(10), rand(5), rand(4)
    other = [3 + (reply[0] - 2) % 247] + reply[1:]  # the same reply but its first token
    a = prompt + reply
    b = a + glue + rand(3)  # the next turn of a: its prompt is a's whole row continued
    return [a, b, list(a), prompt + other, rand(8)], [10, 19, 10, 10, 5]


def _batch(seqs, starts):
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn, resp = torch.zeros_like(ids), torch.zeros(len(seqs), width)
    for i, (s, k) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)], attn[i, : len(s)] = torch.tensor(s), 1
        resp[i, k : len(s)] = 1
    return ids, attn, resp


def _grads(model, out):
    model.zero_grad()
    (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_the_tree_counts_each_distinct_token_once():
    seqs, starts = _seqs()
    rows = [TurnRecord(prompt_ids=s[:k], response_ids=s[k:], behaviour_logprobs=[], policy_version=0,
                       turn_index=0, messages=[]) for s, k in zip(seqs, starts)]  # fmt: skip
    # prompt 10 + reply 5 + next turn 7 + the other reply 5 + the unrelated row 8
    assert unique_tokens(seqs) == trie_tokens(rows) == 35
    ids, attn, _ = _batch(seqs, starts)
    assert carried_tokens(ids, attn) == 35


@pytest.mark.parametrize("checkpoint", [False, True])
def test_shared_replies_and_continued_rows_give_each_rows_own_numbers(tiny_bytes_model_dir, checkpoint):
    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    seqs, starts = _seqs()
    ids, attn, resp = _batch(seqs, starts)
    runs: Counter = Counter()
    decoder_and_head(model)[0].layers[0].register_forward_pre_hook(lambda *_: runs.update([0]))
    got = forward_shared(model, ids, attn, resp, checkpoint=checkpoint)
    assert runs[0] == 5  # the prompt, the reply, the next turn, the other reply, the unrelated row
    got_grads = _grads(model, got)
    for i, s in enumerate(seqs):  # each row alone, as forward_response has it
        want = forward_response(model, *(x[i : i + 1, : len(s)] for x in (ids, attn, resp)))
        assert torch.allclose(got.logprobs[i, : len(s)], want.logprobs[0], atol=1e-6), i
        assert torch.allclose(got.entropy[i, : len(s)], want.entropy[0], atol=1e-6), i
    want_grads = _grads(model, forward_response(model, ids, attn, resp))
    scale = max(g.abs().max().item() for g in want_grads)
    assert scale > 1e-3
    assert max((a - b).abs().max().item() for a, b in zip(got_grads, want_grads)) < 1e-5 * max(scale, 1.0)


def test_a_row_without_response_tokens_reads_nothing_and_still_backpropagates(tiny_bytes_model_dir):
    model = load_model(tiny_bytes_model_dir, torch.float32).train()
    ids, attn, resp = _batch(*_seqs())
    out = forward_shared(model, ids[:1], attn[:1], torch.zeros_like(resp[:1]), checkpoint=True)
    assert not out.logprobs.any() and out.logprobs.grad_fn is not None
    out.logprobs.sum().backward()  # a null micro-batch's: through every layer, zero gradients
    grads = [p.grad for p in decoder_and_head(model)[0].layers.parameters()]
    assert all(g is not None and not g.any() for g in grads)
