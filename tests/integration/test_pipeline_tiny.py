"""The whole pipeline with real Ray actors, a real DeepSpeed engine and the tiny model."""

import json
from pathlib import Path

import pytest
import torch

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = pytest.mark.integration

BASE = [
    "model=tiny",
    "env=keyword",
    "rollout.max_new_tokens=12",
    "rollout.group_size=4",
    "trainer.groups_per_step=2",
    "trainer.val_every=0",
    "logger.progress=false",
    "learner.lr=1e-4",
    # a hung call ends the run naming it, well inside the test's own timeout
    "learner.call_timeout_s=600",
    "rollout.group_timeout_s=600",
]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next(path.glob("*.safetensors"))))


@pytest.mark.parametrize("lag", [0, 1])
def test_tiny_run_trains_changes_weights_and_respects_the_lag(ray_local, tmp_path, tiny_model_dir, lag):
    cfg = compose(BASE + ["trainer.total_steps=3", f"trainer.max_policy_lag={lag}", "trainer.ckpt_every=0"])
    history = run_training(cfg, tmp_path)
    assert len(history) == 3
    assert all(torch.isfinite(torch.tensor(h["learner/loss"])) for h in history)
    assert max(h["rollout/policy_lag_max"] for h in history) <= lag
    assert history[-1]["buffer/consumed"] == 3 * 2  # every trained group, none dropped
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    before = _weights(tiny_model_dir)
    after = _weights(tmp_path / "checkpoints" / "step_000003" / "hf")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter moved after 3 optimizer steps"
    assert (tmp_path / "summary.json").exists()


def test_resume_from_a_checkpoint_reproduces_the_next_step(ray_local, tmp_path):
    full = run_training(
        compose(BASE + ["trainer.total_steps=3", "trainer.ckpt_every=2", "trainer.keep_checkpoints=5"]), tmp_path / "a"
    )
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    assert ckpt.exists()
    resumed = run_training(compose(BASE + ["trainer.total_steps=3", f"trainer.resume={ckpt}"]), tmp_path / "b")
    assert len(resumed) == 1
    a, b = full[-1], resumed[0]
    for key in (
        "rollout/reward",
        "rollout/response_tokens",
        "learner/loss",
        "policy/entropy",
        "policy/approx_kl_k3",
        "learner/grad_norm",
    ):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
