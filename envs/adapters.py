"""Adapters between privy envs (``envs.base.TextEnv``) and the ecosystem's text-env APIs.

* ``GymnasiumTextEnv(name, options, split)``: any privy env behind gymnasium's API.
  ``reset(*, seed=None, options=None) -> (obs_text, info)`` builds a fresh single-use privy env and
  resets it with ``seed`` (the task seed; ``None`` draws one from the wrapper's RNG).
  ``step(action_text) -> (obs_text, reward, terminated, truncated, info)``:
  ``terminated`` = the privy env said ``done`` (win, natural end, or an env's own turn limit, e.g.
  ALFWorld's ``max_turns``); ``truncated`` = the wrapper's ``max_turns`` was reached without
  ``done``. ``reward`` is the env's step reward (the invalid-action penalty the pipeline subtracts
  is in ``info["invalid_action_penalty"]``, not applied). ``info``: ``won``, ``action_valid``,
  ``action``, ``criteria`` (list of dicts), ``admissible_actions``, ``task_text``, ``task_id``,
  ``turn``, ``messages`` (the env's chat prompt for the next turn, history included), ``env_info``.
  ``register_gymnasium(name)`` registers ``privy/<name>-v0`` (``gymnasium.make("privy/keyword-v0",
  options={...}, split="train")``); it returns ``None`` when gymnasium is not installed.
* ``SkyRLTextEnv``: skyrl-gym's ``BaseTextEnv`` interface (a subclass of it when ``skyrl_gym`` is
  importable, else a plain class with the same methods). Mapping:

  ===========================  =============================================================
  skyrl-gym                    privy
  ===========================  =============================================================
  ``__init__(env_config,       ``extras`` (or ``env_config``) keys ``env`` (name), ``options``,
  extras)``                    ``split``, ``seed`` (task seed), ``max_turns``, ``history_length``
  ``init(prompt)``             ``env.reset(seed)``; returns the env's own first-turn messages
                               (a leading system message of ``prompt`` is kept if the env has
                               none); the dataset prompt's other messages are replaced
  ``step(action)``             ``env.step(action)`` on the raw response
  ``observations``             ``[]`` when done, else ``[{"role": "user", "content": ...}]``: the
                               last user message of ``env.build_messages([], obs, 0)`` (the
                               conversation already holds the history)
  ``reward``                   step reward minus ``invalid_action_penalty`` on an invalid action
  ``done``                     privy ``done`` or ``turns >= max_turns``
  ``metadata``                 ``won``, ``action_valid``, ``action``, ``criteria``,
                               ``admissible_actions``, ``task_id``, ``turn``
  ``postprocessed_action``     ``None`` (the raw response stays in the conversation)
  ``get_metrics()``            ``won``, ``return``, ``turns``, ``invalid_actions``,
                               ``criterion/<name>`` (1.0 / 0.0 from the final verdicts)
  ===========================  =============================================================
* ``FromGymnasium(env_id_or_env)``: the reverse, a privy ``TextEnv`` over a text gymnasium env
  (str observations, str actions), registered as ``gym_text`` (options ``env_id``, ``env_kwargs``,
  ``max_turns``). The raw response is the action. ``won`` = ``info["won"]`` if the env reports
  it, else ``terminated and reward > 0``; ``action_valid`` = ``info.get("action_valid", True)``;
  admissible actions from ``info["admissible_actions"]``; final criterion ``task_success``.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

from envs.base import Observation, StepResult, TextEnv, register_env
from envs.options import known_options
from pipeline.core.types import CriterionResult, Message

try:  # optional dependency (pyproject extra)
    import gymnasium as _gym
except ImportError:  # pragma: no cover - exercised only without gymnasium
    _gym = None

try:  # skyrl-gym is 1 GB of deps: never required
    from skyrl_gym.envs.base_text_env import BaseTextEnv as _SkyRLBase
except Exception:  # any import failure means "not available"
    _SkyRLBase = object

_GymBase = _gym.Env if _gym is not None else object
_TEXT_CHARSET = string.printable


def _criteria_dicts(criteria: list[CriterionResult]) -> list[dict]:
    return [
        {"criterion": c.criterion, "passed": c.passed, "failing_turn": c.failing_turn, "feedback": c.feedback}
        for c in criteria
    ]


def _make(name: str, options: dict | None, split: str) -> TextEnv:
    from envs import make_env

    return make_env(name, dict(options or {}), split)


# ----- privy -> gymnasium ------------------------------------------------------------------------
class GymnasiumTextEnv(_GymBase):
    """A privy env with gymnasium's ``reset`` / ``step`` (one fresh privy env per episode)."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(
        self,
        name: str,
        options: dict | None = None,
        split: str = "train",
        *,
        max_turns: int | None = None,
        history_length: int = 2,
        max_text_length: int = 1 << 16,
    ) -> None:
        self.env_name = name
        self.env_options = dict(options or {})
        self.split = split
        self.history_length = history_length
        self._env: TextEnv | None = None
        self._max_turns_override = max_turns
        self.max_turns = max_turns or 0
        self._rng = random.Random()
        self._turn = 0
        self._history: list[tuple[str, str]] = []
        self._obs: Observation | None = None
        self._finished = False
        if _gym is not None:
            text = _gym.spaces.Text(max_length=max_text_length, min_length=0, charset=_TEXT_CHARSET)
            self.observation_space = text
            self.action_space = text

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        if options:
            raise ValueError(
                f"GymnasiumTextEnv.reset takes no options (env options go to the constructor); got {options}"
            )
        if seed is not None:
            self._rng.seed(seed)
            task_seed = int(seed)
        else:
            task_seed = self._rng.randrange(2**31)
        self.close()
        self._env = _make(self.env_name, self.env_options, self.split)
        self.max_turns = self._max_turns_override or self._env.max_turns
        self._obs = self._env.reset(task_seed)
        self._turn, self._history, self._finished = 0, [], False
        return self._obs.text, self._info(task_seed=task_seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._env is None or self._obs is None:
            raise RuntimeError("GymnasiumTextEnv.step() before reset()")
        if self._finished:
            raise RuntimeError("GymnasiumTextEnv.step() after the episode ended; call reset()")
        res = self._env.step(action)
        self._turn += 1
        self._history.append((self._obs.text, res.action if res.action_valid else action.strip()))
        self._obs = res.observation
        terminated = bool(res.done)
        truncated = not terminated and self._turn >= self.max_turns
        self._finished = terminated or truncated
        return res.observation.text, float(res.reward), terminated, truncated, self._info(res)

    def _info(self, res: StepResult | None = None, task_seed: int | None = None) -> dict[str, Any]:
        env, obs = self._env, self._obs
        info: dict[str, Any] = {
            "won": bool(res.won) if res else False,
            "action_valid": bool(res.action_valid) if res else True,
            "action": res.action if res else "",
            "criteria": _criteria_dicts(res.criteria) if res else [],
            "admissible_actions": list(obs.admissible_actions),
            "task_text": env.task_text,
            "task_id": env.task_id,
            "turn": self._turn,
            "invalid_action_penalty": env.invalid_action_penalty,
            "env_info": dict(res.info) if res else {},
        }
        if task_seed is not None:
            info["task_seed"] = task_seed
        if not (res and res.done):
            msgs = env.build_messages(self._history, obs, self.history_length)
            info["messages"] = [m.as_dict() for m in msgs]
        return info

    @property
    def privy_env(self) -> TextEnv | None:
        return self._env

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def register_gymnasium(name: str) -> str | None:
    """Register ``privy/<name>-v0`` with gymnasium (idempotent); None if gymnasium is not installed."""
    if _gym is None:
        return None
    env_id = f"privy/{name}-v0"
    if env_id not in _gym.registry:
        # The passive checker wants spaces it can sample from; text envs have none worth checking.
        _gym.register(id=env_id, entry_point=GymnasiumTextEnv, kwargs={"name": name}, disable_env_checker=True)
    return env_id


# ----- privy -> skyrl-gym ------------------------------------------------------------------------
class SkyRLTextEnv(_SkyRLBase):
    """skyrl-gym ``BaseTextEnv`` over a privy env (see the module docstring for the mapping)."""

    def __init__(
        self, env_config: dict | None = None, extras: dict | None = None, *, env: TextEnv | None = None
    ) -> None:
        if _SkyRLBase is not object:
            super().__init__()
        cfg = {**dict(env_config or {}), **dict(extras or {})}
        if env is None:
            if "env" not in cfg:
                raise ValueError("SkyRLTextEnv needs a privy env name: extras={'env': 'keyword', ...} or env=...")
            env = _make(cfg["env"], cfg.get("options"), cfg.get("split", "train"))
        self.env = env
        self.seed = int(cfg.get("seed", 0))
        self.history_length = int(cfg.get("history_length", 2))
        self.max_turns = int(cfg.get("max_turns") or env.max_turns)
        self.turns = 0
        self._return = 0.0
        self._invalid = 0
        self._won = False
        self._criteria: list[CriterionResult] = []
        self._obs: Observation | None = None

    def init(self, prompt: list[dict]) -> tuple[list[dict], dict]:
        self._obs = self.env.reset(self.seed)
        messages = [m.as_dict() for m in self.env.build_messages([], self._obs, self.history_length)]
        if prompt and prompt[0].get("role") == "system" and (not messages or messages[0]["role"] != "system"):
            messages = [dict(prompt[0])] + messages
        return messages, {
            "task_id": self.env.task_id,
            "task_text": self.env.task_text,
            "admissible_actions": list(self._obs.admissible_actions),
        }

    def step(self, action: str) -> dict[str, Any]:
        if self._obs is None:
            raise RuntimeError("SkyRLTextEnv.step() before init()")
        res = self.env.step(action)
        self.turns += 1
        reward = float(res.reward) - (0.0 if res.action_valid else self.env.invalid_action_penalty)
        self._return += reward
        self._invalid += 0 if res.action_valid else 1
        self._won = self._won or bool(res.won)
        if res.criteria:
            self._criteria = list(res.criteria)
        self._obs = res.observation
        done = bool(res.done) or self.turns >= self.max_turns
        observations: list[dict] = []
        if not done:
            last = self.env.build_messages([], res.observation, 0)[-1]
            observations = [{"role": "user", "content": last.content}]
        return {
            "observations": observations,
            "reward": reward,
            "done": done,
            "metadata": {
                "won": bool(res.won),
                "action_valid": bool(res.action_valid),
                "action": res.action,
                "criteria": _criteria_dicts(res.criteria),
                "admissible_actions": list(res.observation.admissible_actions),
                "task_id": self.env.task_id,
                "turn": self.turns,
            },
            "postprocessed_action": None,
        }

    def get_metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {
            "won": float(self._won),
            "return": self._return,
            "turns": self.turns,
            "invalid_actions": self._invalid,
        }
        for c in self._criteria:
            metrics[f"criterion/{c.criterion}"] = float(c.passed)
        return metrics

    def close(self) -> None:
        self.env.close()


# ----- gymnasium -> privy ------------------------------------------------------------------------
@dataclass(frozen=True)
class GymTextOptions:
    """``env.options`` for ``gym_text``."""

    env_id: str = ""  # a registered gymnasium id whose observations and actions are strings
    env_kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make
    max_turns: int = 50


@register_env("gym_text")
class FromGymnasium(TextEnv):
    """A privy ``TextEnv`` over a text gymnasium env (obs: str, action: str)."""

    invalid_action_penalty = 0.0
    success_reward = 0.0  # rewards come from the gymnasium env itself

    def __init__(self, env_id_or_env: Any, *, max_turns: int = 50, env_kwargs: dict | None = None) -> None:
        if isinstance(env_id_or_env, str):
            if _gym is None:
                raise ImportError("gym_text needs gymnasium: pip install gymnasium")
            env_id_or_env = _gym.make(env_id_or_env, **dict(env_kwargs or {}))
        self.gym_env = env_id_or_env
        self.max_turns = max_turns
        self._turn = 0
        self._done = False

    @classmethod
    def from_options(cls, options: dict, split: str) -> FromGymnasium:
        opts = GymTextOptions(**known_options(options, GymTextOptions, "gym_text"))
        if not opts.env_id:
            raise ValueError("gym_text needs option env_id (a registered text gymnasium env id)")
        if not isinstance(opts.max_turns, int) or opts.max_turns < 1:
            raise ValueError(f"gym_text max_turns must be an int >= 1, got {opts.max_turns!r}")
        return cls(opts.env_id, max_turns=opts.max_turns, env_kwargs=opts.env_kwargs)

    def reset(self, seed: int) -> Observation:
        obs, info = self.gym_env.reset(seed=int(seed))
        self.task_text = str(info.get("task", obs))
        spec = getattr(self.gym_env, "spec", None)
        self.task_id = str(info.get("task_id", f"{getattr(spec, 'id', type(self.gym_env).__name__)}-{seed}"))
        self._turn, self._done = 0, False
        return Observation(text=str(obs), admissible_actions=list(info.get("admissible_actions", [])))

    def step(self, response: str) -> StepResult:
        if self._done:
            raise RuntimeError("FromGymnasium.step() after the episode ended; envs are single-use")
        obs, reward, terminated, truncated, info = self.gym_env.step(response)
        self._turn += 1
        won = bool(info["won"]) if "won" in info else bool(terminated and reward > 0)
        self._done = bool(terminated or truncated or self._turn >= self.max_turns)
        criteria = [CriterionResult(criterion="task_success", passed=won)] if self._done else []
        return StepResult(
            observation=Observation(text=str(obs), admissible_actions=list(info.get("admissible_actions", []))),
            reward=float(reward),
            done=self._done,
            won=won,
            action_valid=bool(info.get("action_valid", True)),
            action=response.strip(),
            criteria=criteria,
            info={"terminated": bool(terminated), "truncated": bool(truncated), "turn": self._turn},
        )

    def build_messages(
        self, history: list[tuple[str, str]], observation: Observation, history_length: int
    ) -> list[Message]:
        parts = [self.task_text] if self.task_text and self.task_text != observation.text else []
        recent = history[-history_length:] if history_length > 0 else []
        if recent:
            parts.append("Recent turns:\n" + "\n".join(f"[Observation] {o}\n[Action] {a}" for o, a in recent))
        parts.append(f"Current observation: {observation.text}" if parts else observation.text)
        if observation.admissible_actions:
            parts.append("Admissible actions: " + ", ".join(observation.admissible_actions))
        return [Message(role="user", content="\n\n".join(parts))]

    def close(self) -> None:
        close = getattr(self.gym_env, "close", None)
        if close is not None:
            close()


__all__ = ["FromGymnasium", "GymnasiumTextEnv", "SkyRLTextEnv", "register_gymnasium"]
