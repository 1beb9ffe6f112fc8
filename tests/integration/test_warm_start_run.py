"""The warm start for real: the DeepSpeed learner clones ALFWorld's expert (tiny model, small
scenes), the run trains from the cached checkpoint, and a second run reuses the cache."""
from __future__ import annotations

import json

import pytest

from pipeline.orchestration.run import run_training
from pipeline.orchestration.warm_start import warm_start_dir
from pipeline.models import resolve_model
from pipeline.tools.cli import compose

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_run_warm_starts_from_a_cached_clone_of_the_expert(ray_local, tmp_path, capfd):
    cfg = compose(["model=tiny", "env=alfworld", "env.options.max_receptacles=6", "env.options.max_objects=6",
                   "env.options.n_tasks=8", "env.options.max_turns=12", "env.options.action_format=tags",
                   f"+env.options.cache_dir={tmp_path / 'games'}", f"warm_start.cache_dir={tmp_path / 'clones'}",
                   "warm_start.enabled=true", "warm_start.tasks=4", "warm_start.epochs=3", "warm_start.lr=1e-3",
                   "warm_start.batch_rows=4", "trainer.total_steps=1", "trainer.groups_per_step=1",
                   "rollout.group_size=2", "trainer.val_every=0", "trainer.ckpt_every=0",
                   "rollout.max_new_tokens=24", "logger.progress=false"])
    target = warm_start_dir(cfg, resolve_model("tiny"))
    run_training(cfg, tmp_path / "run1")
    report = json.loads((target / "privy_model.json").read_text())
    assert report["won"] == report["episodes"] == 4 and report["rows"] == sum(report["expert_turns"])
    losses = report["loss_per_epoch"]
    # it learns the expert's responses (a random 2-layer model over 24 steps: 10.3, 9.6, 9.3 measured)
    assert losses[0] > losses[1] > losses[2] and losses[-1] < 0.95 * losses[0], losses
    assert "cloning the alfworld expert" in capfd.readouterr().err
    built = (target / "model.safetensors").stat().st_mtime

    run_training(cfg, tmp_path / "run2")
    assert "cloning" not in capfd.readouterr().err
    assert (target / "model.safetensors").stat().st_mtime == built
