"""The ALFWorld env: generated games on ALFWorld's own engine, verl-agent's protocol and prompt.

Scenes are small (6 receptacles, 6 objects) so a game generates in about a second on 2 cores;
games are cached in one temporary directory for the whole session.
"""

from __future__ import annotations

import random
import sys

import pytest

from envs import make_env
from envs.alfworld import generator, prompts
from envs.alfworld.env import INVALID_OBSERVATION, AlfworldEnv, AlfworldOptions, task_for_seed
from envs.alfworld.generator import TASK_TYPES, SceneLimits, get_game, split_floorplans
from envs.base import Observation

SMALL = {"max_receptacles": 6, "max_objects": 6, "n_tasks": 60}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("alfworld-cache"))


@pytest.fixture
def make(cache_dir):
    envs: list[AlfworldEnv] = []

    def _make(split: str = "train", **overrides) -> AlfworldEnv:
        env = make_env("alfworld", {**SMALL, "cache_dir": cache_dir, **overrides}, split)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        env.close()


def act(command: str) -> str:
    return f"<think>the plan says {command}</think><action>{command}</action>"


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_each_task_type_generates_a_solvable_game_whose_expert_plan_wins(make, task_type):
    env = make(task_types=[task_type])
    obs = env.reset(seed=3)
    assert env.task_type == task_type and env.game.task_type == task_type
    assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert f"Your task is to: {env.task_text}" in obs.text
    assert not env.won  # the goal is false at reset
    assert "help" not in obs.admissible_actions and "look" in obs.admissible_actions
    plan = env.expert_plan()
    assert plan == list(env.game.walkthrough) and len(plan) >= 3
    for i, command in enumerate(plan):
        assert command in obs.admissible_actions
        result = env.step(act(command))
        obs = result.observation
        assert result.action_valid and result.action == command
        last = i == len(plan) - 1
        assert result.done is last and result.won is last
        assert result.reward == (10.0 if last else 0.0)
    assert [(c.criterion, c.passed) for c in result.criteria] == [("task_success", True)]


def test_planner_expert_replans_from_the_current_state(make):
    env = make(task_types=["pick_heat_then_place_in_recep"], expert=True)
    env.reset(seed=0)
    plan = env.expert_plan()
    for expected_left in range(len(plan) - 1, 0, -1):
        env.step(act(plan[0]))
        plan = env.expert_plan()
        assert len(plan) == expected_left
    assert env.step(act(plan[0])).won


GARBAGE = [
    "go to shelf 1",  # no tags
    "<think>hmm</think><action>fly to the moon</action>",  # parses, not admissible
    "<think>hmm</think><action>help</action>",  # ALFWorld knows it, but it is not offered
    "",
    "<think>" + "blah " * 20_000,
    "<think>a</think><action>look</action><action>inventory</action>",
    "<think>先去架子</think><action>look</action>",  # verl-agent rejects CJK
]


@pytest.mark.parametrize("response", GARBAGE, ids=["no-tags", "inadmissible", "help", "empty", "long", "dup", "cjk"])
def test_malformed_responses_are_invalid_and_leave_the_game_unchanged(make, response):
    env = make(task_types=["pick_and_place_simple"])
    first = env.reset(seed=1)
    result = env.step(response)
    assert not result.action_valid and result.info["invalid_reason"]
    assert result.reward == 0.0 and not result.done and not result.won
    assert result.observation.text == INVALID_OBSERVATION
    assert result.observation.admissible_actions == first.admissible_actions
    # The game is still at its initial state: the stored walkthrough wins from here.
    for command in env.expert_plan():
        result = env.step(act(command))
    assert result.won and result.reward == 10.0


def test_episode_ends_unsuccessfully_at_max_turns(make):
    env = make(task_types=["pick_two_obj_and_place"], max_turns=3)
    obs = env.reset(seed=0)
    results = [env.step(act("look")), env.step("nonsense"), env.step(act("inventory"))]
    assert [r.done for r in results] == [False, False, True]
    assert [r.action_valid for r in results] == [True, False, True]
    assert not results[-1].won and [(c.criterion, c.passed) for c in results[-1].criteria] == [("task_success", False)]
    assert results[0].observation.text.startswith("You are in the middle of a room")
    with pytest.raises(RuntimeError):
        env.step(act("look"))
    assert obs.admissible_actions


def test_same_seed_gives_the_same_game_and_generation_is_deterministic(make, tmp_path):
    a, b = make(), make(cache_dir=str(tmp_path))  # b generates from scratch elsewhere
    obs_a, obs_b = a.reset(seed=7), b.reset(seed=7)
    assert a.task_id == b.task_id and obs_a.text == obs_b.text
    assert obs_a.admissible_actions == obs_b.admissible_actions
    assert open(a.game.path).read() == open(b.game.path).read()
    c = make()
    c.reset(seed=8)
    assert c.task_id != a.task_id


def test_envs_of_one_group_play_independently_in_one_process(make):
    a, b = make(task_types=["pick_clean_then_place_in_recep"]), make(task_types=["pick_clean_then_place_in_recep"])
    a.reset(seed=4), b.reset(seed=4)
    plan = a.expert_plan()
    for command in plan[:-1]:
        a.step(act(command))
    assert b.step(act("look")).observation.text.startswith("You are in the middle of a room")
    assert a.step(act(plan[-1])).won and not b.won
    a.close()
    for command in b.expert_plan():  # b's game is untouched by a, and by a's engine going back to the pool
        result = b.step(act(command))
    assert result.won


def test_seeds_map_onto_a_pool_and_task_types_take_turns():
    opts = AlfworldOptions.from_dict({"n_tasks": 12, "task_types": ["pick_and_place_simple", "look_at_obj_in_light"]})
    assert task_for_seed(opts, "train", 5) == task_for_seed(opts, "train", 17) == ("look_at_obj_in_light", 2)
    assert task_for_seed(opts, "train", 4) == ("pick_and_place_simple", 2)
    default = AlfworldOptions()
    assert default.n_tasks_for("train") == 3553 and default.n_tasks_for("valid_unseen") == 134


def test_cached_games_are_not_regenerated(cache_dir, monkeypatch):
    limits = SceneLimits(max_receptacles=6, max_objects=6)
    first = get_game(limits, "train", "pick_cool_then_place_in_recep", 0, cache_dir)

    def fail(*args, **kwargs):
        raise AssertionError("regenerated a cached game")

    monkeypatch.setattr(generator, "_plan", fail)
    assert get_game(limits, "train", "pick_cool_then_place_in_recep", 0, cache_dir) == first


def test_cache_dir_defaults_under_privy_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVY_CACHE", str(tmp_path))
    assert generator.default_cache_dir() == str(tmp_path / "alfworld")


def test_unseen_split_uses_floor_plans_disjoint_from_training(make):
    train, seen, unseen = (set(split_floorplans(s)) for s in ("train", "valid_seen", "valid_unseen"))
    assert train == seen and len(train) == 96 and len(unseen) == 24
    assert not train & unseen
    for split, plans in (("valid_unseen", unseen), ("valid_seen", seen)):
        env = make(split)
        env.reset(seed=0)
        assert env.game.floorplan in plans and env.task_id.startswith(f"{split}/")


def test_random_admissible_policy_rarely_wins_within_a_few_steps(make):
    rng = random.Random(0)
    wins = 0
    for seed in range(6):
        env = make()
        obs = env.reset(seed=seed)
        for _ in range(4):
            result = env.step(act(rng.choice(obs.admissible_actions)))
            obs = result.observation
            wins += result.won
            if result.done:
                break
        env.close()
    assert wins <= 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_turn": 5}, "unknown alfworld option"),
        ({"task_types": ["pick_and_slice"]}, "task_types"),
        ({"task_types": []}, "task_types"),
        ({"max_objects": 2}, "max_objects"),
        ({"max_turns": 0}, "max_turns"),
        ({"n_tasks": -1}, "n_tasks"),
        ({"expert": "yes"}, "expert"),
        ({"n_floorplans": 1, "task_types": ["look_at_obj_in_light"]}, "n_floorplans"),
    ],
)
def test_bad_options_raise_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        make_env("alfworld", options, "train")


def test_unknown_split_raises():
    with pytest.raises(ValueError, match="split"):
        make_env("alfworld", {}, "test")


def test_validate_options_checks_every_split():
    AlfworldEnv.validate_options({"n_floorplans": 4})
    with pytest.raises(ValueError, match="n_floorplans"):
        AlfworldEnv.validate_options({"n_floorplans": 1})


def test_engine_leaves_sys_argv_alone(make, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "env=alfworld"])
    make(cache_dir=str(tmp_path)).reset(seed=2)  # a fresh game: Fast Downward translates it
    assert sys.argv == ["train.py", "env=alfworld"]


def test_env_reports_verl_agent_reward_constants():
    assert AlfworldEnv.success_reward == 10.0 and AlfworldEnv.invalid_action_penalty == 0.1


# ----- prompt ----------------------------------------------------------------------------------

OBS0 = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a shelf 1, and a sofa 1.\n\nYour task is to: put some watch on sofa."
)


def test_first_turn_prompt_shows_observation_and_admissible_actions_without_help():
    obs = Observation(text=OBS0, admissible_actions=["go to shelf 1", "go to sofa 1", "help", "look"])
    [msg] = prompts.build_messages([], obs, history_length=2)
    assert msg.role == "user"
    assert f"Your current observation is: {OBS0}\n" in msg.content
    assert "are: ['go to shelf 1'\n 'go to sofa 1'\n 'look']." in msg.content
    assert "'help'" not in msg.content
    assert "MUST be enclosed within <think> </think> tags" in msg.content
    assert "present it within <action> </action> tags" in msg.content


def test_later_prompt_shows_the_last_history_pairs_numbered_from_the_start():
    history = [
        (OBS0, "go to shelf 1"),
        ("You arrive at shelf 1. On the shelf 1, you see a watch 1.", "take watch 1 from shelf 1"),
        ("You pick up the watch 1 from the shelf 1.", "go to sofa 1"),
    ]
    obs = Observation(
        text="You arrive at sofa 1. On the sofa 1, you see nothing.", admissible_actions=["move watch 1 to sofa 1"]
    )
    [msg] = prompts.build_messages(history, obs, history_length=2)
    text = msg.content
    assert "Your task is to: put some watch on sofa.\n" in text
    assert "you have already taken 3 step(s). Below are the most recent 2 observations" in text
    assert (
        "[Observation 2: 'You arrive at shelf 1. On the shelf 1, you see a watch 1.', "
        "Action 2: 'take watch 1 from shelf 1']\n[Observation 3: " in text
    )
    assert "Observation 1:" not in text
    assert "You are now at step 4 and your current observation is: You arrive at sofa 1." in text
    # history_length 0 falls back to the first-turn template, as in verl-agent
    [msg0] = prompts.build_messages(history, obs, history_length=0)
    assert "Prior to this step" not in msg0.content


def test_env_builds_prompt_with_its_task_sentence(make):
    env = make(task_types=["look_at_obj_in_light"])
    obs = env.reset(seed=1)
    result = env.step(act(obs.admissible_actions[0]))
    [msg] = env.build_messages([(obs.text, obs.admissible_actions[0])], result.observation, history_length=2)
    assert f"Your task is to: {env.task_text}\n" in msg.content
    assert env.task_text.endswith(".") and not env.task_text.startswith("Your task")
