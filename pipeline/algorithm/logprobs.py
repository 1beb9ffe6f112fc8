"""Log-probs of response tokens with the LM head run only where a response token is predicted.

Used by the learner (with gradients) and the teacher scorer (under ``torch.no_grad``). The
decoder runs over the whole sequence once; its hidden states are then sliced to the positions
that predict response tokens (position t-1 for every t with ``response_mask[t] = 1``) before the
output layer. Prompt positions never reach the LM head: for typical agent turns (long prompt,
short response) that is most of the vocabulary projection TRL spends (docs/platform.md, "Peer baseline"),
and no ``[B, T, V]`` tensor is ever built: the largest is ``[N_sel, V]``.

Conventions (as ``pipeline.core.types.TrainBatch``): tensors are ``[B, T]``; a value at position t
describes token t, predicted from position t-1. Position ids are ``cumsum(attention_mask) - 1``,
the same rule HF ``generate`` uses, so left- and right-padded batches give the same numbers.

Supported models: causal LMs whose logits are ``lm_head(decoder(...).last_hidden_state)``
(Llama, Qwen2/2.5/3, Mistral, SmolLM2, ...). Models that post-process logits (final logit
softcapping, logit scaling) are refused rather than scored wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.core.types import TeacherNeeds, TeacherOutput

__all__ = [
    "ResponseForward",
    "forward_response",
    "position_ids_from_mask",
    "response_logprobs",
    "score_responses",
    "score_teacher",
]


@dataclass(kw_only=True, slots=True)
class ResponseForward:
    """Output of ``forward_response``."""

    logprobs: torch.Tensor  # [B, T] float32: log p(token_t | <t) at response positions, 0 elsewhere
    entropy: torch.Tensor | None  # [B, T] float32: entropy of the predictive distribution, 0 elsewhere
    logits: torch.Tensor | None  # [N_sel, V] float32, temperature-scaled, rows in response_mask.nonzero() order


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` with padding positions set to 0 (HF ``generate``'s rule).  # [B, T]"""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _unwrap(model: nn.Module) -> nn.Module:
    # DDP / DeepSpeed engines keep the HF model as ``.module`` (its submodules carry the ZeRO
    # hooks). Look on the class: DeepSpeedEngine forwards unknown instance attributes to .module.
    while not hasattr(type(model), "get_output_embeddings") and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The decoder and the LM head of ``model`` (unwrapped from a DDP / DeepSpeed engine)."""
    model = _unwrap(model)
    config = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            raise NotImplementedError(
                f"forward_response does not apply {attr}={value} of {type(model).__name__}; "
                "it supports models whose logits are lm_head(decoder hidden states)"
            )
    decoder = None
    if callable(getattr(model, "get_decoder", None)):
        decoder = model.get_decoder()
    if decoder is None or decoder is model:
        decoder = getattr(model, "model", None)
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if head is None:
        head = getattr(model, "lm_head", None)
    if not isinstance(decoder, nn.Module) or not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no decoder (get_decoder()/.model) and LM head (.lm_head)")
    return decoder, head


def forward_response(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    with_logits: bool = False,
    head_chunk: int = 0,
) -> ResponseForward:
    """One forward pass; log-probs (and entropy) of the response tokens only.

    With ``z_t = lm_head(h_{t-1}) / temperature`` for every t where ``response_mask[t] = 1``:

        logprobs[b, t] = log_softmax(z_t)[input_ids[b, t]]
        entropy[b, t]  = -sum_v softmax(z_t)_v * log_softmax(z_t)_v

    computed in float32 whatever the model dtype, and 0 at every other position. Gradients flow
    into the model through both. ``response_mask[:, 0]`` must be 0 (token 0 has no predecessor).

    Args:
        input_ids: ``[B, T]`` long, prompt + response, left- or right-padded.
        attention_mask: ``[B, T]``, 1 on real tokens.
        response_mask: ``[B, T]``, nonzero on the tokens to score (a subset of attended tokens).
        temperature: divides the logits, matching the sampler's temperature (must be > 0).
        with_entropy: also return the per-token entropy.
        with_logits: also return the selected temperature-scaled logits ``[N_sel, V]``.
        head_chunk: > 0, the LM head over at most this many tokens at a time (``from_hidden``).
    """
    selected = check_inputs(input_ids, attention_mask, response_mask, temperature)
    decoder, head = decoder_and_head(model)
    out = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # [B, T, H]
    rows, cols = selected.nonzero(as_tuple=True)  # [N_sel] each, row-major order
    return from_hidden(
        head, hidden[rows, cols - 1], input_ids, selected, temperature, with_entropy, with_logits, head_chunk
    )


def check_inputs(input_ids, attention_mask, response_mask, temperature: float) -> torch.Tensor:
    """Raise on inputs ``forward_response`` cannot score; the selected positions ``[B, T]`` bool."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    if input_ids.shape != attention_mask.shape or input_ids.shape != response_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same [B, T] shape"
        )
    selected = response_mask.bool()
    if selected[:, 0].any():
        raise ValueError("response_mask[:, 0] must be 0: the first token has no preceding position")
    if (selected & ~attention_mask.bool()).any():
        raise ValueError("response_mask marks padding positions (attention_mask = 0)")
    return selected


def from_hidden(
    head: nn.Module,
    hidden: torch.Tensor,  # [N_sel, H] the states predicting the selected tokens, row-major order
    input_ids: torch.Tensor,
    selected: torch.Tensor,  # [B, T] bool
    temperature: float,
    with_entropy: bool,
    with_logits: bool,
    head_chunk: int = 0,
) -> ResponseForward:
    """The LM head at the selected positions only, and what ``forward_response`` returns from it.
    ``head_chunk`` > 0: at most that many tokens through the head at a time, each chunk recomputed
    in backward, so that one chunk's float32 [tokens, vocab] tensors exist at once instead of the
    whole micro-batch's (the same numbers; logits asked for come whole)."""
    rows, cols = selected.nonzero(as_tuple=True)
    targets = input_ids[rows, cols]
    if with_logits or head_chunk <= 0 or hidden.shape[0] <= head_chunk:
        token_logp, token_entropy, logits = _head(head, hidden, targets, temperature, with_entropy, with_logits)
    else:
        parts = [
            checkpoint(_head, head, h, t, temperature, with_entropy, False, use_reentrant=False)
            if torch.is_grad_enabled()
            else _head(head, h, t, temperature, with_entropy, False)
            for h, t in zip(hidden.split(head_chunk), targets.split(head_chunk))
        ]
        token_logp = torch.cat([p[0] for p in parts])
        token_entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
        logits = None
    B, T = input_ids.shape
    logprobs = torch.zeros(B, T, dtype=torch.float32, device=hidden.device).index_put((rows, cols), token_logp)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(B, T, dtype=torch.float32, device=hidden.device).index_put((rows, cols), token_entropy)
    return ResponseForward(logprobs=logprobs, entropy=entropy, logits=logits)


def _head(head: nn.Module, hidden, targets, temperature: float, with_entropy: bool, with_logits: bool):
    """(log-prob of each target [N], its entropy [N] or None, the logits [N, V] or None)."""
    logits = head(hidden).float()  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # [N, V]
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N]
    token_entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None  # [N]
    return token_logp, token_entropy, logits if with_logits else None


def _padded(items: list[tuple[list[int], list[int]]]):
    """Right-padded ``prompt + response`` rows with their response mask (``TrainBatch`` fields;
    pad id 0 is masked)."""
    from pipeline.core.types import TrainBatch

    width = max(len(p) + len(r) for p, r in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(len(items), width)
    for i, (p, r) in enumerate(items):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        attn[i, :n] = 1
        resp[i, len(p) : n] = 1
    zeros = torch.zeros_like(resp)
    return TrainBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, behaviour_logprobs=zeros, advantages=zeros
    )


@torch.no_grad()
def _forwards(model: nn.Module, items, *, temperature: float, micro_batch_tokens: int | None, with_logits: bool):
    """``forward_response`` over ``items`` = (prompt ids, response ids), one micro-batch of at most
    ``micro_batch_tokens`` padded tokens at a time, or (None) one item at a time with no padding
    and so no attention mask (SDPA's causal kernel, as the learner's ``learner.unpadded``), on the
    model's device; yields each micro-batch (rows in item order) with its forward."""
    from pipeline.core.microbatch import slice_rows, split_by_tokens

    device = next(model.parameters()).device
    batch = _padded(items)
    if micro_batch_tokens:
        mbs = split_by_tokens(batch, micro_batch_tokens)
    else:
        mbs = [slice_rows(batch, i, i + 1) for i in range(batch.n_rows)]
    for mb in mbs:
        fw = forward_response(
            model,
            mb.input_ids.to(device),
            mb.attention_mask.to(device),
            mb.response_mask.to(device),
            temperature=temperature,
            with_entropy=False,
            with_logits=with_logits,
        )
        yield mb, fw


def score_responses(
    model: nn.Module,
    items: list[tuple[list[int], list[int]]],
    *,
    temperature: float,
    micro_batch_tokens: int | None = None,
) -> list[list[float]]:
    """Per-token log-probs of each response after its prompt (``items`` = (prompt ids, response
    ids)): one no-grad ``forward_response`` per micro-batch of at most ``micro_batch_tokens``
    padded tokens (None: per item, unpadded), on the model's device. What a teacher is: the scorer actor and
    a rollout engine that scores (``scorer.placement``) both call this."""
    if not items:
        return []
    out: list[list[float]] = []
    for mb, fw in _forwards(
        model, items, temperature=temperature, micro_batch_tokens=micro_batch_tokens, with_logits=False
    ):
        lp = fw.logprobs.cpu()
        out += [lp[i][mb.response_mask[i].bool()].tolist() for i in range(mb.n_rows)]
    return out


def _row_logsoftmax(model: nn.Module, items, *, temperature: float, micro_batch_tokens: int | None):
    """Per item, the temperature-scaled log-softmax ``[n_response, V]`` at its response
    positions, one item at a time out of each micro-batch's forward (no grad, CPU float32)."""
    for mb, fw in _forwards(
        model, items, temperature=temperature, micro_batch_tokens=micro_batch_tokens, with_logits=True
    ):
        counts = mb.response_mask.sum(1).long().tolist()
        yield from torch.split(torch.log_softmax(fw.logits, dim=-1).cpu(), counts)


@torch.no_grad()
def score_teacher(
    model: nn.Module,
    items: list[tuple[list[int], list[int]]],
    plain: list[tuple[list[int], list[int]]],
    needs: TeacherNeeds,
    *,
    temperature: float,
    micro_batch_tokens: int | None = None,
) -> TeacherOutput:
    """A teacher's forward, all a signal ``needs`` of it. ``items[i]`` is (privileged prompt,
    response); ``plain`` is empty or, per item, the same response after the student's own prompt
    (the noise floor: the same weights without the privileged context). What a teacher is: the
    scorer actor and a rollout engine that scores (``scorer.placement``) both call this.

    With ``needs.support_k`` = k the plain forward is the student (a self-teacher's weights are
    the policy's): its top-k token ids at each response position are the support S_t, and the
    privileged forward gives the teacher's log-probs there. ``needs.channels`` are computed from
    the privileged forward's log-softmax. Everything at ``temperature``; no version (the caller's)."""
    if needs.support_k and len(plain) != len(items):
        raise ValueError(f"{len(items)} privileged items for {len(plain)} plain ones (the support needs them)")
    if needs.support_k < 0:
        raise ValueError(f"support_k must be >= 0, got {needs.support_k}")
    kw = {"temperature": temperature, "micro_batch_tokens": micro_batch_tokens}
    if not needs.whole_distribution:
        lps = score_responses(model, items + plain, **kw)
        return TeacherOutput(logprobs=lps[: len(items)], plain_logprobs=lps[len(items) :] if plain else None)
    out = TeacherOutput(logprobs=[], plain_logprobs=[] if plain else None)
    support = []
    for (_, resp), lsm in zip(plain, _row_logsoftmax(model, plain, **kw) if plain else []):
        out.plain_logprobs.append(_gather(lsm, resp))
        if needs.support_k:
            support.append(lsm.topk(min(needs.support_k, lsm.shape[-1]), dim=-1).indices)  # [n, k]
    if needs.support_k:
        out.topk_ids, out.topk_logprobs = [x.tolist() for x in support], []
    out.channels = {c.name: [] for c in needs.channels}
    for i, ((_, resp), lsm) in enumerate(zip(items, _row_logsoftmax(model, items, **kw))):
        out.logprobs.append(_gather(lsm, resp))
        if needs.support_k:
            out.topk_logprobs.append(lsm.gather(-1, support[i]).tolist())
        for c in needs.channels:
            out.channels[c.name].append(c.fn(lsm).tolist())
    return out


def _gather(lsm: torch.Tensor, ids: list[int]) -> list[float]:
    """The log-probs of ``ids`` from a row's log-softmax ``[n, V]``."""
    return lsm.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1).tolist()


def response_logprobs(
    model: nn.Module, prompts: list[list[int]], responses: list[list[int]], *, temperature: float = 1.0
) -> list[torch.Tensor]:
    """Per-token log-probs of each ``responses[i]`` after ``prompts[i]`` in one batch (CPU float32
    tensors). This is what the learner computes for a row, so an engine's behaviour log-probs can
    be checked against it."""
    return [torch.tensor(x) for x in score_responses(model, list(zip(prompts, responses)), temperature=temperature)]
