"""Scripted text envs and a real rollout worker over them, shared by the rollout tests
(tests/integration/test_rollout_worker.py) and the env fault test (tests/faults/test_env_faults.py).
``steps3`` wins in three turns; ``steps3_broken`` raises, hangs and fails its reset on purpose."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

from actors.engines.hf import HFEngine
from actors.rollout import RolloutWorker
from envs.base import Observation, StepResult, TextEnv, register_env
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.types import Message


class ScriptedSteps(TextEnv):
    thread_safe = True
    max_turns = 3
    invalid_action_penalty = 0.0
    instances = itertools.count()

    def __init__(self):
        self.n = next(type(self).instances)  # which instance this is (scripts the broken ones)
        self.t = 0

    @classmethod
    def from_options(cls, options, split):
        return cls()

    def reset(self, seed):
        self.seed = seed
        self.task_text = f"Task {seed}"
        return Observation(text=f"Task {seed}: say anything.")

    def privileged_hint(self):
        return f"Task {self.seed} is won by any three replies."

    def step(self, response):
        self.t += 1
        return StepResult(
            observation=Observation(text=f"Turn {self.t} done. Again."),
            reward=0.0,
            done=self.t >= 3,
            won=self.t >= 3,
            action=response.strip()[:20],
            action_valid=True,
        )

    def build_messages(self, history, observation, history_length):
        msgs = [Message(role="user", content=f"Task {self.seed}: say anything.")]
        for _, act in history[-history_length:] if history_length else []:
            msgs += [Message(role="assistant", content=act or "."), Message(role="user", content="Again.")]
        return msgs


@register_env("steps3")
class Steps3(ScriptedSteps):
    pass


HANG = threading.Event()  # the hung step waits on it; the test releases it at the end


@register_env("steps3_broken")
class Steps3Broken(ScriptedSteps):
    """Instance 1 raises in its second step, instance 2 hangs in its first, instance 3 fails reset,
    instance 4 fails to write its privileged hint."""

    instances = itertools.count()

    def reset(self, seed):
        if self.n == 3:
            raise OSError("no such game file")
        return super().reset(seed)

    def privileged_hint(self):
        if self.n == 4:
            raise RuntimeError("the test sandbox could not start")
        return super().privileged_hint()

    def step(self, response):
        if self.n == 1 and self.t == 1:
            raise ValueError("the engine crashed on this action")
        if self.n == 2:
            HANG.wait(60)
        return super().step(response)


def rollout_worker(tiny_model_dir, env: str, prompt_format: str = "template", **rollout) -> RolloutWorker:
    rollout = {"max_prompt_tokens": 512, **rollout}
    cfg = RolloutConfig(max_new_tokens=6, precision="fp32", **rollout)
    return RolloutWorker(
        cfg,
        EnvConfig(name=env, history_length=1, prompt_format=prompt_format),
        str(tiny_model_dir),
        engine=HFEngine.from_pretrained(tiny_model_dir),
    )


def play(worker, n_groups: int, group_size: int = 4):
    with ThreadPoolExecutor(n_groups) as pool:
        futs = [
            pool.submit(
                worker.run_group,
                task_seed=s,
                split="train",
                group_size=group_size,
                temperature=1.0,
                sample_seed=100 + s,
            )
            for s in range(n_groups)
        ]
        return [f.result(timeout=300) for f in futs]
