"""RolloutWorker (plain class, no Ray) with the real HF engine on the tiny model: many groups in
flight, new weights landing mid-episode, and envs that raise or hang.

``steps3`` and the broken variants below are test envs (3 turns, any reply is valid): they stand in
for a real env only to script when an episode raises or hangs; the worker, batcher and engine
under them are the real ones.
"""
from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from actors.engines.hf import HFEngine
from actors.rollout import RolloutWorker
from envs.base import Observation, StepResult, TextEnv, register_env
from pipeline.algorithm.logprobs import response_logprobs
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.types import Message, StopReason
from pipeline.distributed.weight_sync import pack
from pipeline.models import load_model

pytestmark = pytest.mark.integration

PARITY_ATOL_FP32 = 1e-4  # as tests/integration/test_hf_engine.py


class _Steps(TextEnv):
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
        return Observation(text=f"Task {seed}: say anything.")

    def step(self, response):
        self.t += 1
        return StepResult(observation=Observation(text=f"Turn {self.t} done. Again."), reward=0.0,
                          done=self.t >= 3, won=self.t >= 3, action=response.strip()[:20], action_valid=True)

    @property
    def task_text(self):
        return f"Task {self.seed}"

    def build_messages(self, history, observation, history_length):
        msgs = [Message(role="user", content=f"Task {self.seed}: say anything.")]
        for _, act in history[-history_length:] if history_length else []:
            msgs += [Message(role="assistant", content=act or "."), Message(role="user", content="Again.")]
        return msgs


@register_env("steps3")
class Steps3(_Steps):
    pass


HANG = threading.Event()  # the hung step waits on it; the test releases it at the end


@register_env("steps3_broken")
class Steps3Broken(_Steps):
    """Instance 1 raises in its second step, instance 2 hangs in its first, instance 3 fails reset."""

    instances = itertools.count()

    def reset(self, seed):
        if self.n == 3:
            raise OSError("no such game file")
        return super().reset(seed)

    def step(self, response):
        if self.n == 1 and self.t == 1:
            raise ValueError("the engine crashed on this action")
        if self.n == 2:
            HANG.wait(60)
        return super().step(response)


@pytest.fixture(scope="module")
def v0_state(tiny_model_dir):
    return {k: v.clone() for k, v in load_model(tiny_model_dir, torch.float32, "cpu").state_dict().items()}


def _worker(tiny_model_dir, env: str, **rollout) -> RolloutWorker:
    cfg = RolloutConfig(max_new_tokens=6, precision="fp32", max_prompt_tokens=512, **rollout)
    return RolloutWorker(cfg, EnvConfig(name=env, history_length=1), str(tiny_model_dir),
                         engine=HFEngine.from_pretrained(tiny_model_dir))


def _play(worker, n_groups: int, group_size: int = 4):
    with ThreadPoolExecutor(n_groups) as pool:
        futs = [pool.submit(worker.run_group, task_seed=s, split="train", group_size=group_size,
                            temperature=1.0, sample_seed=100 + s) for s in range(n_groups)]
        return [f.result(timeout=300) for f in futs]


def test_groups_in_flight_share_generate_calls_and_each_turn_matches_the_learner_under_its_version(
        tiny_model_dir, v0_state):
    """Six groups x 4 episodes x 3 turns on one worker; new weights are queued during the second
    generate call, so turns sampled before and after the swap mix, within episodes too. Every
    turn's behaviour log-probs must equal the learner's forward under the weights of the version
    it recorded."""
    gen = torch.Generator().manual_seed(0)
    v1_state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                for k, v in v0_state.items()}
    v1_state["lm_head.weight"] = v1_state["model.embed_tokens.weight"]  # tied, as the learner sends them
    worker = _worker(tiny_model_dir, "steps3")
    sizes: list[int] = []
    real_generate = worker.engine.generate

    def generate(prompts, **kw):
        sizes.append(len(prompts))
        out = real_generate(prompts, **kw)
        if len(sizes) == 2:
            worker.set_weights(pack(v1_state, 1))  # lands before the third call
        return out

    worker.engine.generate = generate
    try:
        groups = _play(worker, 6)
    finally:
        worker.close()
    assert all(len(g.episodes) == 4 for g in groups)
    rows = [(e, t) for g in groups for e in g.episodes for t in e.turns]
    assert len(rows) == 6 * 4 * 3 and all(e.stop_reason is StopReason.WON for g in groups for e in g.episodes)
    assert max(sizes) > 4  # turns of several groups in one generate call
    assert len(sizes) < len(rows) / 4  # far fewer calls than one per group turn
    mixed = [e for g in groups for e in g.episodes if {t.policy_version for t in e.turns} == {0, 1}]
    assert mixed  # an episode that started under v0 finished under v1

    models = {}
    for version, sd in ((0, v0_state), (1, v1_state)):
        m = load_model(tiny_model_dir, torch.float32, "cpu")
        m.load_state_dict(sd)
        models[version] = m.eval()
    worst = 0.0
    for version, model in models.items():
        mine = [t for _, t in rows if t.policy_version == version]
        assert mine
        ref = response_logprobs(model, [t.prompt_ids for t in mine], [t.response_ids for t in mine], temperature=1.0)
        worst = max(worst, max((r - torch.tensor(t.behaviour_logprobs)).abs().max().item() for r, t in zip(ref, mine)))
    assert worst < PARITY_ATOL_FP32


def test_groups_in_lockstep_merge_into_one_call_per_turn(tiny_model_dir):
    """Groups that step their envs while the others generate would alternate for ever, one or two
    groups per call; waiting for the live episodes merges all four (from turn 2 at the latest)."""
    worker = _worker(tiny_model_dir, "steps3")
    sizes: list[int] = []
    real_generate = worker.engine.generate

    def generate(prompts, **kw):
        sizes.append(len(prompts))
        return real_generate(prompts, **kw)

    worker.engine.generate = generate
    try:
        _play(worker, 4)
    finally:
        worker.close()
    assert sum(sizes) == 4 * 4 * 3
    assert sizes[-1] == 16 and len(sizes) <= 5, sizes


def test_an_env_that_raises_or_hangs_fails_only_its_episode_and_the_worker_goes_on(tiny_model_dir):
    worker = _worker(tiny_model_dir, "steps3_broken", env_timeout_s=2.0)
    try:
        t0 = time.time()
        [group] = _play(worker, 1, group_size=5)
        assert not HANG.is_set() and time.time() - t0 < 60  # returned while the hung step still hangs
        # envs are built in parallel threads: find each scripted failure by what it says
        errors = sorted((e.error for e in group.episodes if e.error), key=lambda m: m.split(":")[0])
        assert len(errors) == 3 and all(e.stop_reason is StopReason.ERROR for e in group.episodes if e.error)
        assert any(m.startswith("env step") and "the engine crashed on this action" in m for m in errors)
        assert any(m.startswith("env step") and "rollout.env_timeout_s=2" in m for m in errors)
        assert any(m.startswith("env reset") and "no such game file" in m for m in errors)
        crashed = next(e for e in group.episodes if "crashed" in e.error)
        assert len(crashed.turns) == 1  # its first turn is kept
        healthy = [e for e in group.episodes if not e.error]
        assert len(healthy) == 2 and all(e.stop_reason is StopReason.WON and len(e.turns) == 3 for e in healthy)
        # the worker still plays: the next instances are healthy
        [again] = _play(worker, 1, group_size=2)
        assert all(e.stop_reason is StopReason.WON for e in again.episodes)
    finally:
        HANG.set()
        worker.close()
