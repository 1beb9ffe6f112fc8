"""Every environment trains two steps end to end (real Ray actors, DeepSpeed, the tiny model)."""

import pytest

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = pytest.mark.integration

BASE = [
    "model=tiny",
    "rollout.max_new_tokens=8",
    "rollout.group_size=2",
    "trainer.groups_per_step=1",
    "trainer.total_steps=2",
    "trainer.val_every=2",
    "trainer.val_tasks=1",
    "rollout.val_temperatures=[0.0]",
    "trainer.ckpt_every=0",
    "logger.progress=false",
]

ENVS = {
    "alfworld": ["env.options.max_turns=2"],
    "webshop": ["+env.options.max_turns=2"],
    "search_qa": ["+env.options.max_turns=2"],
    "code_edit": ["+env.options.max_turns=2", "rollout.max_prompt_tokens=2000"],
}


@pytest.mark.parametrize("env", sorted(ENVS))
def test_env_trains_two_steps_with_the_tiny_model(ray_local, tmp_path, env):
    history = run_training(compose(BASE + [f"env={env}", *ENVS[env]]), tmp_path)
    assert len(history) == 2
    last = history[-1]
    assert last["rollout/turns_per_episode"] >= 1
    assert "val/success" in last
    assert last["learner/loss"] == last["learner/loss"]
