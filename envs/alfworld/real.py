"""``alfworld_real``: the ``alfworld`` env on ALFWorld's released game files instead of generated ones.

Everything after the game is chosen is ``AlfworldEnv``'s: the same engine stack
(``engine.load_engine``), observation format, verl-agent prompt (``prompts``), action parser,
invalid-action handling and reward (``success_reward`` 10 on the winning step). Only ``reset``
differs: it picks a game file from the data set rather than generating one.

Data layout (what ``alfworld-download`` writes under ``$ALFWORLD_DATA``)::

    <data_dir>/<folder>/<task dir>/<trial dir>/{game.tw-pddl, traj_data.json}

``data_dir`` defaults to ``$ALFWORLD_DATA/json_2.1.1``. The privy splits map to ALFWorld's folders:
``train`` -> ``train`` (ALFWorld's ``train``), ``valid_seen`` -> ``valid_seen`` (its
``eval_in_distribution``), ``valid_unseen`` -> ``valid_unseen`` (``eval_out_of_distribution``);
ALFWorld's own split names are accepted as aliases. Games are collected the way ALFWorld's
``AlfredTWEnv.collect_game_files`` does: a trial needs ``traj_data.json`` whose ``task_type`` is
one of ``task_types``, a ``game.tw-pddl`` with ``"solvable": true``, and no ``movable`` /
``Sliced`` in its path. The list is sorted (ALFWorld's ``os.walk`` order is filesystem-dependent)
and cached per (folder, task types); ``reset(seed)`` plays game ``seed % n_games``.
``task_id`` is ``<split>/<path of the trial below the split folder>``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from envs.alfworld.engine import replan
from envs.alfworld.env import AlfworldEnv, AlfworldOptions
from envs.alfworld.generator import TASK_TYPES, GameRecord
from envs.base import register_env
from envs.options import known_options

SPLIT_FOLDERS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}
SPLIT_ALIASES = {"eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}
DATA_VERSION_DIR = "json_2.1.1"


@dataclass(frozen=True)
class RealAlfworldOptions:
    """``env.options`` for ``alfworld_real`` (the engine / protocol options mean what they mean in ``alfworld``)."""

    data_dir: str | None = None  # None = $ALFWORLD_DATA/json_2.1.1
    task_types: tuple[str, ...] = TASK_TYPES
    max_turns: int = 50
    n_games: int = 0  # use only the first n games of the sorted list (ALFWorld's num_train_games); 0 = all
    expert: bool = False
    reject_cjk: bool = True
    action_format: str = "tags"

    @classmethod
    def from_dict(cls, options: dict | None) -> RealAlfworldOptions:
        opts = cls(**known_options(options, cls, "alfworld_real", tuples=("task_types",)))
        if not isinstance(opts.n_games, int) or opts.n_games < 0:
            raise ValueError(f"alfworld_real n_games must be an int >= 0, got {opts.n_games!r}")
        opts.engine_options()  # validates task_types, max_turns, expert, reject_cjk, action_format
        return opts

    def engine_options(self) -> AlfworldOptions:
        """The ``AlfworldOptions`` that ``AlfworldEnv.step`` and friends read."""
        # An option of both classes means the same in both; alfworld's others keep their defaults.
        shared = {f.name for f in fields(AlfworldOptions)} & {f.name for f in fields(self)}
        opts = AlfworldOptions(**{name: getattr(self, name) for name in shared})
        try:
            opts.validate()
        except ValueError as e:
            raise ValueError(str(e).replace("alfworld ", "alfworld_real ", 1)) from None
        return opts

    def resolved_data_dir(self) -> Path:
        if self.data_dir:
            return Path(os.path.expandvars(os.path.expanduser(self.data_dir)))
        root = os.environ.get("ALFWORLD_DATA")
        if not root:
            raise FileNotFoundError(
                "alfworld_real needs ALFWorld's game files: set env.options.data_dir, or $ALFWORLD_DATA "
                f"(the folder holding {DATA_VERSION_DIR}/; `alfworld-download` fills it)"
            )
        return Path(root) / DATA_VERSION_DIR


def split_dir(data_dir: Path, split: str) -> Path:
    """The ALFWorld folder of a privy split; FileNotFoundError naming what is missing."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLIT_FOLDERS:
        raise ValueError(
            f"unknown alfworld_real split {split!r}; choose one of "
            f"{list(SPLIT_FOLDERS)} (or ALFWorld's {list(SPLIT_ALIASES)})"
        )
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"alfworld_real data_dir {str(data_dir)!r} does not exist; point "
            "env.options.data_dir (or $ALFWORLD_DATA) at ALFWorld's data (`alfworld-download`)"
        )
    folder = data_dir / SPLIT_FOLDERS[split]
    if not folder.is_dir():
        raise FileNotFoundError(
            f"alfworld_real split {split!r} expects the folder {str(folder)!r}, which does not exist"
        )
    return folder


@functools.lru_cache(maxsize=16)
def collect_games(folder: str, task_types: tuple[str, ...]) -> tuple[GameRecord, ...]:
    """Solvable games of the given task types under ``folder`` (``<task>/<trial>/game.tw-pddl``), sorted."""
    records = []
    for game_file in sorted(Path(folder).glob("*/*/game.tw-pddl")):
        trial = game_file.parent
        if "movable" in str(trial) or "Sliced" in str(trial):
            continue
        try:
            traj = json.loads((trial / "traj_data.json").read_text())
        except (OSError, ValueError):
            continue
        if traj.get("task_type") not in task_types:
            continue
        try:
            game = json.loads(game_file.read_text())
        except (OSError, ValueError):
            continue
        if not game.get("solvable", False):
            continue
        try:
            desc = traj["turk_annotations"]["anns"][0]["task_desc"]
        except (KeyError, IndexError, TypeError):
            desc = ""
        records.append(
            GameRecord(
                str(game_file),
                traj["task_type"],
                int(traj.get("scene", {}).get("scene_num", -1)),
                desc,
                tuple(game.get("walkthrough") or ()),
            )
        )
    return tuple(records)


@register_env("alfworld_real")
class RealAlfworldEnv(AlfworldEnv):
    """``AlfworldEnv`` whose ``reset`` plays a released ALFWorld game instead of a generated one."""

    def __init__(self, real: RealAlfworldOptions, split: str, folder: Path, games: tuple[GameRecord, ...]) -> None:
        super().__init__(real.engine_options(), SPLIT_ALIASES.get(split, split))
        self.real_options = real
        self.folder = folder
        self.games = games

    @classmethod
    def from_options(cls, options: dict, split: str) -> RealAlfworldEnv:
        real = RealAlfworldOptions.from_dict(options)
        folder = split_dir(real.resolved_data_dir(), split)
        games = collect_games(str(folder), real.task_types)
        if real.n_games:
            games = games[: real.n_games]
        if not games:
            raise FileNotFoundError(
                f"alfworld_real found no solvable game of {list(real.task_types)} "
                f"under {str(folder)!r} (expected <task>/<trial>/game.tw-pddl + traj_data.json)"
            )
        return cls(real, split, folder, games)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        real = RealAlfworldOptions.from_dict(options)
        for split in SPLIT_FOLDERS:
            split_dir(real.resolved_data_dir(), split)

    @property
    def n_games(self) -> int:
        return len(self.games)

    def _pick_game(self, seed: int):
        record = self.games[seed % len(self.games)]
        task_id = f"{self.split}/{Path(record.path).parent.relative_to(self.folder).as_posix()}"
        return record, record.task_type, task_id

    def expert_plan(self) -> list[str]:
        """As ``AlfworldEnv.expert_plan``; a game file without a stored walkthrough is replanned."""
        if self._engine is not None and self._record is not None and self._moves == 0 and not self._record.walkthrough:
            return replan(self._engine)
        return super().expert_plan()


__all__ = ["SPLIT_FOLDERS", "RealAlfworldEnv", "RealAlfworldOptions", "collect_games", "split_dir"]
