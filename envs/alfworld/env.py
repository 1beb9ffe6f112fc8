"""ALFWorld on generated games: ALFWorld's own text engine, verl-agent's protocol and reward.

``reset(seed)`` maps the seed to a task of the split (``seed % n_tasks``; task types take turns),
generates and verifies the game on first use (``generator.get_game``, cached on disk) and
starts ALFWorld's engine on it. ``step(response)`` parses ``<think>...</think><action>...
</action>`` (``envs/actions.py``); a response that does not parse, or whose action is not one
of the admissible commands, is an invalid action: the game does not advance, the observation
is ALFWorld's ``Nothing happens.``, the admissible actions stay the same, and the turn still
counts towards ``max_turns``. ``help`` is not offered (verl-agent hides it from the prompt),
so it is invalid too. Reward: ``success_reward`` (10, verl-agent's ``10 * won``) on the winning
step, else 0; the pipeline subtracts ``invalid_action_penalty`` (0.1) on invalid steps.
The episode ends on a win or after ``max_turns`` turns (ALFWorld never reports a loss).

A real episode (``split="train"``, ``max_receptacles=8, max_objects=8``, seed 1)::

    reset -> "-= Welcome to TextWorld, ALFRED! =-\\n\\nYou are in the middle of a room. Looking
              quickly around you, you see a coffeetable 1, a shelf 4, a shelf 3, a shelf 2, a
              shelf 1, a sidetable 2, a sidetable 1, and a sofa 1.\\n\\nYour task is to: look at
              watch under the floorlamp."
             admissible: go to coffeetable 1, go to shelf 1, ..., go to sofa 1, inventory, look
    "<think>watches sit on shelves</think><action>go to shelf 3</action>"
          -> "You arrive at shelf 3. On the shelf 3, you see a watch 2."            reward 0
    "<think>take it</think><action>take watch 2 from shelf 3</action>"
          -> "You pick up the watch 2 from the shelf 3."                            reward 0
    "go to sidetable 1"  (no tags)
          -> "Nothing happens."      action_valid=False, reward 0, game unchanged
    "<think>now the lamp</think><action>go to sidetable 1</action>"
          -> "You arrive at sidetable 1. On the sidetable 1, you see a bowl 1, and a floorlamp 1."
    "<think>light it</think><action>use floorlamp 1</action>"
          -> "You turn on the floorlamp 1."                  reward 10, done, won

Performance (2-core CPU): see ``engine`` for the per-process engine pool and the memoised PDDL
translation. Small scenes (6-8 receptacles and objects) step in about 40 ms; whole floor plans
in 50-140 ms, dominated by textworld regenerating the text of every admissible command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import envs.alfworld.prompts as prompts
from envs.actions import normalize_action, parse_think_action
from envs.alfworld.engine import load_engine, release_engine, replan
from envs.alfworld.expert import SearchingExpert, planned_reason, walkthrough_hint
from envs.alfworld.generator import SPLITS, TASK_TYPES, GameRecord, SceneLimits, cache_key, get_game
from envs.base import Observation, StepResult, TextEnv, register_env
from envs.options import check_bools, check_ints, known_options
from pipeline.core.types import CriterionResult, Message

# ALFWorld's own split sizes (solvable games of the six task types).
ALFWORLD_SPLIT_SIZES = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
INVALID_OBSERVATION = "Nothing happens."  # what ALFWorld answers to a command it cannot run


@dataclass(frozen=True)
class AlfworldOptions:
    """``env.options`` for ``alfworld``."""

    task_types: tuple[str, ...] = TASK_TYPES  # any non-empty subset of the six ALFWorld task types
    max_turns: int = 50  # turns per episode, >= 1 (verl-agent: 50)
    # > 0: each episode's turn limit is this times its stored walkthrough's length (rounded up),
    # at most max_turns: room for the plan plus as many detours, without paying for 50 turns of a
    # 3-step task (the CPU recipe: 2.0).
    plan_turns_factor: float = 0.0
    max_receptacles: int = 0  # receptacles per scene: 0 = the whole floor plan (8-38), else >= 4
    max_objects: int = 0  # objects per scene: 0 = one of each type the floor plan lists, else >= 4
    n_floorplans: int = 0  # floor plans per split, 0 = all (96 seen, 24 unseen), alternating room types
    n_tasks: int | None = None  # tasks per split (seed % n_tasks); None = ALFWorld's sizes; 0 = every seed its own
    generator_seed: int = 0  # another value draws another task pool
    cache_dir: str | None = None  # generated games; None = $PRIVY_CACHE/alfworld or ~/.cache/privy-rl/alfworld
    expert: bool = False  # ALFWorld's planner expert replans every step: small scenes only (whole plans: 1-100 s/step)
    reject_cjk: bool = True  # verl-agent marks responses holding CJK characters invalid
    # "tags": verl-agent's protocol, <think>...</think><action>...</action> (the default).
    # "lenient": a response that breaks the protocol still acts if it names an admissible command
    # (the longest one found, last occurrence): for models too small to follow the tags (the
    # SmolLM2 CPU recipe); never for comparisons with published ALFWorld numbers.
    action_format: str = "tags"

    @classmethod
    def from_dict(cls, options: dict | None) -> "AlfworldOptions":
        opts = cls(**known_options(options, cls, "alfworld", tuples=("task_types",)))
        opts.validate()
        return opts

    def validate(self) -> None:
        bad = [t for t in self.task_types if t not in TASK_TYPES]
        if not self.task_types or bad:
            raise ValueError(f"alfworld task_types must be a non-empty subset of {list(TASK_TYPES)}; got {bad or '[]'}")
        if len(set(self.task_types)) != len(self.task_types):
            raise ValueError(f"alfworld task_types has duplicates: {list(self.task_types)}")
        check_ints("alfworld", self, ("max_turns", "max_receptacles", "max_objects", "n_floorplans", "generator_seed"))
        if self.max_turns < 1:
            raise ValueError(f"alfworld max_turns must be >= 1, got {self.max_turns}")
        for name in ("max_receptacles", "max_objects"):
            value = getattr(self, name)
            if value != 0 and value < 4:
                raise ValueError(f"alfworld {name} must be 0 (whole floor plan) or >= 4, got {value}")
        if self.n_floorplans < 0:
            raise ValueError(f"alfworld n_floorplans must be >= 0, got {self.n_floorplans}")
        if self.n_tasks is not None and (not isinstance(self.n_tasks, int) or self.n_tasks < 0):
            raise ValueError(f"alfworld n_tasks must be null or an int >= 0, got {self.n_tasks!r}")
        if not isinstance(self.plan_turns_factor, (int, float)) or self.plan_turns_factor < 0:
            raise ValueError(f"alfworld plan_turns_factor must be >= 0 (0 = off), got {self.plan_turns_factor!r}")
        if self.action_format not in ("tags", "lenient"):
            raise ValueError(f"alfworld action_format must be tags or lenient, got {self.action_format!r}")
        check_bools("alfworld", self, ("expert", "reject_cjk"))

    @property
    def limits(self) -> SceneLimits:
        return SceneLimits(
            seed=self.generator_seed,
            max_receptacles=self.max_receptacles,
            max_objects=self.max_objects,
            n_floorplans=self.n_floorplans,
        )

    def n_tasks_for(self, split: str) -> int:
        return ALFWORLD_SPLIT_SIZES[split] if self.n_tasks is None else self.n_tasks


def check_split(split: str, options: AlfworldOptions) -> None:
    """Raise ValueError if ``split`` is unknown or cannot host every requested task type."""
    from envs.alfworld.scenes import load_floorplan, split_floorplans, supports

    if split not in SPLITS:
        raise ValueError(f"unknown alfworld split {split!r}; choose one of {list(SPLITS)}")
    plans = [load_floorplan(n) for n in split_floorplans(split, options.n_floorplans)]
    missing = [t for t in options.task_types if not any(supports(fp, t, split) for fp in plans)]
    if missing:
        raise ValueError(
            f"no floor plan among the first {options.n_floorplans or len(plans)} of split {split!r} "
            f"supports {missing}; raise alfworld n_floorplans (or set it to 0)"
        )


def task_for_seed(options: AlfworldOptions, split: str, seed: int) -> tuple[str, int]:
    """(task type, index within the type) of the task a seed selects."""
    n = options.n_tasks_for(split)
    index = seed % n if n > 0 else abs(seed)
    k = len(options.task_types)
    return options.task_types[index % k], index // k


@register_env("alfworld")
class AlfworldEnv(TextEnv):
    max_turns = 50
    invalid_action_penalty = 0.1
    success_reward = 10.0

    def __init__(self, options: AlfworldOptions, split: str) -> None:
        self.options = options
        self.split = split
        self.max_turns = options.max_turns
        self._engine = None
        self._record: GameRecord | None = None
        self._obs: Observation | None = None
        self._state = None
        self._turn = 0
        self._moves = 0  # valid actions executed
        self._done = False
        self._won = False

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: dict, split: str) -> "AlfworldEnv":
        opts = AlfworldOptions.from_dict(options)
        check_split(split, opts)
        return cls(opts, split)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        opts = AlfworldOptions.from_dict(options)
        for split in SPLITS:
            check_split(split, opts)

    # ----- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        self.close()
        self._record, self.task_type, self.task_id = self._pick_game(int(seed))
        self._engine = load_engine(self._record.path, expert=self.options.expert)
        self._state = self._engine.reset()
        self._obs = self._observation(self._state["feedback"])
        # The task sentence, e.g. ``put some potato on diningtable.`` (verl-agent's task_description).
        self.task_text = prompts.extract_task(self._obs.text)
        self._turn, self._moves, self._done, self._won = 0, 0, False, bool(self._state["won"])
        self._expert = None  # the searching expert, made on first use (warm start)
        self.max_turns = self.options.max_turns
        if self.options.plan_turns_factor > 0 and self._record.walkthrough:
            self.max_turns = min(
                self.max_turns, math.ceil(self.options.plan_turns_factor * len(self._record.walkthrough))
            )
        return self._obs

    def step(self, response: str) -> StepResult:
        self.check_step(started=self._engine is not None and self._obs is not None, done=self._done)
        parsed = parse_think_action(response, forbid_cjk=self.options.reject_cjk)
        reason = parsed.reason
        action = parsed.action
        if reason and self.options.action_format == "lenient":
            found = find_admissible(response, self._obs.admissible_actions)
            if found:
                action, reason = found, ""
        if not reason and action not in self._obs.admissible_actions:
            reason = "action is not admissible"
        self._turn += 1
        if reason:
            self._obs = Observation(text=INVALID_OBSERVATION, admissible_actions=self._obs.admissible_actions)
        else:
            self._state, _, _ = self._engine.step(action)
            self._moves += 1
            self._won = bool(self._state["won"])
            self._obs = self._observation(self._state["feedback"])
        self._done = self._won or self._turn >= self.max_turns
        criteria = [CriterionResult(criterion="task_success", passed=self._won)] if self._done else []
        return StepResult(
            observation=self._obs,
            reward=self.success_reward if self._won else 0.0,
            done=self._done,
            won=self._won,
            action_valid=not reason,
            action=action,
            criteria=criteria,
            info={"turn": self._turn, "invalid_reason": reason, "task_id": self.task_id},
        )

    def _pick_game(self, seed: int) -> tuple[GameRecord, str, str]:
        """The game, task type and task id of ``seed`` (``alfworld_real`` picks from real files). The id,
        ``<split>/<task_type>/<index>/<generator key>`` here: the same string always names the same game."""
        task_type, index = task_for_seed(self.options, self.split, seed)
        record = get_game(self.options.limits, self.split, task_type, index, self.options.cache_dir)
        return record, task_type, f"{self.split}/{task_type}/{index}/{cache_key(self.options.limits)}"

    def _observation(self, text: str) -> Observation:
        admissible = [c for c in self._state["admissible_commands"] if c != "help"]
        return Observation(text=text, admissible_actions=admissible)

    # ----- task metadata -------------------------------------------------------------------------
    @property
    def won(self) -> bool:
        """Whether the goal holds now (False at reset for every generated game)."""
        return self._won

    @property
    def game(self) -> GameRecord | None:
        """The generated game (path, floor plan, stored walkthrough), after reset."""
        return self._record

    def expert_plan(self) -> list[str]:
        """The planner's plan from the current state.

        Right after reset this is the walkthrough stored with the game; with ``expert=True`` it
        is ALFWorld's ``AlfredExpert`` plan; otherwise Fast Downward replans now (slow on big scenes).
        """
        if self._engine is None or self._record is None:
            raise RuntimeError("AlfworldEnv.expert_plan() before reset()")
        if self._moves == 0:  # invalid actions leave the game in its initial state
            return list(self._record.walkthrough)
        if self.options.expert:
            return list(self._state["extra.expert_plan"])
        return replan(self._engine)

    def expert_response(self) -> str | None:
        """The searching expert's next command (``envs/alfworld/expert.py``: the walkthrough, but
        objects are searched for, not known), with a one-line reason, in verl-agent's protocol:
        ``<think>the task needs the mug 1</think><action>take mug 1 from shelf 2</action>``.
        Only valid while every move so far came from it."""
        if self._engine is None or self._record is None or self._obs is None:
            raise RuntimeError("AlfworldEnv.expert_response() before reset()")
        if self._expert is None:
            self._expert = SearchingExpert(self._record.walkthrough or self.expert_plan())
        action = self._expert.next(self._obs.text, self._obs.admissible_actions, self.expert_plan)
        if action is None:
            return None
        return f"<think>{self._expert.reason}</think><action>{action}</action>"

    def hinted_expert_response(self) -> str | None:
        """Told where the objects are (``privileged_hint``, read off the walkthrough), the expert
        follows the stored walkthrough straight there instead of searching. Only valid while
        every move so far came from it."""
        if self._record is None:
            raise RuntimeError("AlfworldEnv.hinted_expert_response() before reset()")
        plan = self._record.walkthrough or []
        if self._moves >= len(plan):
            return None
        step, after = plan[self._moves], plan[self._moves + 1] if self._moves + 1 < len(plan) else ""
        return f"<think>{planned_reason(step, after)}</think><action>{step}</action>"

    def privileged_hint(self) -> str | None:
        """Where the task's objects are and where they go, read off the stored walkthrough (the
        student only learns this by searching): ``The mug 1 is in/on the shelf 2. It goes
        in/on the desk 1.``"""
        if self._record is None:
            return None
        return walkthrough_hint(self._record.walkthrough) or None

    def build_messages(
        self, history: list[tuple[str, str]], observation: Observation, history_length: int
    ) -> list[Message]:
        return prompts.build_messages(history, observation, history_length, task_text=self.task_text or None)

    def close(self) -> None:
        if self._engine is not None:
            release_engine(self._engine)
            self._engine = None


def find_admissible(response: str, admissible: list[str]) -> str:
    """The admissible command named in free text (lenient mode): longest match, last occurrence."""
    text = normalize_action(response)
    hits = [(len(cmd), text.rfind(cmd), cmd) for cmd in admissible if cmd in text]
    return max(hits)[2] if hits else ""
