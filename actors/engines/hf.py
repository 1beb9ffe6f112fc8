"""HF transformers rollout engine: the CPU default (vLLM takes over on GPU).

One ``model.generate`` call per ``generate`` over all prompts, left-padded. The engine owns the
whole sampling distribution: the model's ``generation_config`` is replaced by a clean one at
construction (so no checkpoint default such as ``top_k=50`` or a repetition penalty sneaks in),
and temperature / top-p are applied by processors the engine passes itself, followed by a
recorder that keeps the log-softmax of the final scores. Hence each reported log-prob is that of
the sampled token under exactly the distribution it was drawn from:

    sampling (temperature > 0):  log_softmax(top_p(logits / temperature))[token]
    greedy   (temperature == 0): log_softmax(logits)[token]

With ``top_p == 1`` the first equals ``pipeline.algorithm.logprobs.forward_response(..., temperature=T)`` on
prompt + response (tested in ``tests/integration/test_hf_engine.py``). The recorder holds one
``[B, V]`` float32 step at a time instead of the ``max_new_tokens x [B, V]`` that
``output_scores=True`` would keep.

A response is the sampled ids up to and including the first EOS (``finish_reason="stop"``), or
all ``max_new_tokens`` ids (``"length"``); the pad ids HF writes after a finished row are cut.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from actors.engines.base import FinishReason, Generation, GenerationEngine, request_seeds
from pipeline.core.chat_templates import stop_token_ids
from pipeline.models import as_torch_dtype, load_model, load_tokenizer

__all__ = ["HFEngine"]


class _SampledLogprobRecorder(LogitsProcessor):
    """Last processor in the chain: remembers ``log_softmax(scores)`` and, one step later (once
    the sampled token is visible in ``input_ids``), keeps only the sampled token's entry."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # each [B]
        self._pending: torch.Tensor | None = None  # [B, V] log-probs of the step not yet sampled

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self.steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[B, n_gen]`` of ``generated`` ``[B, n_gen]`` (the ids after the prompt)."""
        n_gen = generated.shape[1]
        if len(self.steps) < n_gen and self._pending is not None:
            self.steps.append(self._pending.gather(-1, generated[:, len(self.steps)].unsqueeze(-1)).squeeze(-1))
        self._pending = None
        # HF may run one step past the stop on GPU and undo it; those entries lie past n_gen.
        if n_gen == 0:
            return torch.zeros(generated.shape, dtype=torch.float32, device=generated.device)
        return torch.stack(self.steps[:n_gen], dim=1)


class _RowSampler(LogitsProcessor):
    """After the recorder: draws each row's token from its own generator (seeded per request, so a
    row's sample does not depend on which other rows share its batch) and hands HF a one-hot
    distribution on it, which HF's own sampling then cannot but pick."""

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.float(), dim=-1)
        chosen = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, chosen, 0.0)


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
        self._eos_tensor = torch.tensor(self._eos_ids)

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

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

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

    def score_on_support(self, items, plain, k, *, temperature, micro_batch_tokens):
        from pipeline.algorithm.logprobs import score_on_support

        return score_on_support(
            self._model, items, plain, k, temperature=temperature, micro_batch_tokens=micro_batch_tokens
        )

    # ------------------------------------------------------------------------------ generation

    def _check_prompts(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        for i, prompt in enumerate(prompts):
            n = len(prompt)
            if n == 0:
                raise ValueError(f"prompt {i} is empty")
            if self._max_prompt_len is not None and n > self._max_prompt_len:
                raise ValueError(
                    f"prompt {i} has {n} tokens, more than max_prompt_len={self._max_prompt_len}; "
                    "shorten the history (history_length) or raise max_prompt_len"
                )
            if self._max_positions is not None and n + max_new_tokens > self._max_positions:
                raise ValueError(
                    f"prompt {i} has {n} tokens; with max_new_tokens={max_new_tokens} it exceeds the model's "
                    f"{self._max_positions} positions; shorten the prompt or lower max_new_tokens"
                )

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self._check_prompts(prompts, max_new_tokens)
        if not prompts:
            return []

        device = self.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):  # left padding: generation continues from column `width`
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, width - len(prompt) :] = 1

        do_sample = temperature > 0
        processors = LogitsProcessorList()
        if do_sample and temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if do_sample and top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
        recorder = _SampledLogprobRecorder()
        processors.append(recorder)
        if do_sample and (seeds is not None or seed is not None):
            processors.append(_RowSampler(request_seeds(len(prompts), seed, seeds), device))
        # HF's own warpers are neutralised (temperature 1, top_k 0, top_p 1): ours above replace them.
        sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            num_beams=1,
            eos_token_id=self._eos_ids,
            pad_token_id=self._pad_id,
            use_cache=True,
            **sampling,
        )
        # HF still draws (from a one-hot distribution) with the global RNG: leave the caller's alone.
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            sequences = self._model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                logits_processor=processors,
            )
        generated = sequences[:, width:]  # [B, n_gen]
        logprobs = recorder.finish(generated).cpu()  # [B, n_gen]
        generated = generated.cpu()

        is_eos = torch.isin(generated, self._eos_tensor)  # [B, n_gen]
        results = []
        for b in range(len(prompts)):
            hits = is_eos[b].nonzero()
            if len(hits):
                end, reason = int(hits[0]) + 1, FinishReason.STOP
            else:
                end, reason = generated.shape[1], FinishReason.LENGTH
            results.append(
                Generation(
                    token_ids=generated[b, :end].tolist(),
                    logprobs=logprobs[b, :end].tolist(),
                    finish_reason=reason,
                )
            )
        return results

    # ------------------------------------------------------------------------------ weights

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy the tensors into the live parameters (cast to the engine's dtype and device).

        Every key must be a model key and every model tensor must be given, except aliases of a
        given tensor: tied weights (LM head = embeddings) may be sent under either name or both;
        each storage is copied once, from the first of its names in ``state_dict``.
        """
        own = self._model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise KeyError(f"load_state_dict: keys not in the model: {_preview(unexpected)}")
        given_storage = {own[k].data_ptr() for k in state_dict}
        missing = sorted(k for k in set(own) - set(state_dict) if own[k].data_ptr() not in given_storage)
        if missing:
            raise KeyError(f"load_state_dict: model tensors not given: {_preview(missing)}")
        for key, value in state_dict.items():
            if tuple(value.shape) != tuple(own[key].shape):
                raise ValueError(
                    f"load_state_dict: {key} has shape {tuple(value.shape)}, model has {tuple(own[key].shape)}"
                )
        done: set[int] = set()
        with torch.no_grad():
            for key, value in state_dict.items():
                if own[key].data_ptr() in done:  # a tied alias already copied (first name wins)
                    continue
                own[key].copy_(value)  # in place: same storage, no module rebuild
                done.add(own[key].data_ptr())
        self._version = int(version)


def _preview(keys: list[str], n: int = 5) -> str:
    return ", ".join(keys[:n]) + (f" ... ({len(keys)} in all)" if len(keys) > n else "")
