"""``webshop``: an offline WebShop (generated catalog, WebShop's pages, actions and reward formula).

``reset(seed)`` picks task ``seed % n_tasks`` of the split and its goal (``draw_goal``: drawn by
``catalog.generate_goal`` from the split's own target products, and redrawn until its requirement
(product type, attributes, option values) belongs to the split, ``catalog.requirement_split``, and
its target is among the top 50 results for its own instruction, so every task can be solved by
searching the instruction and no valid or test task asks what a train task asks).
``step(response)`` parses verl-agent's ``<think>...</think><action>...</action>``
(``envs/actions.py``); the action is ``search[...]`` or
``click[...]``. A response that does not parse, an action of another shape, ``search`` on a page
without a search bar, and a click on something not on the page are *invalid*: nothing changes,
the observation is the same page, reward 0 (the pipeline subtracts ``invalid_action_penalty``,
0.1), and the turn still counts. ``click[buy now]`` ends the episode and is scored once with
WebShop's formula (``reward.get_reward``, R in [0, 1]); the episode also ends after
``max_turns`` (15, as verl-agent) turns without a purchase, scoring nothing.

Reward, as verl-agent's WebShop worker: ``won = (R == 1)``; the step reward of the purchase is
``success_reward * won`` (10 or 0); R itself is ``info["task_score"]``. With
``reward_mode="score"`` the purchase pays ``success_reward * R`` instead (dense; ``won`` unchanged).

Criteria, one per reward term, on the last step (``failing_turn`` = the 0-based turn that opened
the bought item for attributes / price / type, the ``buy now`` turn for options, the last turn
when nothing was bought): ``attributes`` (every goal attribute matched), ``options`` (every goal
option chosen), ``price`` (under the limit), ``type`` (``r_type == 1``); each carries a static
feedback string (``FEEDBACK``), the privileged context of targeted guidance.

A real episode (``split="train"``, default options, seed 1858; ``...`` shortens the page texts)::

    reset -> "Instruction: [SEP] i want to buy a men's t-shirt which is crew neck, short sleeve and
              cotton with color: royal blue, and size: large, and price lower than 50.00 dollars
              [SEP] Search"
    "<think>I need a men's cotton short sleeve t-shirt.</think><action>search[men's t-shirt cotton
     short sleeve]</action>"
          -> "Instruction: [SEP] ... [SEP] Back to Search [SEP] Page 1 (Total results: 37) [SEP] Next >
              [SEP] B0EQCFRM6X [SEP] Lakeview Apparel Short Sleeve Crew Neck Men's T-Shirt [SEP] $15.99
              [SEP] B0JL0G5JRY [SEP] Fieldstone Tagless Short Sleeve Men's T-Shirt [SEP] $26.49 ..."
    "<think>The first result ...; open it.</think><action>click[b0eqcfrm6x]</action>"
          -> "... [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] white [SEP] olive green
              [SEP] burgundy [SEP] royal blue [SEP] size [SEP] medium [SEP] large [SEP] x-large [SEP]
              xx-large [SEP] Lakeview Apparel ... T-Shirt [SEP] Price: $15.99 [SEP] Rating: 4.5 [SEP]
              Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    "<think>Cotton is not in the title; check the features.</think><action>click[features]</action>"
          -> "... [SEP] < Prev [SEP] Short Sleeve: An everyday tee ... [SEP] Cotton for everyday ..."
    "<think>It is cotton. Back to the item.</think><action>click[< prev]</action>"  -> the item page
    "click[royal blue]"  (no tags)  -> the same page, action_valid=False, reward 0
    "<think>Choose the color.</think><action>click[royal blue]</action>"       -> the item page
    "<think>Now the size.</think><action>click[large]</action>"                -> the item page
    "<think>Everything matches; buy.</think><action>click[buy now]</action>"
          -> "... [SEP] Thank you for shopping with us! [SEP] Purchased [SEP] B0EQCFRM6X [SEP] ...
              [SEP] Options: color: royal blue, size: large"
             reward 10.0, done, won, task_score 1.0, all four criteria passed

Buying the same shirt right after opening it (no options chosen) scores R = (3 + 0 + 1) / 6 = 0.67:
reward 0 (6.67 with ``reward_mode="score"``), and only ``options`` fails, at turn 2.
(``docs/envs_webshop.md`` shows the full, unshortened episode.)

Prompt: verl-agent's ``WEBSHOP_TEMPLATE`` / ``WEBSHOP_TEMPLATE_NO_HIS``
(``agent_system/environments/prompts/webshop.py``), rewritten here: the task, the page text after
the instruction with each part quoted (verl-agent's ``format_obs``), the admissible actions one
per line (``'search[<your query>]',`` when there is a search bar, then ``'click[<clickable>]',``),
and, after the first turn, the last ``history_length`` (observation, action) pairs as
``[Observation k: '...', Action k: '...']``. verl-agent's "e‑commerce" (non-breaking hyphen) is
written "e-commerce".

Deviations from verl-agent's WebShop: a malformed response is a no-op here (verl-agent sends the
last 20 characters of the response to WebShop, which usually ignores them), and an action that
parses but cannot run on the page is marked invalid too (verl-agent's ``is_action_valid`` looks
at the format only). ``click[search]`` is never listed (WebShop refuses it anyway).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from envs.actions import parse_think_action
from envs.base import Observation, StepResult, TextEnv, criteria_from_verdicts, register_env
from envs.options import check_bools, check_ints, known_options
from envs.webshop.catalog import SPLITS, TASK_TYPES, Catalog, Goal, generate_goal, requirement_split
from envs.webshop.engine import BUY_NOW, SEP, SearchIndex, WebShopEngine, catalog_and_index, parse_action
from envs.webshop.expert import hinted_response, shopper_response
from envs.webshop.reward import RewardBreakdown, get_reward
from pipeline.core.types import CriterionResult, Message

DEFAULT_N_TASKS = {"train": 5000, "valid": 500, "test": 500}
GOAL_ATTEMPTS = 300  # draws of a task's goal before giving up (draw_goal; a valid draw lands in valid 1 in 10)

FEEDBACK = {
    "attributes": (
        "Buy an item that has every attribute the instruction asks for: compare the instruction with "
        "the title, and open Description or Features to check the rest before buying."
    ),
    "options": (
        "Before clicking buy now, click the option value the instruction names for every option on the "
        "item page (for example its color and its size), exactly as listed."
    ),
    "price": (
        "Read the price in the results and on the item page, and only buy an item that costs less than the "
        "instruction's price limit."
    ),
    "type": (
        "Buy the kind of product the instruction names: search with its product words and open an item whose "
        "title is that product, not a related one."
    ),
}

# ----- prompt (verl-agent's WebShop template, rewritten) -----------------------------------------
_INSTRUCTION = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully which admissible "
    "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
    "tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present "
    "it within <action> </action> tags.\n"
)
WEBSHOP_TEMPLATE_NO_HIS = (
    "\nYou are an expert autonomous agent operating in the WebShop e-commerce environment. \n"
    "Your task is to: {task_description}.\n"
    "Your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n" + _INSTRUCTION
)
WEBSHOP_TEMPLATE = (
    "\nYou are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
    "Your task is to: {task_description}.\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n" + _INSTRUCTION
)


def extract_instruction(page: str) -> str:
    """The instruction of a WebShop page (the part after ``Instruction:``; "" if none)."""
    parts = page.split(SEP)
    for i, part in enumerate(parts[:-1]):
        if part.strip() == "Instruction:":
            return parts[i + 1]
    return ""


def format_page(page: str, instruction: str) -> str:
    """verl-agent's ``format_obs``: the parts after the instruction, each in single quotes."""
    parts = page.split(SEP)
    if instruction in parts:
        rest = parts[parts.index(instruction) + 1 :]
        return SEP.join(f"'{p}'" for p in rest)
    return page


def admissible_actions(available: dict) -> list[str]:
    """verl-agent's ``format_avail_actions``: ``search[<your query>]`` then ``click[...]`` per clickable."""
    actions = ["search[<your query>]"] if available.get("has_search_bar") else []
    return actions + [f"click[{c}]" for c in available.get("clickables", []) if c != "search"]


def build_messages(
    history: list[tuple[str, str]], observation: Observation, history_length: int, task_text: str
) -> list[Message]:
    """The user message of the next turn (shared by ``webshop`` and ``webshop_real``)."""
    actions = "\n".join(f"'{a}'," for a in observation.admissible_actions)
    current = format_page(observation.text, task_text)
    if not history or history_length <= 0:
        text = WEBSHOP_TEMPLATE_NO_HIS.format(
            task_description=task_text, current_observation=current, available_actions=actions
        )
    else:
        recent = history[-history_length:]
        first = len(history) - len(recent) + 1
        lines = [
            f"[Observation {first + i}: '{format_page(obs, task_text)}', Action {first + i}: '{act}']"
            for i, (obs, act) in enumerate(recent)
        ]
        text = WEBSHOP_TEMPLATE.format(
            task_description=task_text,
            step_count=len(history),
            history_length=len(recent),
            action_history="\n".join(lines),
            current_step=len(history) + 1,
            current_observation=current,
            available_actions=actions,
        )
    return [Message(role="user", content=text)]


# ----- options -------------------------------------------------------------------------------------
class RewardMode(StrEnum):
    WON = "won"  # verl-agent: success_reward if R == 1 else 0
    SCORE = "score"  # success_reward * R


@dataclass(frozen=True)
class WebShopOptions:
    """``env.options`` for ``webshop``."""

    n_products: int = 400  # catalog size, 60..20000 (three or more per product type)
    catalog_seed: int = 0  # another value generates another catalog (and other tasks)
    n_tasks: int | None = None  # tasks per split (seed % n_tasks); None = 5000 train, 500 valid, 500 test
    max_turns: int = 15  # turns per episode, >= 1 (verl-agent: 15)
    reward_mode: str = "won"  # "won" (verl-agent: 10 * [R == 1]) or "score" (success_reward * R)
    success_reward: float = 10.0  # > 0; the purchase reward scale
    reject_cjk: bool = True  # verl-agent marks responses holding CJK characters invalid

    @classmethod
    def from_dict(cls, options: dict | None) -> WebShopOptions:
        options = known_options(options, cls, "webshop")
        opts = cls(**options)
        opts.validate()
        return opts

    def validate(self) -> None:
        check_ints("webshop", self, ("n_products", "catalog_seed", "max_turns"))
        if not 60 <= self.n_products <= 20_000:
            raise ValueError(f"webshop n_products must be between 60 and 20000, got {self.n_products}")
        if self.max_turns < 1:
            raise ValueError(f"webshop max_turns must be >= 1, got {self.max_turns}")
        if self.n_tasks is not None and (
            not isinstance(self.n_tasks, int) or isinstance(self.n_tasks, bool) or self.n_tasks < 1
        ):
            raise ValueError(f"webshop n_tasks must be null or an int >= 1, got {self.n_tasks!r}")
        check_reward_options("webshop", self)

    def n_tasks_for(self, split: str) -> int:
        return DEFAULT_N_TASKS[split] if self.n_tasks is None else self.n_tasks


def check_reward_options(env_name: str, opts) -> None:
    """The options ``webshop`` and ``webshop_real`` share: reward_mode, success_reward, reject_cjk."""
    if opts.reward_mode not in set(RewardMode):
        raise ValueError(
            f"{env_name} reward_mode must be one of {[m.value for m in RewardMode]}, got {opts.reward_mode!r}"
        )
    scale = opts.success_reward
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"{env_name} success_reward must be a number > 0, got {scale!r}")
    check_bools(env_name, opts, ("reject_cjk",))


def draw_goal(catalog: Catalog, index: SearchIndex, split: str, task_index: int) -> Goal:
    """The goal of task ``task_index`` of ``split``: the first draw (``generate_goal``, attempt 0,
    1, ...) whose requirement belongs to ``split`` (``catalog.requirement_split``) and whose
    target is among the top 50 results of its own instruction (so search can solve it)."""
    for attempt in range(GOAL_ATTEMPTS):
        goal = generate_goal(catalog, split, task_index, attempt)
        if requirement_split(goal) == split and index.rank(goal.instruction, goal.asin) is not None:
            return goal
    raise RuntimeError(
        f"webshop: none of {GOAL_ATTEMPTS} draws for task {task_index} of split {split!r} "
        f"(catalog {catalog.key}) has a {split} requirement and is found by its own "
        f"instruction; try another catalog_seed or a larger n_products"
    )


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown webshop split {split!r}; choose one of {list(SPLITS)}")


def purchase_reward(score: RewardBreakdown, mode: str, success_reward: float) -> float:
    """The step reward of a purchase: verl-agent's ``success_reward * won``, or ``success_reward * R``."""
    return success_reward * (float(score.won) if mode == RewardMode.WON else score.total)


def criteria_from_breakdown(score: RewardBreakdown | None, item_turn: int, buy_turn: int) -> list[CriterionResult]:
    """One verdict per reward term; with no purchase (``score is None``) all fail at ``buy_turn``."""
    if score is None:
        verdicts = {c: (False, buy_turn) for c in FEEDBACK}
    else:
        verdicts = {
            "attributes": (score.n_att == score.n_goal_att, item_turn),
            "options": (score.n_opt >= score.n_goal_opt, buy_turn),
            "price": (score.price_ok, item_turn),
            "type": (score.r_type == 1.0, item_turn),
        }
    return criteria_from_verdicts(verdicts, FEEDBACK)


@register_env("webshop")
class WebShopEnv(TextEnv):
    max_turns = 15
    invalid_action_penalty = 0.1
    success_reward = 10.0

    def __init__(self, options: WebShopOptions, split: str) -> None:
        self.options = options
        self.split = split
        self.max_turns = options.max_turns
        self.success_reward = float(options.success_reward)
        self.catalog, self.index = catalog_and_index(options.catalog_seed, options.n_products)
        self.engine: WebShopEngine | None = None
        self.goal: Goal | None = None
        self._obs: Observation | None = None
        self._turn = 0
        self._item_turn = 0  # turn that opened the item on screen
        self._done = False
        self.score: RewardBreakdown | None = None

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: dict, split: str) -> WebShopEnv:
        opts = WebShopOptions.from_dict(options)
        check_split(split)
        return cls(opts, split)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        WebShopOptions.from_dict(options)

    # ----- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        index = int(seed) % self.options.n_tasks_for(self.split)
        self.goal = goal = draw_goal(self.catalog, self.index, self.split, index)
        # e.g. ``i need a shampoo that is sulfate free with ..., and price lower than 30.00 dollars``
        self.task_text = goal.instruction
        self.task_type = goal.category  # the target's top-level category slug: one of ``catalog.TASK_TYPES``
        self.task_id = f"webshop/{self.split}/{index}/{self.catalog.key}"
        self.engine = WebShopEngine(self.catalog, self.index, goal.instruction)
        self._turn, self._item_turn, self._done, self.score = 0, 0, False, None
        self._obs = self._observation()
        return self._obs

    def privileged_hint(self) -> str | None:
        """The target product the instruction was written from (the ``hints`` context kind)."""
        g = self.goal
        if g is None:
            return None
        opts = ", ".join(f"{k}: {v}" for k, v in sorted(g.options.items()))
        return f"The item to buy is {g.asin.lower()} ({g.name}); search for: {g.query}." + (
            f" Choose {opts}." if opts else ""
        )

    def expert_response(self) -> str | None:
        """The shopper that does not know the target (``envs/webshop/expert.py``), or None after the purchase."""
        return None if self.engine is None or self._done else shopper_response(self.engine, self.goal)

    def hinted_expert_response(self) -> str | None:
        """The shopper that knows the hint: the hint's query, then straight to the target."""
        return None if self.engine is None or self._done else hinted_response(self.engine, self.goal)

    def _observation(self) -> Observation:
        return Observation(
            text=self.engine.observation(), admissible_actions=admissible_actions(self.engine.get_available_actions())
        )

    def step(self, response: str) -> StepResult:
        self.check_step(started=self.engine is not None and self._obs is not None, done=self._done)
        parsed = parse_think_action(response, forbid_cjk=self.options.reject_cjk)
        reason = parsed.reason
        if not reason:
            before = self.engine.state.asin
            ok, why = self.engine.execute(parsed.action)
            reason = "" if ok else why
            if ok and self.engine.state.asin and self.engine.state.asin != before:
                self._item_turn = self._turn
        turn, self._turn = self._turn, self._turn + 1
        reward, won = 0.0, False
        if not reason:
            self._obs = self._observation()
        if self.engine.done:
            product, chosen = self.engine.purchase
            self.score = get_reward(product, self.goal, chosen)
            won = self.score.won
            reward = purchase_reward(self.score, self.options.reward_mode, self.success_reward)
        self._done = self.engine.done or self._turn >= self.max_turns
        criteria = criteria_from_breakdown(self.score, self._item_turn, turn) if self._done else []
        info = {
            "turn": self._turn,
            "invalid_reason": reason,
            "task_id": self.task_id,
            "task_score": self.score.total if self.score else 0.0,
        }
        if self.score is not None:
            info["purchased"] = self.engine.purchase[0].asin
            info["reward_terms"] = asdict(self.score)
        return StepResult(
            observation=self._obs,
            reward=reward,
            done=self._done,
            won=won,
            action_valid=not reason,
            action=parsed.action,
            criteria=criteria,
            info=info,
        )

    # ----- task metadata -------------------------------------------------------------------------
    def get_available_actions(self) -> dict:
        """WebShop's ``{"has_search_bar", "clickables"}`` of the current page."""
        return self.engine.get_available_actions()

    def expert_actions(self) -> list[str]:
        """A scripted shopper's remaining plan from a fresh episode: search the instruction, page to the
        target, open it, choose the goal's options, buy. (For tests and demonstrations.)"""
        rank = self.index.rank(self.goal.instruction, self.goal.asin)
        if rank is None:
            raise RuntimeError(f"task {self.task_id}: its instruction does not find the target")
        plan = [f"search[{self.goal.instruction}]"] + ["click[next >]"] * (rank // 10)
        plan.append(f"click[{self.goal.asin.lower()}]")
        plan += [f"click[{v}]" for v in self.goal.options.values()]
        return plan + [f"click[{BUY_NOW}]"]

    def build_messages(self, history, observation, history_length) -> list[Message]:
        return build_messages(history, observation, history_length, self.task_text)


__all__ = [
    "FEEDBACK",
    "TASK_TYPES",
    "WebShopEnv",
    "WebShopOptions",
    "admissible_actions",
    "build_messages",
    "extract_instruction",
    "format_page",
    "parse_action",
]
