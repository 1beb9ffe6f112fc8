"""The contract every rollout engine implements (HF transformers on CPU, vLLM on GPU).

An engine turns already-tokenised prompts into sampled continuations and reports, for every
sampled token, its log-prob under the distribution it was actually drawn from (after temperature
and top-p). Those are the behaviour log-probs of ``TurnRecord``; the learner's importance ratios
are only right if they are. Engines never re-tokenise: callers hand in token ids and get token ids
back.

Weights are swapped in place by ``load_state_dict(state_dict, version)`` so a rollout worker can
follow the learner without rebuilding its engine; ``version`` is stamped on every record it makes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch


class FinishReason(StrEnum):
    """Why a generation stopped."""

    STOP = "stop"  # the model emitted EOS (included as the last token)
    LENGTH = "length"  # max_new_tokens reached without EOS


@dataclass(kw_only=True, slots=True)
class Generation:
    """One sampled continuation of one prompt."""

    token_ids: list[int]  # [n_response] exactly the sampled ids, up to and including EOS
    logprobs: list[float]  # [n_response] log-prob of each id under the distribution sampled from
    finish_reason: FinishReason

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def request_seed(seed: int, index: int) -> int:
    """A distinct, reproducible seed per request of one ``generate`` call (fits in int64)."""
    return (seed * 1_000_003 + index) % (2**63 - 1)


def request_seeds(n: int, seed: int | None, seeds: list[int] | None) -> list[int]:
    """The per-request seeds of a call: ``seeds`` as given, or derived from ``seed``."""
    if seeds is not None:
        if len(seeds) != n:
            raise ValueError(f"{len(seeds)} seeds for {n} prompts")
        return [int(s) for s in seeds]
    return [request_seed(seed, i) for i in range(n)]


def check_sampling(temperature: float, top_p: float) -> None:
    """ValueError unless ``temperature`` and ``top_p`` name a distribution an engine samples from."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def check_prompts(
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    max_prompt_len: int | None = None,
    max_len: int | None = None,
    max_len_is: str = "",
) -> None:
    """What every engine checks of the prompts of a call before it samples, a ValueError naming
    the prompt: at least one new token, no empty prompt, none longer than ``max_prompt_len``, and
    room for ``max_new_tokens`` within ``max_len`` tokens in all (``max_len_is``: what that limit
    is and how to get under it, for the message)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        if n == 0:
            raise ValueError(f"prompt {i} is empty")
        if max_prompt_len is not None and n > max_prompt_len:
            raise ValueError(
                f"prompt {i} has {n} tokens, more than max_prompt_len={max_prompt_len}; "
                "shorten the history (history_length) or raise max_prompt_len"
            )
        if max_len is not None and n + max_new_tokens > max_len:
            raise ValueError(f"prompt {i} has {n} tokens; with max_new_tokens={max_new_tokens} it exceeds {max_len_is}")


class GenerationEngine(abc.ABC):
    """A batched sampler over token ids with in-place weight updates."""

    @abc.abstractmethod
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
        """Sample one continuation per prompt, in prompt order.

        ``temperature == 0`` means greedy decoding; then ``logprobs`` are ``log_softmax`` of the
        raw logits. Each request is sampled with its own seed: ``seeds[i]``, or
        ``request_seed(seed, i)``; a request's tokens then depend on its prompt, seed, weights and
        settings, not on the other requests of the batch (up to the float rounding of different
        batch shapes). ``seed=seeds=None`` draws from the process's global RNG. A prompt too long
        for the model raises ``ValueError``; nothing is truncated.
        """

    @abc.abstractmethod
    def load_state_dict(self, state_dict: Mapping[str, "torch.Tensor"], version: int) -> None:
        """Copy ``state_dict`` into the live weights (strict key match) and set ``version``."""

    # An engine keeps both in these attributes; ``load_state_dict`` sets ``_version``.
    _version: int = 0
    _tokenizer: Any = None

    @property
    def version(self) -> int:
        """Weights version the next generation will be sampled with (0 before any sync)."""
        return self._version

    @property
    def tokenizer(self) -> Any:
        """The tokenizer matching the engine's vocabulary (chat template included)."""
        return self._tokenizer

    # Engines that can also be the teacher (scorer.placement=engine) say so and score.
    can_score: bool = False

    def score(
        self, items: list[tuple[list[int], list[int]]], *, temperature: float, micro_batch_tokens: int | None
    ) -> list[list[float]]:
        """Per-token log-probs of each (prompt ids, response ids) under the live weights, at
        ``temperature`` (what ``pipeline.algorithm.logprobs.score_responses`` computes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot score prompts (scorer.placement=engine)")

    def score_teacher(self, items, plain, needs, *, temperature: float, micro_batch_tokens: int | None):
        """``pipeline.algorithm.logprobs.score_teacher`` on the live weights: a ``TeacherOutput``
        (no version). This default serves needs of the sampled tokens' log-probs alone (items and
        plain items scored together); an engine that can take the whole distribution overrides it."""
        from pipeline.core.types import TeacherOutput

        if needs.whole_distribution:
            raise NotImplementedError(
                f"{type(self).__name__} scores the sampled tokens only, not the teacher's whole distribution "
                "(a top-k support or a channel of the signal): use the HF engine"
            )
        lps = self.score(list(items) + list(plain), temperature=temperature, micro_batch_tokens=micro_batch_tokens)
        return TeacherOutput(logprobs=lps[: len(items)], plain_logprobs=lps[len(items) :] if plain else None)
