"""HF transformers rollout engine: the CPU default (vLLM takes over on GPU).

``generate`` is a decode loop of its own over an HF causal LM: each distinct prompt is prefilled
alone, unpadded (no attention mask, so SDPA's causal kernel; a group's identical first prompts
once), then the rows decode together on one left-padded KV cache, a row leaving the batch (and
the cache) at its EOS. The engine owns the whole sampling distribution: temperature and top-p are
applied by HF's warpers, and each reported log-prob is that of the sampled token under exactly
the distribution it was drawn from:

    sampling (temperature > 0):  log_softmax(top_p(logits / temperature))[token]
    greedy   (temperature == 0): log_softmax(logits)[token]

With ``top_p == 1`` the first equals ``pipeline.algorithm.logprobs.forward_response(...,
temperature=T)`` on prompt + response (tested in ``tests/integration/test_hf_engine.py``). Each
request draws from a generator of its own seed, so its sample does not depend on the other
requests of its batch. The model's ``generation_config`` is replaced by a clean one at
construction (no checkpoint default such as ``top_k=50`` can reach a caller of ``generate`` on
the model itself).

A response is the sampled ids up to and including the first EOS (``finish_reason="stop"``), or
all ``max_new_tokens`` ids (``"length"``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from actors.engines.base import FinishReason, Generation, GenerationEngine, check_prompts, check_sampling, request_seeds
from pipeline.core.chat_templates import stop_token_ids
from pipeline.core.kv_cache import cache_of, with_cache
from pipeline.distributed.weight_sync import load_into
from pipeline.models import as_torch_dtype, load_model, load_tokenizer

__all__ = ["HFEngine"]


class HFEngine(GenerationEngine):
    """``GenerationEngine`` over an HF causal LM and its tokenizer.

    Args:
        model: the causal LM (put in eval mode; its ``generation_config`` is replaced, see module doc).
        tokenizer: its tokenizer; ``eos_token_id`` and ``pad_token_id`` (falls back to eos) are used.
        max_prompt_len: optional cap on prompt length; longer prompts raise ``ValueError``. Prompts
            must also leave room for ``max_new_tokens`` within ``max_position_embeddings``.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: Any, *, max_prompt_len: int | None = None) -> None:
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._version = 0
        self._max_prompt_len = max_prompt_len
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self._max_positions: int | None = getattr(text_config, "max_position_embeddings", None)

        eos: set[int] = set(stop_token_ids(tokenizer))  # EOS + the chat template's end-of-turn token
        for source in (tokenizer.eos_token_id, model.generation_config.eos_token_id):
            if source is not None:
                eos.update(source if isinstance(source, (list, tuple)) else [source])
        if not eos:
            raise ValueError("the tokenizer and the model's generation_config define no eos_token_id")
        self._eos_ids = sorted(eos)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_id = int(pad if pad is not None else self._eos_ids[0])
        # Unset fields of the config passed to generate() are filled from model.generation_config;
        # a clean one keeps checkpoint sampling defaults out of the distribution we report.
        self._model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=self._eos_ids, pad_token_id=self._pad_id
        )
        self._eos_set = frozenset(self._eos_ids)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        max_prompt_len: int | None = None,
        chat_template: str | None = None,
    ) -> "HFEngine":
        """Load model (``dtype``: fp32/bf16/...) and tokenizer (``chat_template``: see
        ``pipeline.models.load_tokenizer``) from an HF directory."""
        return cls(
            load_model(path, as_torch_dtype(dtype), device),
            load_tokenizer(path, chat_template),
            max_prompt_len=max_prompt_len,
        )

    # ------------------------------------------------------------------------------ properties

    # version and tokenizer: GenerationEngine's properties over _version / _tokenizer

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    # ------------------------------------------------------------------------------ scoring

    can_score = True

    def score(self, items, *, temperature, micro_batch_tokens):
        """The teacher's forward on the weights this engine samples with (scorer.placement=engine):
        no copy of the policy, no weight sync of its own."""
        from pipeline.algorithm.logprobs import score_responses

        return score_responses(self._model, items, temperature=temperature, micro_batch_tokens=micro_batch_tokens)

    def score_teacher(self, items, plain, needs, *, temperature, micro_batch_tokens):
        from pipeline.algorithm.logprobs import score_teacher

        return score_teacher(
            self._model, items, plain, needs, temperature=temperature, micro_batch_tokens=micro_batch_tokens
        )

    # ------------------------------------------------------------------------------ generation

    def _check_prompts(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        check_prompts(
            prompts,
            max_new_tokens,
            max_prompt_len=self._max_prompt_len,
            max_len=self._max_positions,
            max_len_is=f"the model's {self._max_positions} positions; shorten the prompt or lower max_new_tokens",
        )

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, seed=None, seeds=None) -> list[Generation]:
        check_sampling(temperature, top_p)
        self._check_prompts(prompts, max_new_tokens)
        if not prompts:
            return []

        do_sample = temperature > 0
        warpers = []
        if do_sample and temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if do_sample and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        row_seeds = request_seeds(len(prompts), seed, seeds) if do_sample and (seed, seeds) != (None, None) else None
        with torch.no_grad():
            tokens, logprobs = self._decode(prompts, max_new_tokens, do_sample, warpers, row_seeds)
        results = []
        for ids, lps in zip(tokens, logprobs):
            stop = ids[-1] in self._eos_set
            reason = FinishReason.STOP if stop else FinishReason.LENGTH
            results.append(Generation(token_ids=ids, logprobs=lps, finish_reason=reason))
        return results

    def _prefill(self, prompts: list[list[int]]):
        """Each distinct prompt forwarded alone, unpadded (no attention mask: SDPA's causal
        kernel, none of a padded batch's [T, T] per head), once however many requests share it
        (a group's first turn). Returns per prompt its last position's logits [V] and its
        per-layer keys and values."""
        device, seen, out = self.device, {}, []
        for prompt in prompts:
            key = tuple(prompt)
            if key not in seen:
                ids = torch.tensor([prompt], dtype=torch.long, device=device)
                res = self._model(input_ids=ids, use_cache=True, logits_to_keep=1)
                cache = cache_of(res)
                seen[key] = (res.logits[0, -1], [(layer.keys, layer.values) for layer in cache.layers])
            out.append(seen[key])
        return out

    def _decode(self, prompts, max_new_tokens: int, do_sample: bool, warpers: list, row_seeds: list[int] | None):
        """Sample every prompt's continuation: prefill alone (``_prefill``), then decode the rows
        together on one left-padded KV cache, a row leaving the batch at its EOS. Each token's
        log-prob is ``log_softmax`` of the scores it was drawn from (after the warpers)."""
        from transformers import DynamicCache

        device, n = self.device, len(prompts)
        pre = self._prefill(prompts)
        width = max(len(p) for p in prompts)
        layers = []
        for li in range(len(pre[0][1])):  # left-pad each row's keys and values to ``width``
            ks = [torch.nn.functional.pad(kv[li][0], (0, 0, width - len(p), 0)) for p, (_, kv) in zip(prompts, pre)]
            vs = [torch.nn.functional.pad(kv[li][1], (0, 0, width - len(p), 0)) for p, (_, kv) in zip(prompts, pre)]
            layers.append((torch.cat(ks), torch.cat(vs)))
        cache = DynamicCache(ddp_cache_data=layers, config=self._model.config)
        mask = torch.zeros((n, width), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            mask[i, width - len(p) :] = 1
        pos = torch.tensor([len(p) for p in prompts], device=device)
        gens = [torch.Generator(device=device).manual_seed(int(s)) for s in row_seeds] if row_seeds else None
        live = list(range(n))  # the requests still decoding, in the cache's row order
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        scores = torch.stack([logits for logits, _ in pre]).float()  # [B, V] the next token's
        for _step in range(max_new_tokens):
            for w in warpers:
                scores = w(None, scores)
            logp = torch.log_softmax(scores, dim=-1)
            if not do_sample:
                chosen = scores.argmax(-1)
            elif gens is None:
                chosen = torch.multinomial(logp.exp(), 1).squeeze(1)
            else:
                probs = logp.exp()
                chosen = torch.cat([torch.multinomial(probs[j], 1, generator=gens[r]) for j, r in enumerate(live)])
            picked = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
            keep = []
            for j, r in enumerate(live):
                tokens[r].append(int(chosen[j]))
                logprobs[r].append(picked[j])
                if tokens[r][-1] not in self._eos_set:
                    keep.append(j)
            if not keep or _step == max_new_tokens - 1:
                break
            if len(keep) < len(live):  # finished rows leave the batch (and the cache)
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                mask, pos, chosen = mask[idx], pos[idx], chosen[idx]
                live = [live[j] for j in keep]
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=device)], dim=1)
            out = self._model(
                input_ids=chosen.unsqueeze(1), attention_mask=mask, position_ids=pos.unsqueeze(1),
                use_cache=True, **with_cache(self._model, cache),
            )  # fmt: skip
            pos = pos + 1
            scores = out.logits[:, -1].float()
        return tokens, logprobs

    # ------------------------------------------------------------------------------ weights

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy the tensors into the live parameters (cast to the engine's dtype and device);
        strict on names, a tied LM head may be sent under either name or both (``load_into``)."""
        load_into(self._model, dict(state_dict))
        self._version = int(version)
