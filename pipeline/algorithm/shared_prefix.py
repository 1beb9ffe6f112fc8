"""Rows that share a prefix, forwarded once for it: ``forward_response``'s numbers, exactly.

A step's rows repeat each other: the episodes of a group share their first prompt, episodes that
acted alike share much of their next ones and often whole replies, every row shares the template,
and under ``env.prompt_format=chat`` a turn's row is the previous turn's row continued.
``forward_shared`` builds the radix tree of the rows' token sequences and runs the decoder once
per edge of it, each edge on the KV cache of the path above it (Prefix Grouper, arXiv 2506.05433,
in the form of a cache tree). A row's log-probs are read from the hidden states of the edges on
its path, wherever its response lies: a reply that another row also sampled, or that a later turn
continues, is forwarded once. Attention of a token to its row's earlier tokens is the same
computation either way, so every hidden state, log-prob and entropy equals the one of the row
forwarded alone; the gradient of a loss over all rows reaches a shared edge once, summed over the
rows that read it or continue below it (autograd adds the contributions through its outputs and
its cached keys and values). ``unique_tokens`` is what such a forward carries (the tree's size).

With ``checkpoint`` every run goes through ``layer_checkpoint.decoder_forward``: each decoder
layer recomputed in backward, the caches kept, so a micro-batch holds a few KB a token instead of
its layers' internals (``learner.gradient_checkpointing``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from pipeline.algorithm.layer_checkpoint import check_supported, decoder_forward
from pipeline.algorithm.logprobs import ResponseForward, check_inputs, decoder_and_head, forward_response, from_hidden
from pipeline.core.kv_cache import cache_of, with_cache


@dataclass
class _Node:
    start: int  # the position of its first token in every row below it
    end: int  # one past its last token (start == end: a node that only splits)
    rows: list[int]  # every row below it (its tokens are theirs)
    ends: list[int] = field(default_factory=list)  # rows whose tokens end here
    children: list[_Node] = field(default_factory=list)


def _tree(seqs: list[list[int]], rows: list[int], start: int) -> _Node:
    """The radix tree of ``seqs`` for ``rows``, which share ``[0, start)``."""
    end = start
    while all(len(seqs[i]) > end for i in rows) and len({seqs[i][end] for i in rows}) == 1:
        end += 1
    node = _Node(start, end, rows, ends=[i for i in rows if len(seqs[i]) == end])
    by_token: dict[int, list[int]] = defaultdict(list)
    for i in rows:
        if len(seqs[i]) > end:
            by_token[seqs[i][end]].append(i)
    node.children = [_tree(seqs, group, end) for group in by_token.values()]
    return node


def unique_tokens(seqs: list[list[int]]) -> int:
    """Tokens a shared forward of these rows carries: the size of their radix tree."""

    def size(node: _Node) -> int:
        return node.end - node.start + sum(size(c) for c in node.children)

    return size(_tree(seqs, list(range(len(seqs))), 0))


def carried_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The tokens ``forward_shared`` runs through the decoder for these right-padded rows."""
    lengths = attention_mask.sum(1).tolist()
    return unique_tokens([input_ids[i, :n].tolist() for i, n in enumerate(lengths)])


def _layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _read(path: list[tuple[int, torch.Tensor]], positions: torch.Tensor) -> torch.Tensor:
    """The hidden states at ``positions`` (ascending) of a row whose path holds the edges
    ``(start, states)`` in order. A row with no response reads none, still tied to the graph: a
    null micro-batch's backward runs the same collectives as a real one."""
    parts = [path[-1][1][:0]]
    for start, states in path:
        inside = positions[(positions >= start) & (positions < start + states.shape[0])]
        if len(inside):
            parts.append(states[inside - start])
    return torch.cat(parts)


def forward_shared(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    with_logits: bool = False,
    checkpoint: bool = False,
    head_chunk: int = 0,
) -> ResponseForward:
    """``forward_response``'s contract (right-padded rows) through the rows' radix tree; with
    ``checkpoint``, each layer recomputed in backward (a row alone: one run of the whole row)."""
    from transformers import DynamicCache

    selected = check_inputs(input_ids, attention_mask, response_mask, temperature)
    if input_ids.shape[0] == 1 and not checkpoint:
        return forward_response(
            model, input_ids, attention_mask, response_mask,
            temperature=temperature, with_entropy=with_entropy, with_logits=with_logits, head_chunk=head_chunk,
        )  # fmt: skip
    if bool((attention_mask[:, 0] == 0).any()):
        raise ValueError("forward_shared takes right-padded rows (attention_mask[:, 0] = 1)")
    lengths = attention_mask.sum(1).tolist()
    seqs = [input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    decoder, head = decoder_and_head(model)
    if checkpoint:
        check_supported(decoder)
    config = getattr(decoder, "config", None)
    device = input_ids.device
    states: dict[int, torch.Tensor] = {}  # row -> hidden states at the positions predicting its response

    def run(tokens: list[int], start: int, parent: list | None):
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        pos = torch.arange(start, start + len(tokens), device=device).unsqueeze(0)
        if checkpoint:
            hidden, layers = decoder_forward(decoder, ids, pos, parent)
            return hidden[0], layers
        cache = DynamicCache(ddp_cache_data=parent, config=config) if parent else None
        out = decoder(input_ids=ids, position_ids=pos, use_cache=True, **with_cache(decoder, cache))
        return out.last_hidden_state[0], _layers(cache_of(out))

    def visit(node: _Node, parent: list | None, path: list[tuple[int, torch.Tensor]]) -> None:
        if node.end > node.start:  # an edge every row below it holds: once for all of them
            hidden, parent = run(seqs[node.rows[0]][node.start : node.end], node.start, parent)
            path = [*path, (node.start, hidden)]
        for i in node.ends:
            states[i] = _read(path, selected[i].nonzero().squeeze(1) - 1)
        for child in node.children:
            visit(child, parent, path)

    visit(_tree(seqs, list(range(len(seqs))), 0), None, [])
    # row-major order, as forward_response's: each row's states at the positions predicting its tokens
    hidden = torch.cat([states[r] for r in range(len(seqs))])
    return from_hidden(head, hidden, input_ids, selected, temperature, with_entropy, with_logits, head_chunk)
