"""The warm start for real: the DeepSpeed learner clones ALFWorld's expert (tiny model, small
scenes), the run trains from the cached checkpoint, a second run reuses the cache, and a third
(trainer.total_steps=0) only evaluates the clone on valid_seen and valid_unseen."""

from __future__ import annotations

import json

import pytest

from pipeline.models import resolve_model
from pipeline.orchestration.run import run_training
from pipeline.orchestration.warm_start import warm_start_dir
from pipeline.tools.cli import compose

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cfg_overrides(tmp_path) -> list[str]:
    return [
        "model=tiny",
        "env=alfworld",
        "env.options.max_receptacles=6",
        "env.options.max_objects=6",
        "env.options.n_tasks=8",
        "env.options.max_turns=12",
        "env.options.action_format=tags",
        f"+env.options.cache_dir={tmp_path / 'games'}",
        f"warm_start.cache_dir={tmp_path / 'clones'}",
        "warm_start.enabled=true",
        "warm_start.tasks=4",
        "warm_start.epochs=3",
        "warm_start.lr=1e-3",
        "warm_start.batch_rows=4",
        "trainer.total_steps=1",
        "trainer.groups_per_step=1",
        "rollout.group_size=2",
        "trainer.val_every=0",
        "trainer.ckpt_every=0",
        "rollout.max_new_tokens=24",
        "logger.progress=false",
    ]


def test_a_run_warm_starts_from_a_cached_clone_of_the_expert(ray_local, tmp_path, capfd):
    cfg = compose(cfg_overrides(tmp_path))
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

    evaluate = [
        "trainer.total_steps=0",
        "trainer.val_at_start=true",
        "trainer.val_tasks=2",
        "trainer.final_val_splits=[valid_unseen]",
        "rollout.val_temperatures=[0.0]",
    ]
    cfg0 = compose([*cfg_overrides(tmp_path), *evaluate])
    assert warm_start_dir(cfg0, resolve_model("tiny")) == target
    assert run_training(cfg0, tmp_path / "eval") == []
    assert "cloning" not in capfd.readouterr().err
    [row] = [json.loads(line) for line in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 0 and {"val/success", "final/valid_unseen/success"} <= set(row)
    assert row["val/greedy/turns_per_episode"] > 0 and row["final/valid_unseen/greedy/turns_per_episode"] > 0
    assert not (tmp_path / "eval" / "checkpoints").exists() or not any((tmp_path / "eval" / "checkpoints").iterdir())
