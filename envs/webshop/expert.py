"""WebShop's experts for the warm start, in verl-agent's strict ``<think>..</think><action>..</action>``.

Both read the current page off the engine, so either can take over an episode at any state.

* **The shopper** (``shopper_response``, ``WebShopEnv.expert_response``) does not know the
  target: it searches the instruction, opens the first listed item that satisfies the
  instruction (what a careful shopper finds by reading the title, the price and the item's
  pages: WebShop's reward of buying it with the instruction's options is 1), pages on when none
  on the page does, picks the instruction's options and buys. Any such item wins, as in WebShop.
* **The hinted shopper** (``hinted_response``) knows ``privileged_hint()``: it searches the
  hint's query (the instruction when that query does not list the target), pages straight to
  the target item, picks the options and buys.
"""

from __future__ import annotations

from envs.webshop.catalog import Goal, Product
from envs.webshop.engine import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, Page, WebShopEngine
from envs.webshop.reward import get_reward


def _say(reason: str, action: str) -> str:
    return f"<think>{reason}</think><action>{action}</action>"


def wanted_options(product: Product, goal: Goal) -> dict[str, str]:
    """The instruction's options that ``product`` offers (name -> value)."""
    return {n: v for n, v in goal.options.items() if v in product.options.get(n, ())}


def satisfies(product: Product, goal: Goal) -> bool:
    """Buying ``product`` with the instruction's options scores WebShop's full reward."""
    return get_reward(product, goal, wanted_options(product, goal)).won


def shopper_response(engine: WebShopEngine, goal: Goal) -> str | None:
    s = engine.state
    if s.page is Page.DONE:
        return None
    if s.page is Page.SEARCH:
        return _say("I search for what the instruction describes.", f"search[{goal.instruction}]")
    if s.page is Page.RESULTS:
        for asin in engine.shown():
            p = engine.catalog.by_asin[asin]
            if satisfies(p, goal):
                return _say(
                    f"{p.title} costs ${p.price:.2f}, under the limit, and has what the instruction asks for: open it.",
                    f"click[{asin.lower()}]",
                )
        return _page_on(engine, "No item on this page matches the instruction")
    return _on_item(engine, goal, satisfies(engine.product, goal))


def hinted_response(engine: WebShopEngine, goal: Goal) -> str | None:
    s = engine.state
    target = goal.asin.lower()
    if s.page is Page.DONE:
        return None
    if s.page is Page.SEARCH:
        query = goal.query if goal.query and engine.index.rank(goal.query, goal.asin) is not None else goal.instruction
        return _say("The hint says what to search for.", f"search[{query}]")
    if s.page is Page.RESULTS:
        if target in engine.get_available_actions()["clickables"]:
            return _say(f"The hint names {target}: open it.", f"click[{target}]")
        return _page_on(engine, f"{target} is not on this page")
    return _on_item(engine, goal, s.asin.lower() == target)


def _page_on(engine: WebShopEngine, why: str) -> str:
    if NEXT_PAGE in engine.get_available_actions()["clickables"]:
        return _say(f"{why}: the next page.", f"click[{NEXT_PAGE}]")
    return _say(f"{why}, and it is the last page: search again.", f"click[{BACK_TO_SEARCH}]")


def _on_item(engine: WebShopEngine, goal: Goal, right_item: bool) -> str:
    s = engine.state
    if s.page is Page.SUB or not right_item:
        why = "Back to the item." if s.page is Page.SUB else "This item does not match the instruction: back."
        return _say(why, f"click[{PREV_PAGE}]")
    for name, value in wanted_options(engine.product, goal).items():
        if s.options.get(name) != value:
            return _say(f"The instruction asks for {name}: {value}.", f"click[{value}]")
    return _say("The item matches and its options are chosen: buy it.", f"click[{BUY_NOW}]")
