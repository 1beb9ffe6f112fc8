"""The environment contract: a seedable, single-use, text-in / text-out episode.

An env instance plays exactly one episode. ``reset(seed)`` picks the task deterministically from
the seed, so the G copies of a GRPO group (same seed) face the same task. ``step(text)`` takes the
model's *raw* response: the env parses it (a malformed response is an invalid action, never an
exception) and returns a StepResult.

Example (ALFWorld)::

    env = make_env(cfg.env, split="train")
    obs = env.reset(seed=17)          # Observation(text="-= Welcome to TextWorld, ALFRED! =- ...")
    r = env.step("<think>the mug is ...</think><action>go to countertop 1</action>")
    r.reward, r.done, r.won, r.action_valid   # 0.0, False, False, True
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from pipeline.core.types import CriterionResult, Message


@dataclass(kw_only=True, slots=True)
class Observation:
    """What the agent sees after reset or a step."""

    text: str  # the observation proper (also the GiGPO anchor key)
    admissible_actions: list[str] = field(default_factory=list)  # empty = free-form actions


@dataclass(kw_only=True, slots=True)
class StepResult:
    observation: Observation
    reward: float  # env reward of this step
    done: bool
    won: bool = False
    action_valid: bool = True
    action: str = ""  # the parsed action ("" if none)
    criteria: list[CriterionResult] = field(default_factory=list)  # final verdicts, on the last step
    info: dict = field(default_factory=dict)


class TextEnv(abc.ABC):
    """Single-use text environment. Subclasses register themselves with ``@register_env``."""

    name: str = ""
    # Whether instances may step in parallel threads (each its own state, no shared native code):
    # such envs step in a pool of rollout.env_workers threads, the others one at a time.
    thread_safe: bool = False
    max_turns: int = 50
    invalid_action_penalty: float = 0.1
    success_reward: float = 1.0  # episode reward = success_reward * won (+ env step rewards)

    # The task of the episode: ``reset`` sets them (a class default stands where an env has none).
    task_text: str = ""  # the task instruction shown to the agent
    task_type: str = ""  # the task's family, e.g. an ALFWorld task type (keys skills and per-type metrics)
    task_id: str = ""  # the same string always names the same task

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: dict, split: str) -> "TextEnv":
        """Build from ``env.options``; raise ValueError naming any unknown or bad option."""

    @classmethod  # noqa: B027 - optional hook
    def validate_options(cls, options: dict) -> None:
        """Check options at launch, before any heavy work (default: build nothing, accept)."""

    @abc.abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start the episode of the task chosen by ``seed``; set ``task_text`` (and ``task_type``,
        ``task_id`` where the env has them)."""

    @abc.abstractmethod
    def step(self, response: str) -> StepResult:
        """Apply the model's raw response; malformed input is an invalid action."""

    @abc.abstractmethod
    def build_messages(
        self, history: list[tuple[str, str]], observation: Observation, history_length: int
    ) -> list[Message]:
        """Chat messages for the next turn.

        ``history`` holds (observation, action) pairs of earlier turns; only the last
        ``history_length`` are shown. The result is what the chat template renders.
        """

    def chat_observation(self, observation: Observation) -> str:
        """The user message that brings ``observation`` into a conversation
        (``env.prompt_format=chat``); the task and the instructions are in its first message."""
        return observation.text

    def expert_response(self) -> str | None:
        """The expert's next response for the current state, in the env's strict protocol (what
        a model following the prompt exactly would write), or None where the env has no expert.
        The warm start (``pipeline/warm_start``) clones these."""
        return None

    def hinted_expert_response(self) -> str | None:
        """The next response of the expert that knows ``privileged_hint()``: what a teacher given
        the hint should favour. ``warm_start.hint_placement`` clones it with the hint in the
        prompt, so that the policy acts on a hint when it has one. Default: ``expert_response``."""
        return self.expert_response()

    def privileged_hint(self) -> str | None:
        """Privileged state of the current task as text (what a teacher may know and the student
        does not: where things are, the target's attributes), or None where the env has none.
        Read after reset by the ``hints`` context kind."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (temp files, subprocesses)."""

    def check_step(self, *, started: bool, done: bool) -> None:
        """The guard at the top of ``step``: an env plays after ``reset`` only, and one episode."""
        if not started:
            raise RuntimeError(f"{type(self).__name__}.step() before reset()")
        if done:
            raise RuntimeError(f"{type(self).__name__}.step() after the episode ended; envs are single-use")


def criteria_from_verdicts(
    verdicts: dict[str, tuple[bool, int | None]], feedback: dict[str, str]
) -> list[CriterionResult]:
    """``{criterion: (passed, turn it failed at)}`` as the final verdicts of an episode, each
    with its static feedback string; the turn is dropped where the criterion passed."""
    return [
        CriterionResult(criterion=c, passed=ok, failing_turn=None if ok else turn, feedback=feedback[c])
        for c, (ok, turn) in verdicts.items()
    ]


ENV_REGISTRY: dict[str, type[TextEnv]] = {}


def register_env(name: str):
    def wrap(cls: type[TextEnv]) -> type[TextEnv]:
        if name in ENV_REGISTRY:
            raise ValueError(f"env {name!r} registered twice")
        cls.name = name
        ENV_REGISTRY[name] = cls
        return cls

    return wrap
