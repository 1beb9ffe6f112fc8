"""The decoder layer by layer, each layer recomputed in backward, with its KV cache kept.

Activation checkpointing that works with the shared-prefix forward (``shared_prefix.py``), whose
edges run on the KV caches of the paths above them. HF's gradient checkpointing turns the cache
off, because a recomputed layer would append its keys to the cache a second time. Here each layer
runs inside ``torch.utils.checkpoint`` (non-reentrant) with a cache of its own, ``_LayerCache``,
that starts from the parent's keys and values of that layer only; both enter the checkpointed
function as inputs and the concatenation leaves it as outputs, so a recomputation rebuilds the
same tensors instead of extending a shared cache.

What a token keeps between forward and backward: its hidden state at every layer's input (H
values a layer) and, on an edge other rows continue, its keys and values. A layer's internals
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


class _LayerCache:
    """The one method a Llama attention layer calls on its cache: append this step's keys and
    values to the parent's and return the whole."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None):
        self.keys, self.values = keys, values

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.keys is not None:
            keys = torch.cat([self.keys, keys], dim=-2)
            values = torch.cat([self.values, values], dim=-2)
        self.keys, self.values = keys, values
        return keys, values


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
    parent: list[tuple[torch.Tensor, torch.Tensor]] | None,  # per layer (keys, values) of the path above
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The final hidden states ``[1, T, H]`` and every layer's (keys, values) of path + new tokens,
    each layer checkpointed while gradients are on."""
    n_past = parent[0][0].shape[-2] if parent else 0
    hidden = decoder.embed_tokens(input_ids)
    mask = _causal_mask(input_ids.shape[1], n_past, input_ids.device)
    rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
    layers = []
    for i, layer in enumerate(decoder.layers[: decoder.config.num_hidden_layers]):

        def step(h, keys, values, layer=layer):
            cache = _LayerCache(keys, values)
            out = layer(
                h, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids, use_cache=True,
                **with_cache(layer, cache),
            )  # fmt: skip
            return (out[0] if isinstance(out, tuple) else out), cache.keys, cache.values

        keys, values = parent[i] if parent else (None, None)
        if torch.is_grad_enabled():
            hidden, keys, values = checkpoint(step, hidden, keys, values, use_reentrant=False)
        else:
            hidden, keys, values = step(hidden, keys, values)
        layers.append((keys, values))
    return decoder.norm(hidden), layers
