"""The checkpoint manifest (pipeline/orchestration/manifest.py) with the real ``Checkpointer`` and a
FAKE learner save (files written as DeepSpeed and HF would); the real run's checkpoints damaged
on disk: tests/faults/test_checkpoint_damage.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.orchestration.buffer import GroupBuffer
from pipeline.orchestration.checkpoint import Checkpointer, resolve_checkpoint
from pipeline.orchestration.controller import ControllerState


class FakeLearner:
    async def save(self, d):
        (Path(d) / "deepspeed").mkdir(parents=True)
        (Path(d) / "deepspeed" / "model_states.pt").write_bytes(b"x" * 8192)
        (Path(d) / "hf").mkdir()
        (Path(d) / "hf" / "tokenizer.json").write_text(json.dumps({"vocab": list(range(500))}))


def _save(run: Path, step: int) -> Path:
    state = {
        "controller": dataclasses.asdict(ControllerState(step=step)),
        "buffer": GroupBuffer(groups_per_step=1, max_policy_lag=0).state_dict(),
        "method": {},
    }
    return asyncio.run(Checkpointer(run, keep=5).save(step, FakeLearner(), state))


def test_every_file_is_in_the_manifest_written_last(tmp_path):
    ckpt = _save(tmp_path, 1)
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert sorted(files) == ["controller.pt", "deepspeed/model_states.pt", "hf/tokenizer.json"]
    assert files["deepspeed/model_states.pt"]["bytes"] == 8192 and len(files["controller.pt"]["sha256"]) == 64


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda c: (c / "hf" / "tokenizer.json").write_text("{"), "hf/tokenizer.json has 1 bytes"),
        (lambda c: (c / "deepspeed" / "model_states.pt").unlink(), "deepspeed/model_states.pt is missing"),
        (lambda c: (c / "deepspeed" / "model_states.pt").write_bytes(b"y" * 8192), "changed after it was saved"),
        (lambda c: (c / "manifest.json").write_text("{"), "manifest.json is unreadable"),
    ],
)
def test_a_damaged_latest_falls_back_to_the_previous_whole_one_with_one_line(tmp_path, capsys, damage, why):
    _save(tmp_path, 1)
    damaged = _save(tmp_path, 2)
    damage(damaged)
    assert resolve_checkpoint(tmp_path).name == "step_000001"
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"privy-rl: checkpoint {damaged} is not resumed: ") and why in line, line
    assert line.endswith("resuming from step_000001")
    with pytest.raises(FileNotFoundError, match="cannot be resumed"):
        resolve_checkpoint(damaged)  # named itself: refused, not loaded
    # a resume sets it aside, so that no later save or prune takes it for a checkpoint
    assert resolve_checkpoint(tmp_path, set_aside=True).name == "step_000001"
    assert (tmp_path / "checkpoints" / "damaged_step_000002").is_dir() and not damaged.exists()
    assert "kept as damaged_step_000002" in capsys.readouterr().err


def test_no_whole_checkpoint_is_an_error_naming_why(tmp_path, capsys):
    only = _save(tmp_path, 1)
    (only / "deepspeed" / "model_states.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no whole checkpoint"):
        resolve_checkpoint(tmp_path)
    assert "no earlier checkpoint is whole" in capsys.readouterr().err


def test_a_checkpoint_saved_before_manifests_is_taken_as_it_is(tmp_path):
    old = tmp_path / "checkpoints" / "step_000003"
    old.mkdir(parents=True)
    (old / "controller.pt").write_bytes(b"")
    (tmp_path / "checkpoints" / "latest").write_text("step_000003")
    assert resolve_checkpoint(tmp_path) == old
