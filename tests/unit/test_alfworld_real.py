"""``alfworld_real`` on a fake ``$ALFWORLD_DATA`` tree built from our own generated games.

Two small generated games are copied into ``json_2.1.1/train/<task>-<scene>/<trial>/`` (the
released layout); extra copies marked unsolvable, ``Sliced`` or of another task type check the
collection rules.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envs.alfworld.env import INVALID_OBSERVATION
from envs.alfworld.generator import SceneLimits, get_game
from envs.alfworld.real import RealAlfworldEnv, collect_games

LIMITS = SceneLimits(max_receptacles=6, max_objects=6)
TYPES = ("pick_and_place_simple", "look_at_obj_in_light")


def _copy(src: str, dest: Path, **game_edits) -> None:
    shutil.copytree(Path(src).parent, dest)
    if game_edits:
        game = json.loads((dest / "game.tw-pddl").read_text())
        game.update(game_edits)
        (dest / "game.tw-pddl").write_text(json.dumps(game))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    cache = str(tmp_path_factory.mktemp("gen-cache"))
    root = tmp_path_factory.mktemp("alfworld-data")
    base = root / "json_2.1.1"
    for split, privy_split in (("train", "train"), ("valid_seen", "valid_seen")):
        for i, task_type in enumerate(TYPES if split == "train" else TYPES[:1]):
            rec = get_game(LIMITS, privy_split, task_type, 0, cache)
            _copy(rec.path, base / split / f"{task_type}-x-{i}" / "trial_T0001")
            if split == "train" and i == 0:
                _copy(rec.path, base / split / f"{task_type}-x-{i}" / "trial_T0002", solvable=False)
                _copy(rec.path, base / split / f"{task_type}-Sliced-{i}" / "trial_T0001")
    (base / "valid_unseen").mkdir()
    return root


def act(command: str) -> str:
    return f"<think>the plan says {command}</think><action>{command}</action>"


def test_collects_only_solvable_unsliced_games_of_the_requested_types(data_root):
    folder = str(data_root / "json_2.1.1" / "train")
    games = collect_games(folder, TYPES)
    assert [g.task_type for g in games] == sorted(TYPES)  # sorted by path; unsolvable + Sliced skipped
    assert len(collect_games(folder, TYPES[1:])) == 1


def test_expert_plan_wins_with_the_alfworld_protocol_and_reward(data_root, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(data_root))
    env = RealAlfworldEnv.from_options({"task_types": list(TYPES)}, "train")
    try:
        assert env.n_games == 2
        obs = env.reset(seed=3)  # 3 % 2 -> the second game in path order
        assert env.task_type == "pick_and_place_simple"
        assert env.task_id == "train/pick_and_place_simple-x-0/trial_T0001"
        assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert f"Your task is to: {env.task_text}" in obs.text
        messages = env.build_messages([], obs, 2)
        assert env.task_text in messages[-1].content
        bad = env.step("go somewhere")  # no tags: invalid, game unchanged
        assert not bad.action_valid and bad.observation.text == INVALID_OBSERVATION
        plan = env.expert_plan()
        assert plan and plan == list(env.game.walkthrough)
        for command in plan:
            result = env.step(act(command))
            assert result.action_valid
        assert result.done and result.won and result.reward == env.success_reward == 10.0
        assert result.criteria[0].criterion == "task_success" and result.criteria[0].passed
    finally:
        env.close()


def test_splits_map_to_alfworld_folders_and_aliases(data_root):
    opts = {"data_dir": str(data_root / "json_2.1.1")}
    seen = RealAlfworldEnv.from_options(opts, "valid_seen")
    alias = RealAlfworldEnv.from_options(opts, "eval_in_distribution")
    assert seen.folder.name == alias.folder.name == "valid_seen" and seen.n_games == alias.n_games == 1
    assert alias.split == "valid_seen"
    with pytest.raises(FileNotFoundError, match="no solvable game"):
        RealAlfworldEnv.from_options(opts, "valid_unseen")  # folder exists but is empty
    with pytest.raises(ValueError, match="unknown alfworld_real split"):
        RealAlfworldEnv.from_options(opts, "test")


def test_missing_data_dir_errors_clearly(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match=r"ALFWORLD_DATA"):
        RealAlfworldEnv.from_options({}, "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RealAlfworldEnv.from_options({"data_dir": str(tmp_path / "nope")}, "train")
    (tmp_path / "json_2.1.1").mkdir()
    with pytest.raises(FileNotFoundError, match="expects the folder"):
        RealAlfworldEnv.from_options({"data_dir": str(tmp_path / "json_2.1.1")}, "train")
    with pytest.raises(ValueError, match="unknown alfworld_real option"):
        RealAlfworldEnv.from_options({"cache_dir": "x"}, "train")
