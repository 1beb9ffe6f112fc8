"""A checkpoint's manifest: the size and SHA-256 of every file in it, written last.

A checkpoint is complete when its ``manifest.json`` exists and every file it lists is there with
that size and digest. The size catches a file cut short (a full disk, a save killed before its
data reached the disk, a copy that stopped half-way); the digest catches one changed in place
after the save (a few KB overwritten), which a truncation check alone would load silently.

Hashing reads the checkpoint back after it was written, and each file is synced to disk while it
is read, so the manifest is written only over bytes that are on disk (write, verify, publish).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
_BLOCK = 1 << 22


def _digest(path: Path, sync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
        if sync:  # durable before the manifest vouches for it
            os.fsync(f.fileno())
    return h.hexdigest()


def write_manifest(ckpt: Path, **info) -> Path:
    """Hash every file under ``ckpt`` and write ``manifest.json`` (durably, last)."""
    files = {
        str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "sha256": _digest(p, sync=True)}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    path = ckpt / MANIFEST
    with open(path, "w") as f:
        json.dump({**info, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    return path


def damage(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed (the file and what is wrong with it), or None when every
    file its manifest lists is there, whole and unchanged."""
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return f"{MANIFEST} is missing (the save did not finish)"
    except (ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    for name, want in files.items():  # sizes first: a truncation is found without reading anything
        p = ckpt / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, {want['bytes']} were saved (cut short)"
    for name, want in files.items():
        if _digest(ckpt / name) != want["sha256"]:
            return f"{name} changed after it was saved (its SHA-256 differs from the manifest's)"
    return None
