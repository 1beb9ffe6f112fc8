"""``webshop_real``: the same protocol over the original WebShop (``web_agent_site.envs.WebAgentTextEnv``).

For users who have WebShop installed (princeton-nlp/WebShop: its code, its product and goal
files, and spaCy's ``en_core_web_lg``). WebShop is licensed for academic research only, not for
commercial use, so it is never vendored or installed by privy-rl; constructing this env without
it raises a ``RuntimeError`` that says how to install it.

Same parser, validity rules, prompt and reward scale as ``webshop`` (``envs/webshop/env.py``):
the response is parsed with ``envs.actions.parse_think_action``; a malformed response, or an
action WebShop cannot run on the page (``search`` without a search bar, a click on something not
in ``get_available_actions()["clickables"]``), is an invalid no-op and is not sent to WebShop;
``click[buy now]`` ends the episode and pays ``success_reward * [R == 1]`` (verl-agent) or
``success_reward * R`` (``reward_mode="score"``), with R = WebShop's own reward. Criteria come from
WebShop's verbose reward info (``r_att``, ``r_option``, ``r_price``, ``r_type``) of the session.

Task selection follows WebShop's own goal split (``baseline_models``/``run_envs``): goals 0-499
are ``test``, 500-1499 ``valid``, the rest ``train``; ``reset(seed)`` plays goal
``start + seed % size`` of the split. One WebShop server (1.18 M products: minutes and tens of GB
to load) is built per process and shared by every env of that process.

Example::

    env = make_env("webshop_real", {"webshop_path": "/opt/WebShop"}, split="test")
    obs = env.reset(seed=0)   # "WebShop [SEP] Instruction: [SEP] i need ... [SEP] Search"
    env.step("<think>...</think><action>search[long clip-in hair extension]</action>")
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from dataclasses import dataclass

from envs.actions import parse_think_action
from envs.base import Observation, StepResult, TextEnv, criteria_from_verdicts, register_env
from envs.options import check_bools, check_ints, known_options
from envs.webshop.engine import BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, parse_action
from envs.webshop.env import (
    FEEDBACK,
    RewardMode,
    admissible_actions,
    build_messages,
    check_reward_options,
    check_split,
    extract_instruction,
)
from pipeline.core.types import CriterionResult, Message

INSTALL_HELP = (
    "webshop_real needs the original WebShop (package web_agent_site), which privy-rl does not ship: "
    "its licence allows academic research only, no commercial use. To use it: "
    "git clone https://github.com/princeton-nlp/WebShop && cd WebShop && ./setup.sh -d all "
    "(installs its requirements, downloads the product and goal data from Google Drive, and spaCy's "
    "en_core_web_lg; its search engine needs Java), then set env.options.webshop_path to that folder "
    "(or put it on PYTHONPATH). Without it, use the offline env: env.name=webshop."
)

# WebShop's goal index ranges per split (its baseline scripts: test 0-499, eval 500-1499, train 1500+).
GOAL_RANGES = {"test": (0, 500), "valid": (500, 1500), "train": (1500, None)}

_SERVER = None  # one WebShop server per process, shared by all envs


@dataclass(frozen=True)
class WebShopRealOptions:
    """``env.options`` for ``webshop_real``."""

    webshop_path: str | None = None  # folder of the WebShop checkout, added to sys.path
    num_products: int | None = None  # WebShop's num_products (None = all 1.18 M; 1000 = its small set)
    human_goals: bool = True  # WebShop's human instructions (True) or its synthetic ones
    max_turns: int = 15  # turns per episode, >= 1 (verl-agent: 15)
    reward_mode: str = "won"  # "won" (10 * [R == 1], verl-agent) or "score" (success_reward * R)
    success_reward: float = 10.0
    reject_cjk: bool = True

    @classmethod
    def from_dict(cls, options: dict | None) -> WebShopRealOptions:
        opts = cls(**known_options(options, cls, "webshop_real"))
        if opts.webshop_path is not None and not isinstance(opts.webshop_path, str):
            raise ValueError(f"webshop_real webshop_path must be a folder path or null, got {opts.webshop_path!r}")
        if opts.num_products is not None and (not isinstance(opts.num_products, int) or opts.num_products < 1):
            raise ValueError(f"webshop_real num_products must be null or an int >= 1, got {opts.num_products!r}")
        check_ints("webshop_real", opts, ("max_turns",))
        if opts.max_turns < 1:
            raise ValueError(f"webshop_real max_turns must be >= 1, got {opts.max_turns}")
        check_reward_options("webshop_real", opts)
        check_bools("webshop_real", opts, ("human_goals",))
        return opts


def require_webshop(webshop_path: str | None = None) -> None:
    """Raise RuntimeError (with install instructions) unless ``web_agent_site`` can be imported."""
    if webshop_path and webshop_path not in sys.path:
        sys.path.append(webshop_path)
    try:
        found = importlib.util.find_spec("web_agent_site") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise RuntimeError(INSTALL_HELP)


_instances = itertools.count()


def _make_env(opts: WebShopRealOptions):
    """A WebAgentTextEnv on the process's shared server (built by the first call), with its own
    session prefix so that the G copies of a GRPO group, which play the same goal, never share a
    session. WebShop picks the goal from the integer passed to ``reset(session=...)``."""
    global _SERVER
    from web_agent_site.envs import WebAgentTextEnv

    kwargs = dict(
        observation_mode="text",
        num_products=opts.num_products,
        human_goals=opts.human_goals,
        session_prefix=f"privy{next(_instances)}_",
    )
    env = WebAgentTextEnv(server=_SERVER, **kwargs) if _SERVER is not None else WebAgentTextEnv(**kwargs)
    _SERVER = env.server
    return env


# WebShop's goal categories -> our task types (best effort; "" when unknown).
_CATEGORY_TO_TASK_TYPE = {
    "beauty": "beauty",
    "fashion": "fashion",
    "electronics": "electronics",
    "food": "grocery",
    "grocery": "grocery",
    "furniture": "home",
    "home": "home",
}


@register_env("webshop_real")
class WebShopRealEnv(TextEnv):
    max_turns = 15
    invalid_action_penalty = 0.1
    success_reward = 10.0

    def __init__(self, options: WebShopRealOptions, split: str) -> None:
        check_split(split)
        require_webshop(options.webshop_path)
        self.options = options
        self.split = split
        self.max_turns = options.max_turns
        self.success_reward = float(options.success_reward)
        self.env = _make_env(options)
        self._obs: Observation | None = None
        self._turn = 0
        self._item_turn = 0
        self._done = False

    @classmethod
    def from_options(cls, options: dict, split: str) -> WebShopRealEnv:
        return cls(WebShopRealOptions.from_dict(options), split)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        opts = WebShopRealOptions.from_dict(options)
        require_webshop(opts.webshop_path)

    def _goal_index(self, seed: int) -> int:
        start, end = GOAL_RANGES[self.split]
        end = len(self.env.server.goals) if end is None else min(end, len(self.env.server.goals))
        if end <= start:
            raise RuntimeError(f"WebShop has {len(self.env.server.goals)} goals: none in split {self.split!r}")
        return start + int(seed) % (end - start)

    def _observation(self, text: str) -> Observation:
        return Observation(text=text, admissible_actions=admissible_actions(self.env.get_available_actions()))

    def reset(self, seed: int) -> Observation:
        index = self._goal_index(seed)
        text, _ = self.env.reset(session=index)
        self.task_text = extract_instruction(text) or self.env.instruction_text
        self.task_id = f"webshop_real/{self.split}/{index}"
        self._turn, self._item_turn, self._done = 0, 0, False
        goal = self.env.server.user_sessions.get(self.env.session, {}).get("goal", {})
        # The goal's WebShop category mapped to ours (food -> grocery, furniture -> home; "" if unknown).
        self.task_type = _CATEGORY_TO_TASK_TYPE.get(str(goal.get("category", "")).lower(), "")
        self._obs = self._observation(text)
        return self._obs

    def _runnable(self, action: str) -> str:
        """Why WebShop would ignore ``action`` on the current page ("" if it would run it)."""
        parsed = parse_action(action)
        if parsed is None:
            return "not of the form search[...] or click[...]"
        avail = self.env.get_available_actions()
        if parsed[0] == "search":
            return "" if avail["has_search_bar"] else "no search bar on this page"
        if parsed[1] == "search" or parsed[1] not in avail["clickables"]:
            return f"{parsed[1]!r} is not clickable on this page"
        return ""

    def step(self, response: str) -> StepResult:
        self.check_step(started=self._obs is not None, done=self._done)
        parsed = parse_think_action(response, forbid_cjk=self.options.reject_cjk)
        reason = parsed.reason or self._runnable(parsed.action)
        turn, self._turn = self._turn, self._turn + 1
        reward, score, won, bought, session = 0.0, 0.0, False, False, self.env.session
        if not reason:
            opens_item = self._opens_item(parsed.action)
            text, score, bought, _ = self.env.step(parsed.action)  # WebShop starts a new session after a purchase
            if bought:
                self._obs = Observation(text=text)
                won = score == 1.0
                reward = self.success_reward * (float(won) if self.options.reward_mode == RewardMode.WON else score)
            else:
                self._obs = self._observation(text)
                if opens_item:
                    self._item_turn = turn
        self._done = bought or self._turn >= self.max_turns
        criteria = self._criteria(session, bought, turn) if self._done else []
        return StepResult(
            observation=self._obs,
            reward=reward,
            done=self._done,
            won=won,
            action_valid=not reason,
            action=parsed.action,
            criteria=criteria,
            info={"turn": self._turn, "invalid_reason": reason, "task_id": self.task_id, "task_score": float(score)},
        )

    def _opens_item(self, action: str) -> bool:
        """Whether ``action`` clicks a product link on a results page."""
        name, arg = parse_action(action)
        return (
            name == "click"
            and "search_results" in str(self.env.browser.current_url)
            and arg not in (BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE)
        )

    def _criteria(self, session: str, bought: bool, turn: int) -> list[CriterionResult]:
        info = self.env.server.user_sessions.get(session, {}).get("verbose_info", {}) if bought else {}
        passed = {
            "attributes": info.get("r_att", 0.0) == 1.0,
            "options": info.get("r_option", 1.0 if info else 0.0) == 1.0,
            "price": bool(info.get("r_price", False)),
            "type": info.get("r_type", 0.0) == 1.0,
        }
        where = {"attributes": self._item_turn, "options": turn, "price": self._item_turn, "type": self._item_turn}
        if not bought:
            where = dict.fromkeys(where, turn)
        return criteria_from_verdicts({c: (ok, where[c]) for c, ok in passed.items()}, FEEDBACK)

    def build_messages(self, history, observation, history_length) -> list[Message]:
        return build_messages(history, observation, history_length, self.task_text)

    def close(self) -> None:
        """Drop this env's sessions from the shared server (it never forgets them by itself)."""
        env = getattr(self, "env", None)
        if env is not None and env.session_prefix:
            for key in [k for k in env.server.user_sessions if str(k).startswith(env.session_prefix)]:
                del env.server.user_sessions[key]
