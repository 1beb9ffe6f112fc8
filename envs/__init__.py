"""Environments: one module per env, all behind the contract in ``envs/base.py``."""

from __future__ import annotations

import importlib

from envs.base import ENV_REGISTRY, Observation, StepResult, TextEnv, register_env

# name -> module that registers it; imported lazily so an env's heavy deps load only when used.
_ENV_MODULES = {
    "alfworld": "envs.alfworld",
    "alfworld_real": "envs.alfworld.real",
    "gym_text": "envs.adapters",
    "keyword": "envs.keyword",
    "webshop": "envs.webshop",
    "webshop_real": "envs.webshop.adapter",
    "search_qa": "envs.search_qa",
    "code_edit": "envs.code_edit",
}


def env_class(name: str) -> type[TextEnv]:
    if name not in ENV_REGISTRY:
        module = _ENV_MODULES.get(name)
        if module is None:
            raise ValueError(f"unknown env {name!r}; choose one of {sorted(_ENV_MODULES)}")
        importlib.import_module(module)
    return ENV_REGISTRY[name]


def make_env(name: str, options: dict, split: str) -> TextEnv:
    """Build one single-use env. ``options`` are the env's own settings (``env.options`` in Hydra)."""
    return env_class(name).from_options(options, split=split)


__all__ = ["Observation", "StepResult", "TextEnv", "make_env", "env_class", "register_env"]
