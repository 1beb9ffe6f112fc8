"""ALFWorld: the real text engine on games generated from the floor plans the wheel ships.

Importing this package registers the ``alfworld`` env (``envs.make_env("alfworld", options, split)``).
Modules: ``scenes`` (floor plans, task sampling), ``generator`` (PDDL rendering, verification,
disk cache), ``engine`` (ALFWorld's PddlEnv stack), ``env`` (the ``TextEnv``), ``prompts``
(verl-agent's prompt); ``python -m envs.alfworld`` pre-generates the games of a run.
"""

from envs.alfworld.env import AlfworldEnv, AlfworldOptions
from envs.alfworld.generator import SPLITS, TASK_TYPES, GameRecord, SceneLimits, get_game

__all__ = ["AlfworldEnv", "AlfworldOptions", "GameRecord", "SPLITS", "SceneLimits", "TASK_TYPES", "get_game"]
