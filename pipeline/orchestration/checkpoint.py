"""Checkpoints: learner state (DeepSpeed + HF model) and everything the controller needs to
continue exactly: its counters, the buffered groups, the method's controller state and the RNGs.

Layout: ``RUN/checkpoints/step_000010/{deepspeed/, hf/, controller.pt}`` and
``RUN/checkpoints/latest`` naming the newest complete one. A checkpoint is written into a temporary
directory and renamed when complete, so a crash mid-save never leaves a half checkpoint as latest.
"""
from __future__ import annotations

import dataclasses
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
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state()},
            **self.extra_state,
        }
        torch.save(state, tmp / "controller.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (self.root / "latest").write_text(final.name)
        self._prune()
        return final

    def _prune(self) -> None:
        steps = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for old in steps[: max(0, len(steps) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir, or a run dir / checkpoints dir whose ``latest`` names one."""
    p = Path(path)
    for cand in (p, p / "checkpoints"):
        if (cand / "controller.pt").exists():
            return cand
        if (cand / "latest").exists():
            return cand / (cand / "latest").read_text().strip()
    raise FileNotFoundError(f"resume={path}: no checkpoint there (expected controller.pt or "
                            "checkpoints/latest)")


def load_state(ckpt: Path) -> dict:
    state = torch.load(ckpt / "controller.pt", weights_only=False)
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state
