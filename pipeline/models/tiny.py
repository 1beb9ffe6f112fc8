"""Tiny random Llamas for tests: SmolLM2's tokenizer (``tiny``) or a 259-token byte tokenizer.

``tiny`` (vocab ``"smollm2"``) borrows SmolLM2's tokenizer and chat template, so building it runs
``ensure_smollm2`` first. ``tiny_bytes`` needs nothing from the network: a byte-level tokenizer
with SmolLM2's special tokens and a ChatML template, for tests where the real vocabulary does not
matter (its [B, T, V] logits are 190x smaller).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.models.cache import MARKER, build_lock, cache_root, is_complete, publish
from pipeline.models.smollm2 import ensure_smollm2

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

TINY_VOCABS = ("smollm2", "bytes")

# A ChatML template equivalent to SmolLM2's (same default system prompt), for the byte tokenizer.
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # SmolLM2's ids 0, 1, 2 (unk, bos, eos)


def byte_tokenizer() -> "PreTrainedTokenizerBase":
    """A byte-level BPE tokenizer without merges: 256 byte tokens after SmolLM2's 3 special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = list(_BYTE_SPECIALS)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=_CHATML_TEMPLATE,
    )


def _tiny_config(vocab_size: int, tok: "PreTrainedTokenizerBase") -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        # head_dim 32: the smallest the CPU attention kernels of vLLM accept (16 is refused).
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        rope_theta=100_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    vocab: str = "smollm2",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Build (once) a random 2-layer Llama (hidden 64, 2 heads of 32 / 1 KV head, tied embeddings).

    ``vocab="smollm2"``: SmolLM2's tokenizer and chat template (49,152 ids, 3.3 M parameters);
    needs ``ensure_smollm2(cache_dir)`` and runs it. ``vocab="bytes"``: a 259-token byte tokenizer
    with the same special tokens and a ChatML template (0.14 M parameters); needs nothing.
    The same ``seed`` gives bit-identical weights. Returns ``out_dir``, untouched if it already
    holds a complete build of the same seed and vocab (another one raises ``FileExistsError``).
    """
    if vocab not in TINY_VOCABS:
        raise ValueError(f"vocab={vocab!r} is not one of {TINY_VOCABS}")
    target = Path(out_dir).expanduser()
    if is_complete(target):
        return _check_tiny_build(target, seed, vocab)
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    with build_lock(target):
        if is_complete(target):
            return _check_tiny_build(target, seed, vocab)
        if vocab == "smollm2":
            tok = AutoTokenizer.from_pretrained(ensure_smollm2(cache_dir))
        else:
            tok = byte_tokenizer()
        t0 = time.perf_counter()
        # Exactly len(tok) rows: a random model samples every id, so none may be undecodable.
        config = _tiny_config(len(tok), tok)
        tok.model_max_length = config.max_position_embeddings
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).to(torch.float32)
        model.generation_config.bos_token_id = tok.bos_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            stage = Path(tmp) / "stage"
            model.save_pretrained(stage)
            tok.save_pretrained(stage)
            info = {
                "name": f"tiny ({vocab})",
                "seed": seed,
                "vocab": vocab,
                "n_params": sum(p.numel() for p in model.parameters()),
                "seconds": round(time.perf_counter() - t0, 2),
            }
            publish(stage, target, info)
    return target


def _check_tiny_build(target: Path, seed: int, vocab: str) -> Path:
    info = json.loads((target / MARKER).read_text())
    if (info.get("seed"), info.get("vocab")) != (seed, vocab):
        raise FileExistsError(
            f"{target} holds a tiny model with seed={info.get('seed')}, vocab={info.get('vocab')!r}, "
            f"not seed={seed}, vocab={vocab!r}; pick another out_dir"
        )
    return target


def tiny_model_dir(vocab: str = "smollm2", seed: int = 0, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``build_tiny_model`` caches the tiny model of this vocabulary and seed."""
    return cache_root(cache_dir) / "models" / f"tiny-llama-{vocab}-h32-s{seed}"
