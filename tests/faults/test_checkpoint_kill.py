"""A process SIGKILLed at any point of a checkpoint save never leaves ``latest`` naming a partial
checkpoint: the real ``Checkpointer`` runs in a child process that kills itself at the chosen
point (the learner's save is a FAKE that writes files as DeepSpeed would; the controller state is
real), then the parent resolves and loads what is on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.orchestration.checkpoint import load_state, resolve_checkpoint

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, dataclasses, os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import pipeline.orchestration.checkpoint as ck
from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.controller import ControllerState

run, point = Path(sys.argv[1]), sys.argv[2]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)

class FakeLearner:  # writes a DeepSpeed-like tree; may die half-way through it
    async def save(self, d):
        (Path(d) / "deepspeed").mkdir(parents=True)
        (Path(d) / "deepspeed" / "model_states.pt").write_bytes(b"x" * 4096)
        if self.dying and point == "learner_save":
            die()
        (Path(d) / "hf").mkdir()
        (Path(d) / "hf" / "model.safetensors").write_bytes(b"y" * 4096)

class Method:
    def state_dict(self):
        return {"gate": 1.0}

class Ctl:
    def __init__(self, step):
        self.learner, self.method = FakeLearner(), Method()
        self.learner.dying = False
        self.state = ControllerState(step=step, next_task=step)
        self.buffer = GroupBuffer(groups_per_step=1, max_policy_lag=0)

    def parts(self):  # what the controller hands the checkpointer: the learner and the run's state
        state = {"controller": dataclasses.asdict(self.state), "buffer": self.buffer.state_dict()}
        return self.learner, {**state, "method": self.method.state_dict()}

cp = ck.Checkpointer(run, keep=3)
asyncio.run(cp.save(1, *Ctl(1).parts()))            # a complete checkpoint at step 1
asyncio.run(cp.save(2, *Ctl(2).parts()))            # and at step 2
ctl = Ctl(3 if point != "resave" else 2)   # the save that dies (step 3, or step 2 once more)
ctl.learner.dying = True
if point == "after_state":                 # everything written, killed before the rename
    real = ck._durable_save
    ck._durable_save = lambda o, p: (real(o, p), die())
if point in ("resave", "before_latest"):   # "resave": between moving step 2 aside and the rename
    real_rename = Path.rename
    def rename(self, target):
        out = real_rename(self, target)
        if point == "resave" and Path(target).name.startswith(".old_"):
            die()
        return out
    Path.rename = rename
if point == "before_latest":
    ck._atomic_write = lambda p, t: die()
asyncio.run(cp.save(ctl.state.step, *ctl.parts()))
print("SURVIVED")
"""


@pytest.mark.parametrize("point,expect", [("learner_save", 2), ("after_state", 2), ("resave", 1), ("before_latest", 2)])
def test_a_kill_during_save_leaves_latest_on_a_complete_checkpoint(tmp_path, point, expect):
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(run), point, str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == -9 and "SURVIVED" not in r.stdout, r.stderr[-2000:]
    ckpt = resolve_checkpoint(run)
    assert ckpt.name == f"step_{expect:06d}"
    state = load_state(ckpt)
    assert state["controller"]["step"] == expect and state["method"] == {"gate": 1.0}
    assert (ckpt / "hf" / "model.safetensors").stat().st_size == 4096
    # The next complete save clears what the killed one left behind.
    _save(run, 9)
    assert resolve_checkpoint(run).name == "step_000009"
    assert not [*(run / "checkpoints").glob(".tmp_*"), *(run / "checkpoints").glob(".old_*")]


def _save(run, step: int) -> None:
    import asyncio
    import dataclasses

    from pipeline.orchestration.buffer import GroupBuffer
    from pipeline.orchestration.checkpoint import Checkpointer
    from pipeline.orchestration.controller import ControllerState

    class Learner:  # FAKE: writes one file where DeepSpeed would write its state
        async def save(self, d):
            (Path(d) / "deepspeed").mkdir(parents=True)

    class Method:
        def state_dict(self):
            return {}

    state = {
        "controller": dataclasses.asdict(ControllerState(step=step)),
        "buffer": GroupBuffer(groups_per_step=1, max_policy_lag=0).state_dict(),
        "method": Method().state_dict(),
    }
    asyncio.run(Checkpointer(run, keep=3).save(step, Learner(), state))


def test_a_latest_naming_a_missing_checkpoint_falls_back_to_the_newest_complete_one(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        (root / f"step_{step:06d}").mkdir(parents=True)
        (root / f"step_{step:06d}" / "controller.pt").write_bytes(b"")
    (root / "step_000003").mkdir()  # no controller.pt: incomplete
    (root / "latest").write_text("step_000004")
    assert resolve_checkpoint(tmp_path).name == "step_000002"
    (root / "latest").write_text("")
    assert resolve_checkpoint(tmp_path).name == "step_000002"
