"""Checkpoints of a real run (the DeepSpeed learner's state, the HF model, the controller's state)
damaged on disk, then resumed through the public entry point.

* A file cut short (the DeepSpeed state file, ``hf/tokenizer.json``) or changed in place (4 KB of
  the optimizer state overwritten) is found against the checkpoint's manifest: ``resume`` passes
  the checkpoint over for the previous whole one, with one line naming the file and why. (It used
  to stop with ``PytorchStreamReader failed reading zip archive``, or to load silently.)
* An optimizer state damaged before its manifest vouched for it (``exp_avg_sq`` made negative:
  the next update's square root is NaN while its loss and gradients are finite) makes weights
  that are not finite: the weight sync refuses them, nothing is saved or marked latest, and the
  run stops naming the last checkpoint. (It used to save them as the next step and point latest
  at it, so that every resume failed.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_stop_signals import TINY, train

from pipeline.orchestration.checkpoint import resolve_checkpoint
from pipeline.orchestration.manifest import write_manifest

pytestmark = pytest.mark.integration

ARGS = [
    *[a for a in TINY if a != "trainer.ckpt_every=0"],
    "trainer.ckpt_every=1",
    "trainer.keep_checkpoints=5",
    "trainer.resume=auto",
]


def _train(run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    return train([*ARGS, f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir}"], run_dir.parent)


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> Path:
    """A run of 3 steps with a checkpoint after each (kept as it is: tests copy it)."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    r = _train(run_dir, 3)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _state_file(ckpt: Path) -> Path:
    """The largest file of the DeepSpeed state (ZeRO-0: the model and optimizer states)."""
    return max((p for p in (ckpt / "deepspeed").rglob("*.pt")), key=lambda p: p.stat().st_size)


def test_a_checkpoint_cut_short_or_changed_in_place_is_passed_over_for_the_previous_one(three_steps, tmp_path, capfd):
    # hf/tokenizer.json cut short, and 4 KB of the optimizer state overwritten in place
    for name, damage, why in [
        ("hf/tokenizer.json", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "cut short"),
        (None, lambda p: _overwrite(p, 4096), "changed after it was saved"),
    ]:
        run = _copy(three_steps, tmp_path / f"copy_{why.split()[0]}")
        ckpt = run / "checkpoints" / "step_000003"
        path = ckpt / name if name else _state_file(ckpt)
        damage(path)
        assert resolve_checkpoint(run).name == "step_000002"
        line = capfd.readouterr().err.strip().splitlines()[-1]
        assert f"checkpoint {ckpt} is not resumed: {path.relative_to(ckpt)}" in line and why in line, line
        assert line.endswith("resuming from step_000002"), line
    # the DeepSpeed state file cut short, resumed for real: the run goes on from step 2
    run = _copy(three_steps, tmp_path / "resumed")
    ckpt = run / "checkpoints" / "step_000003"
    state = _state_file(ckpt)
    with open(state, "r+b") as f:
        f.truncate(state.stat().st_size // 2)
    r = _train(run, 4)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint {ckpt} is not resumed: {state.relative_to(ckpt)} has" in r.stderr, r.stderr[-3000:]
    assert "trainer.resume=auto: continuing from" in r.stderr and "step_000002" in r.stderr
    assert _steps(run) == [1, 2, 3, 4]  # step 3 trained again, each step once
    assert (run / "checkpoints" / "damaged_step_000003").is_dir()  # kept aside, never taken for a checkpoint
    assert resolve_checkpoint(run).name == "step_000004"


def _overwrite(path: Path, n: int) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xff" * n)


def test_weights_that_turn_non_finite_are_never_saved_and_the_run_names_the_last_checkpoint(three_steps, tmp_path):
    run = _copy(three_steps, tmp_path / "run")
    ckpt = run / "checkpoints" / "step_000003"
    state = _state_file(ckpt)
    sd = torch.load(state, weights_only=False)
    opt = sd["optimizer"]["state"]
    for s in opt.values():
        s["exp_avg_sq"].fill_(-1.0)  # sqrt(-1): NaN in the next update; loss and gradients stay finite
    torch.save(sd, state)
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, step=3)  # damaged before the manifest vouched for it: it loads
    r = _train(run, 6)
    assert r.returncode == 1, r.stderr[-3000:]
    last = [x for x in r.stderr.splitlines() if x.startswith("privy-rl: ")][-1]
    assert last.startswith("privy-rl: NonFiniteWeights: the weights after step 4:"), last
    assert f"resume from the last checkpoint (step 3): trainer.resume={run}" in last, last
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert not (run / "checkpoints" / "step_000004").exists()
    assert _steps(run) == [1, 2, 3]  # step 4 is not logged as trained either
