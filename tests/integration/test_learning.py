"""Learning happens: SmolLM2-135M-Instruct improves its reward on the easy keyword task with GRPO
(real Ray actors, DeepSpeed learner, HF engine).

Task success (all three criteria) is asserted from a warm start in test_learning_warm_start.py.
From the instruct model it depends on the CPU: on a Xeon with AMX it rose within 14 steps, on an
AMD EPYC with avx512_bf16 (no AMX) the same seed settled on two of the three criteria (reward
0.17 -> 0.67, success 0 at every step)."""

import statistics

import pytest

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STEPS = 14


def test_smollm2_grpo_raises_reward_on_the_keyword_task(ray_local, tmp_path):
    cfg = compose(
        [
            "env=keyword",
            f"trainer.total_steps={STEPS}",
            "trainer.val_every=0",
            "trainer.ckpt_every=0",
            "rollout.max_new_tokens=24",
            "rollout.group_size=8",
            "trainer.groups_per_step=2",
            "learner.lr=5e-5",
            "logger.progress=false",
        ]
    )
    history = run_training(cfg, tmp_path)
    rewards = [h["rollout/reward"] for h in history]
    first = statistics.fmean(rewards[:3])
    last = statistics.fmean(rewards[-3:])
    print("rewards per step:", [round(r, 3) for r in rewards])
    # The base model passes about 1 in 6 criteria at temperature 1; GRPO learns short replies
    # that name the word (measured: 0.19 at step 1 to 0.5 by step 9). Demand a clear rise, well
    # above the step-to-step noise of 16 episodes per step.
    assert last >= first + 0.15, rewards
