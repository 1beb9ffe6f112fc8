"""Phases and resumption: a method's first phase (RetireOPD trains its frozen teacher first),
``trainer.resume`` across the two phases, ``trainer.resume=auto`` and the metrics a resumed run
supersedes. ``train`` is ``run_training`` (passed in: this module is below it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.core.config import ConfigError, PrivyConfig

PHASE1_DIR = "phase1_teacher"


def phase_root(resume: str) -> Path:
    """The run directory of a resume target: a run dir, its checkpoints dir, or a checkpoint; a
    target inside a first phase (``RUN/phase1_teacher/...``) names its parent run."""
    p = Path(resume).resolve()
    for cand in (p, *p.parents):
        if cand.name == PHASE1_DIR:
            return cand.parent
    return p


def resume_phases(cfg: PrivyConfig, method, run_dir: Path, train: Callable) -> str | None:
    """``trainer.resume`` of a method with a first phase (RetireOPD): the checkpoint to resume the
    second phase from, or None when it must start fresh after the first phase has been finished
    (resumed from its own last checkpoint if it died, adopted as it is if it had completed)."""
    from pipeline.orchestration.checkpoint import resolve_checkpoint

    if method.prerequisite() is None:
        return cfg.trainer.resume
    root = phase_root(cfg.trainer.resume)
    try:
        return str(resolve_checkpoint(root, set_aside=True))  # the second phase has a checkpoint: continue it
    except FileNotFoundError:
        pass
    phase1 = root / PHASE1_DIR
    if not phase1.is_dir():
        raise ConfigError(
            f"trainer.resume={cfg.trainer.resume}: neither a checkpoint of this run nor of its "
            f"first phase ({phase1}) exists"
        )
    run_prerequisite(cfg, method, run_dir, train, resume_from=phase1)
    return None


def auto_resume(method, run_dir: Path) -> str | None:
    """``trainer.resume=auto``: the run dir when it holds a complete checkpoint (or, for a method
    with a first phase, that phase's directory), else None: a fresh start, whose old metrics
    (a run that died before its first checkpoint) are set aside. Says which on stderr."""
    from pipeline.orchestration.checkpoint import resolve_checkpoint

    try:
        found = str(resolve_checkpoint(run_dir, set_aside=True))
    except FileNotFoundError:
        found = (
            str(run_dir / PHASE1_DIR) if method.prerequisite() is not None and (run_dir / PHASE1_DIR).is_dir() else None
        )
    if found is None:
        print(f"privy-rl: trainer.resume=auto: no checkpoint in {run_dir}: starting fresh", file=sys.stderr, flush=True)
        supersede_metrics(run_dir, -1)
        return None
    print(f"privy-rl: trainer.resume=auto: continuing from {found}", file=sys.stderr, flush=True)
    return str(run_dir)


def supersede_metrics(run_dir: Path, step: int) -> None:
    """A resumed run trains again the steps after its checkpoint's ``step``: their lines move from
    metrics.jsonl to metrics.superseded.jsonl (kept, never mixed with the steps that count), so
    metrics.jsonl holds each step once, as an uninterrupted run's does."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep, drop = [], []
    for line in path.read_text().splitlines():
        if line.strip():
            (keep if json.loads(line).get("step", 0) <= step else drop).append(line)
    if not drop:
        return
    with open(run_dir / "metrics.superseded.jsonl", "a") as f:
        f.write("".join(x + "\n" for x in drop))
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def run_prerequisite(cfg: PrivyConfig, method, run_dir: Path, train: Callable, resume_from: Path | None = None) -> None:
    """Run the phase a method depends on (RetireOPD: train its teacher with skill_grpo), then hand
    the method the phase's final model and its last validation success rate. ``resume_from``: an
    earlier run's first-phase directory, continued from its last checkpoint (or adopted whole
    when it had finished)."""
    import copy

    from pipeline.orchestration.checkpoint import resolve_checkpoint

    pre = method.prerequisite()
    if pre is None:
        return
    cfg1 = copy.deepcopy(cfg)
    cfg1.method = pre
    cfg1.trainer.total_steps = method.prerequisite_steps()
    cfg1.trainer.resume = None
    cfg1.trainer.run_dir = None
    # The teacher is chosen on valid (its success there is SR_T): the test split is read once, at
    # the end of the run that reports it, never by a first phase.
    cfg1.trainer.final_val_splits = []
    if cfg1.trainer.val_every == 0:
        raise ConfigError(
            f"method={method.name} measures its teacher's success rate by validation: set trainer.val_every > 0"
        )
    final = f"step_{cfg1.trainer.total_steps:06d}"
    if resume_from is not None:
        try:
            ckpt = resolve_checkpoint(resume_from, set_aside=True)
        except FileNotFoundError:
            ckpt = None  # it died before its first checkpoint: train it again
        done = method.finished_prerequisite(ckpt / "hf") if ckpt is not None and ckpt.name == final else None
        if done is not None:  # it had finished: adopt it as it is
            method.adopt_prerequisite(str(ckpt / "hf"), done)
            return
        cfg1.trainer.resume = str(ckpt) if ckpt is not None else None
    phase_dir = run_dir / PHASE1_DIR
    history = train(cfg1, phase_dir)
    success = [h["val/success"] for h in history if "val/success" in h]
    hf_dir = phase_dir / "checkpoints" / final / "hf"
    method.adopt_prerequisite(str(hf_dir), success[-1])
