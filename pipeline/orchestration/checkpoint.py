"""Checkpoints: learner state (DeepSpeed + HF model) and everything the controller needs to
continue exactly: its counters, the buffered groups, the method's controller state and the RNGs.

Layout: ``RUN/checkpoints/step_000010/{deepspeed/, hf/, controller.pt}`` and
``RUN/checkpoints/latest`` naming the newest complete one. A process killed at any point of a save
never leaves ``latest`` naming a partial checkpoint:

* the checkpoint is written into a temporary directory, ``controller.pt`` last, and renamed when
  complete (a directory rename is atomic);
* ``latest`` is replaced atomically (written beside it, then ``os.replace``);
* re-saving a step moves the old copy aside before the rename, and ``resolve_checkpoint`` falls back
  to the newest complete ``step_*`` when ``latest`` names one that is missing or incomplete.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 2, extra_state: dict | None = None):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.extra_state = extra_state or {}

    async def save(self, controller, step: int) -> Path:
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        await controller.learner.save(str(tmp))
        state = {
            "controller": dataclasses.asdict(controller.state),
            "buffer": controller.buffer.state_dict(),
            "method": controller.method.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
            **self.extra_state,
        }
        _durable_save(state, tmp / "controller.pt")  # last: its presence marks a complete checkpoint
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


def _complete(ckpt: Path) -> bool:
    return (ckpt / "controller.pt").is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir, or a run dir / checkpoints dir whose ``latest`` names one (or, if that one
    is missing or incomplete, the newest complete ``step_*``)."""
    p = Path(path)
    for cand in (p, p / "checkpoints"):
        if _complete(cand):
            return cand
        if (cand / "latest").exists():
            named = cand / (cand / "latest").read_text().strip()
            if named.name and _complete(named):
                return named
            steps = sorted(s for s in cand.glob("step_*") if _complete(s))
            if steps:
                return steps[-1]
    raise FileNotFoundError(f"resume={path}: no checkpoint there (expected controller.pt or checkpoints/latest)")


def load_state(ckpt: Path) -> dict:
    state = torch.load(ckpt / "controller.pt", weights_only=False)
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state
