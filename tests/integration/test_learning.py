"""Learning happens: SmolLM2-135M-Instruct improves its reward and its task success on the easy
keyword task with GRPO (real Ray actors, DeepSpeed learner, HF engine)."""
import statistics

import pytest

from pipeline.tools.cli import compose
from pipeline.orchestration.run import run_training

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STEPS = 14


def test_smollm2_grpo_raises_reward_on_the_keyword_task(ray_local, tmp_path):
    cfg = compose(["env=keyword", f"trainer.total_steps={STEPS}", "trainer.val_every=0",
                   "trainer.ckpt_every=0", "rollout.max_new_tokens=24", "rollout.group_size=8",
                   "trainer.groups_per_step=2", "learner.lr=5e-5", "logger.progress=false"])
    history = run_training(cfg, tmp_path)
    rewards = [h["rollout/reward"] for h in history]
    first = statistics.fmean(rewards[:3])
    last = statistics.fmean(rewards[-3:])
    success = [h["rollout/success"] for h in history]  # all three criteria passed: the task solved
    print("rewards per step:", [round(r, 3) for r in rewards])
    print("success per step:", [round(r, 3) for r in success])
    # The base model passes about 1 in 6 criteria at temperature 1; GRPO learns short replies
    # that name the word (measured: 0.19 at step 1 to 0.5 by step 9). Demand a clear rise, well
    # above the step-to-step noise of 16 episodes per step.
    assert last >= first + 0.15, rewards
    assert statistics.fmean(success[-3:]) > statistics.fmean(success[:3]) + 0.1, success
