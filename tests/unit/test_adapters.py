"""Adapters: privy envs behind gymnasium / skyrl-gym interfaces, and gymnasium text envs as privy envs."""

from __future__ import annotations

import string

import gymnasium as gym
import pytest

from envs import make_env
from envs.adapters import (
    FromGymnasium,
    GymnasiumTextEnv,
    SkyRLTextEnv,
    register_gymnasium,
)
from envs.keyword import KeywordEnv


class CountdownText(gym.Env):
    """A tiny text gymnasium env: say the secret word; every other word is a wrong guess (never truncates)."""

    def __init__(self, words=("red", "blue", "green")):
        self.words = words
        self.observation_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = self.words[int(self.np_random.integers(len(self.words)))]
        return "Guess the colour.", {"task": "Guess the colour.", "admissible_actions": list(self.words)}

    def step(self, action):
        hit = action.strip() == self.secret
        valid = action.strip() in self.words
        return (
            ("Correct!" if hit else "Wrong."),
            float(hit),
            hit,
            False,
            {"action_valid": valid, "admissible_actions": list(self.words)},
        )


if "test/Countdown-v0" not in gym.registry:
    gym.register(id="test/Countdown-v0", entry_point=CountdownText)


def _keyword_answer(env: GymnasiumTextEnv) -> str:
    word = env.privy_env._word
    return f"<answer>{word}</answer>"


def test_gymnasium_wrapper_reset_and_step_round_trip_on_keyword():
    env = GymnasiumTextEnv("keyword", {}, "train")
    obs, info = env.reset(seed=3)
    assert obs == make_env("keyword", {}, "train").reset(3).text
    assert info["task_seed"] == 3 and info["messages"][-1]["content"] == obs and info["admissible_actions"] == []
    _, reward, terminated, truncated, info = env.step(_keyword_answer(env))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["won"] and info["action_valid"]
    assert {c["criterion"] for c in info["criteria"]} == {"keyword", "format", "brevity"}
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("again")
    env.reset(seed=4)  # a new episode on a fresh privy env
    _, reward, terminated, _, info = env.step("no idea")
    assert terminated and not info["won"] and reward < 1.0


def test_gymnasium_wrapper_flags_truncation_when_max_turns_pass_without_done():
    env = GymnasiumTextEnv("gym_text", {"env_id": "test/Countdown-v0", "max_turns": 10}, "train", max_turns=2)
    env.reset(seed=0)
    out1 = env.step("purple")
    assert out1[2:4] == (False, False) and not out1[4]["action_valid"]
    out2 = env.step("purple")
    assert out2[2:4] == (False, True)  # truncated, not terminated


def test_register_gymnasium_makes_privy_ids():
    env_id = register_gymnasium("keyword")
    assert env_id == "privy/keyword-v0" and register_gymnasium("keyword") == env_id
    env = gym.make(env_id, options={"n_tasks": 5}, split="valid")
    obs, info = env.reset(seed=1)
    assert "Reply with the word" in obs
    *_, info = env.step("x")
    assert not info["won"]


def test_skyrl_interface_on_keyword_init_step_metrics():
    env = SkyRLTextEnv(extras={"env": "keyword", "options": {}, "split": "train", "seed": 3})
    prompt, meta = env.init([{"role": "system", "content": "be brief"}, {"role": "user", "content": "ignored"}])
    assert prompt[0] == {"role": "system", "content": "be brief"} and prompt[-1]["role"] == "user"
    assert "Reply with the word" in prompt[-1]["content"] and meta["task_id"]
    word = env.env._word
    out = env.step(f"<answer>{word}</answer>")
    assert set(out) == {"observations", "reward", "done", "metadata", "postprocessed_action"}
    assert out["done"] and out["observations"] == [] and out["reward"] == 1.0 and out["metadata"]["won"]
    metrics = env.get_metrics()
    assert metrics["won"] == 1.0 and metrics["criterion/format"] == 1.0 and metrics["turns"] == 1
    env.close()


def test_skyrl_interface_multi_turn_observations_and_max_turns():
    env = SkyRLTextEnv(extras={"max_turns": 2}, env=FromGymnasium("test/Countdown-v0"))
    prompt, meta = env.init([])
    assert prompt[-1]["content"].startswith("Guess the colour.") and meta["admissible_actions"]
    out = env.step("purple")
    assert not out["done"] and out["observations"][0]["role"] == "user"
    assert "Wrong." in out["observations"][0]["content"] and not out["metadata"]["action_valid"]
    out = env.step("purple")
    assert out["done"] and env.get_metrics()["invalid_actions"] == 2


def test_from_gymnasium_wraps_a_text_env_as_privy_env_and_wins():
    env = make_env("gym_text", {"env_id": "test/Countdown-v0", "max_turns": 5}, "train")
    assert isinstance(env, FromGymnasium)
    obs = env.reset(seed=7)
    assert obs.text == "Guess the colour." and obs.admissible_actions == ["red", "blue", "green"]
    secret = env.gym_env.unwrapped.secret
    wrong = next(w for w in obs.admissible_actions if w != secret)
    res = env.step(wrong)
    assert not res.done and not res.won and res.action_valid
    assert "[Action] " + wrong in env.build_messages([(obs.text, wrong)], res.observation, 2)[0].content
    res = env.step(f"  {secret} ")
    assert res.done and res.won and res.reward == 1.0 and res.criteria[0].passed


def test_from_gymnasium_stops_at_max_turns_and_checks_options():
    env = FromGymnasium(CountdownText(), max_turns=1)
    env.reset(seed=0)
    res = env.step("purple")
    assert res.done and not res.won and not res.action_valid and not res.criteria[0].passed
    with pytest.raises(ValueError, match="env_id"):
        make_env("gym_text", {}, "train")
    with pytest.raises(ValueError, match="unknown gym_text option"):
        make_env("gym_text", {"env_id": "x", "bogus": 1}, "train")


def test_round_trip_privy_to_gymnasium_to_privy_keeps_the_episode():
    env_id = register_gymnasium("keyword")
    back = FromGymnasium(env_id)
    direct = KeywordEnv.from_options({}, "train")
    assert back.reset(seed=11).text == direct.reset(11).text
    res = back.step(f"<answer>{direct._word}</answer>")
    assert res.done and res.won and res.reward == 1.0
