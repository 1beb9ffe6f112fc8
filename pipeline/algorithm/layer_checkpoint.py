"""The decoder layer by layer, each layer recomputed in backward, with its KV cache kept.

Activation checkpointing that works with the shared-prefix forward (``shared_prefix.py``), whose
edges run on the KV caches of the paths above them. HF's gradient checkpointing turns the cache
off, because a recomputed layer would append its keys to the cache a second time. Here each layer
runs inside ``torch.utils.checkpoint`` (non-reentrant) with a cache of its own, ``_LayerCache``,
that starts from the parent's keys and values of that layer only; both enter the checkpointed
function as inputs and the concatenation leaves it as outputs, so a recomputation rebuilds the
same tensors instead of extending a shared cache.

What a token keeps between forward and backward: its hidden state at every layer's input (H
values a layer) and, on an edge other rows continue, its keys and values, once: an edge's run
returns its own keys and values beside its path's tensors, and a child reads the path from those
(concatenated inside its checkpointed layer, a temporary rebuilt in backward). A layer's internals
(the norms' float32 copies, the MLP's four intermediate tensors: about 28 KB a token a layer for
SmolLM2 in bf16, docs/results/learner_activations) exist for one layer at a time, in backward.

Supported decoders: HF's ``LlamaModel`` (Llama, SmolLM2) with SDPA attention: the loop below
restates its forward (embeddings, causal mask, rotary embeddings, layers, final norm), and any
other decoder is refused rather than run through a forward it may not match.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.core.kv_cache import with_cache

__all__ = ["check_supported", "decoder_forward"]

SUPPORTED = ("LlamaModel",)


def check_supported(decoder: nn.Module) -> None:
    """Raise, naming what to change, if ``decoder_forward`` cannot run ``decoder``."""
    name = type(decoder).__name__
    attn = getattr(getattr(decoder, "config", None), "_attn_implementation", None)
    if name not in SUPPORTED or attn != "sdpa":
        raise NotImplementedError(
            f"learner.gradient_checkpointing with learner.shared_tokens > 0 runs the decoder layer by layer, "
            f"written for {', '.join(SUPPORTED)} with sdpa attention; this model is {name} with {attn} "
            "attention: set learner.shared_tokens=0 (HF's own checkpointing) or learner.gradient_checkpointing=false"
        )


Chunks = list[tuple[torch.Tensor, torch.Tensor]]  # a layer's (keys, values) per edge of a path, in order


class _LayerCache:
    """The one method a Llama attention layer calls on its cache: this run's keys and values after
    the path's. The attention reads the path and the run concatenated (a temporary of this layer,
    rebuilt in backward); the run keeps only its own keys and values, so a prefix's are held once
    however many edges below it read them. A cache of the whole path per edge held them again at
    every edge below: little on make train's rows (a few hundred tokens of keys and values, 23 KB a
    token over SmolLM2's layers, per internal node), more the deeper the tree (chat-format
    episodes, whose every turn continues the last)."""

    def __init__(self, past: Chunks):
        self.past = past
        self.keys = self.values = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.keys, self.values = keys, values
        if not self.past:
            return keys, values
        return (
            torch.cat([*(k for k, _ in self.past), keys], dim=-2),
            torch.cat([*(v for _, v in self.past), values], dim=-2),
        )


def _causal_mask(n_new: int, n_past: int, device: torch.device) -> torch.Tensor | None:
    """SDPA's mask for ``n_new`` tokens after ``n_past`` cached ones (True: attend), as HF builds
    it; None without a past, where SDPA runs its causal kernel (HF's ``is_causal`` path)."""
    if n_past == 0:
        return None
    return torch.ones(n_new, n_past + n_new, dtype=torch.bool, device=device).tril(n_past)[None, None]


def decoder_forward(
    decoder: nn.Module,
    input_ids: torch.Tensor,  # [1, T] the new tokens
    position_ids: torch.Tensor,  # [1, T]
    parent: list[Chunks] | None,  # per layer, the (keys, values) of each edge of the path above
) -> tuple[torch.Tensor, list[Chunks]]:
    """The final hidden states ``[1, T, H]`` and, per layer, the path's (keys, values) chunks (the
    parent's tensors themselves) followed by this run's own, each layer checkpointed while
    gradients are on."""
    n_past = sum(k.shape[-2] for k, _ in parent[0]) if parent else 0
    hidden = decoder.embed_tokens(input_ids)
    mask = _causal_mask(input_ids.shape[1], n_past, input_ids.device)
    rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
    layers = []
    for i, layer in enumerate(decoder.layers[: decoder.config.num_hidden_layers]):

        def step(h, *past, layer=layer):
            cache = _LayerCache(list(zip(past[0::2], past[1::2])))
            out = layer(
                h, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids, use_cache=True,
                **with_cache(layer, cache),
            )  # fmt: skip
            return (out[0] if isinstance(out, tuple) else out), cache.keys, cache.values

        past = parent[i] if parent else []
        flat = [t for kv in past for t in kv]  # checkpoint's inputs: references, not copies
        if torch.is_grad_enabled():
            hidden, keys, values = checkpoint(step, hidden, *flat, use_reentrant=False)
        else:
            hidden, keys, values = step(hidden, *flat)
        layers.append([*past, (keys, values)])
    return decoder.norm(hidden), layers
