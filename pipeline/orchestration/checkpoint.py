"""Checkpoints: learner state (DeepSpeed + HF model) and everything the controller needs to
continue exactly: its counters, the buffered groups, the method's controller state and the RNGs.

Layout: ``RUN/checkpoints/step_000010/{deepspeed/, hf/, controller.pt, manifest.json}`` and
``RUN/checkpoints/latest`` naming the newest complete one. A partial or damaged checkpoint is never
taken for complete:

* the checkpoint is written into a temporary directory, then read back: every file's size and
  SHA-256 go into ``manifest.json``, written last (``manifest.py``), and the directory is renamed
  (a directory rename is atomic);
* ``latest`` is replaced atomically (written beside it, then ``os.replace``);
* re-saving a step moves the old copy aside before the rename;
* ``resolve_checkpoint`` checks the checkpoint it would resume against its manifest (a file
  missing, cut short or changed in place) and falls back to the newest ``step_*`` that is whole,
  saying which file of which checkpoint it passed over and why. A resume sets the damaged one
  aside (``damaged_step_*``) so that no later save or prune counts it as a checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline.orchestration.manifest import MANIFEST, damage, write_manifest


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 2, extra_state: dict | None = None):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.extra_state = extra_state or {}

    async def save(self, step: int, learner, run_state: dict) -> Path:
        """``learner`` saves its state into the checkpoint; ``run_state`` is the rest of the run's
        (``controller``, ``buffer``, ``method``: plain dicts), stored with the RNGs."""
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        await learner.save(str(tmp))
        state = {
            **run_state,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
            **self.extra_state,
        }
        _durable_save(state, tmp / "controller.pt")
        write_manifest(tmp, step=step)  # last: read back and vouched for, file by file
        old = self.root / f".old_step_{step:06d}"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        _atomic_write(self.root / "latest", final.name)
        shutil.rmtree(old, ignore_errors=True)
        self._prune()
        return final

    def _prune(self) -> None:
        """Keep the newest ``keep`` checkpoints; drop what killed saves left behind (each up to a
        whole checkpoint: a save only ends here once every earlier one is complete or gone)."""
        steps = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for old in steps[: max(0, len(steps) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in [*self.root.glob(".tmp_step_*"), *self.root.glob(".old_step_*")]:
            shutil.rmtree(stale, ignore_errors=True)


def _durable_save(obj, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _saved(ckpt: Path) -> bool:
    """Whether ``ckpt`` claims to be a whole checkpoint: a manifest (or, saved before manifests,
    ``controller.pt``, which was written last)."""
    return (ckpt / MANIFEST).is_file() or (ckpt / "controller.pt").is_file()


_verdicts: dict[tuple[str, int], str | None] = {}  # a checkpoint is read whole once per process


def _whole(ckpt: Path) -> str | None:
    """None when ``ckpt`` can be resumed, else why not. A checkpoint saved before manifests is
    taken as it is."""
    manifest = ckpt / MANIFEST
    if not manifest.is_file():
        return None if (ckpt / "controller.pt").is_file() else "incomplete (the save did not finish)"
    key = (str(ckpt.resolve()), manifest.stat().st_mtime_ns)
    if key not in _verdicts:
        _verdicts[key] = damage(ckpt)
    return _verdicts[key]


def _candidates(root: Path) -> list[Path]:
    """The checkpoints of ``root`` (a checkpoints dir) to try, best first: the one ``latest``
    names, then every ``step_*`` that claims to be whole, newest first."""
    steps = sorted((s for s in root.glob("step_*") if s.is_dir() and _saved(s)), reverse=True)
    named = (root / "latest").read_text().strip() if (root / "latest").exists() else ""
    first = [root / named] if named and (root / named).is_dir() else []
    return first + [s for s in steps if s not in first]


def resolve_checkpoint(path: str | Path, set_aside: bool = False) -> Path:
    """A checkpoint dir, or a run dir / checkpoints dir whose ``latest`` names one. A checkpoint
    that is missing, incomplete or damaged is passed over for the newest whole one, with one line
    naming the file and why; ``set_aside`` (a resume): it is renamed ``damaged_step_*``, so that no
    later save or prune takes it for a checkpoint."""
    p = Path(path)
    if _saved(p):  # a checkpoint itself: resumed only when whole
        why = _whole(p)
        if why is not None:
            raise FileNotFoundError(f"resume={path}: this checkpoint cannot be resumed: {why}")
        return p
    for root in (p, p / "checkpoints"):
        passed: list[tuple[Path, str]] = []
        for cand in _candidates(root):
            why = _whole(cand)
            if why is None:
                _say_passed_over(passed, cand, set_aside)
                return cand
            passed.append((cand, why))
        if passed:
            _say_passed_over(passed, None, set_aside)
            raise FileNotFoundError(f"resume={path}: no whole checkpoint in {root} (see above)")
    raise FileNotFoundError(f"resume={path}: no checkpoint there (expected controller.pt or checkpoints/latest)")


def _say_passed_over(passed: list[tuple[Path, str]], chosen: Path | None, set_aside: bool) -> None:
    then = f"resuming from {chosen.name}" if chosen is not None else "no earlier checkpoint is whole"
    for ckpt, why in passed:
        aside = ckpt.with_name(f"damaged_{ckpt.name}")
        if set_aside:
            shutil.rmtree(aside, ignore_errors=True)
            ckpt.rename(aside)
        moved = f"; kept as {aside.name}" if set_aside else ""
        print(f"privy-rl: checkpoint {ckpt} is not resumed: {why}{moved}; {then}", file=sys.stderr, flush=True)


def load_state(ckpt: Path) -> dict:
    state = torch.load(ckpt / "controller.pt", weights_only=False)
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state
