"""WebShop's purchase reward (``web_agent_site/engine/goal.py::get_reward``), re-implemented.

    R = r_type * (N_att + N_opt + [price <= price_upper]) / (|goal attributes| + |goal options| + 1)

* ``N_att``: goal attributes matched by some product attribute with
  ``rapidfuzz.fuzz.token_set_ratio > 85``, or found (as a substring) in the lower-cased title,
  bullets or description.
* ``N_opt``: chosen options, colour-normalised (``catalog.normalize_color``), that match a
  colour-normalised goal option: exact membership for an option named ``size``,
  ``token_set_ratio > 85`` otherwise, or else a substring of the product text.
* ``r_type``: ``match`` = same query, or at least two shared ``›`` category levels, or
  ``title_score > 0.2``; ``r_type`` = 1 if ``match`` else 0.5; then 0.1 if ``title_score < 0.1``;
  then 0 if ``title_score == 0``.
* Success (``won``) is ``R == 1``; papers report score = mean 100 * R.

Deviations from the original:

* **Title score without spaCy.** WebShop's ``title_score`` is the fraction of the goal title's
  NOUN/PROPN tokens (spaCy ``en_core_web_lg``) that also occur in the purchased title. Here it
  is the fraction of the goal title's *content words* (lower-case alphanumeric words of two or
  more characters, minus a small stop-word list) found in the purchased title: no tagger, so
  adjectives and numbers count too. A goal title without content words scores 0.2, as WebShop
  scores a title without nouns.
* ``N_opt`` is capped at ``|goal options|``. WebShop counts matches over the *purchased* options,
  so a product with more options than the goal could push R above 1; here R stays in [0, 1].
* rapidfuzz's ``token_set_ratio`` with ``default_process`` (lower-case, non-alphanumerics to
  spaces), which is what thefuzz's ``full_process=True`` default does (thefuzz wraps rapidfuzz),
  and our own colour set (see ``catalog.COLOR_SET``).

Example (a goal with two attributes and two options, the right product)::

    >>> get_reward(target, goal, options=goal.options).total        # doctest: +SKIP
    1.0
    >>> get_reward(target, goal, options={}).total  # no options chosen: (2+0+1)/5  # doctest: +SKIP
    0.6
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rapidfuzz import fuzz, utils

from envs.webshop.catalog import Goal, Product, normalize_color

FUZZY_THRESHOLD = 85  # token_set_ratio must be strictly above this
EXACT_MATCH_OPTIONS = ("size",)

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset("an and are as at be by for from in into is it its of on or the to with without".split())


def fuzzy_match(a: str, b: str) -> bool:
    """thefuzz's ``token_set_ratio(a, b) > 85`` with its default preprocessing."""
    return fuzz.token_set_ratio(a, b, processor=utils.default_process) > FUZZY_THRESHOLD


def content_words(text: str) -> set[str]:
    """Lower-case alphanumeric words of two or more characters of ``text``, minus stop words."""
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOPWORDS}


@dataclass(frozen=True, slots=True)
class RewardBreakdown:
    """Every term of the reward, so each can become a criterion."""

    total: float  # R in [0, 1]
    r_type: float  # 0, 0.1, 0.5 or 1
    n_att: int  # goal attributes matched
    n_goal_att: int
    n_opt: int  # goal options matched (capped at n_goal_opt)
    n_goal_opt: int
    price_ok: bool
    query_match: bool
    category_match: bool
    title_score: float

    @property
    def won(self) -> bool:
        return self.total == 1.0


def type_reward(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """(r_type, query_match, category_match, title_score)."""
    query_match = product.query == goal.query
    bought = {x.strip() for x in product.product_category.split("›")}
    wanted = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(bought & wanted) >= 2
    desired = content_words(goal.name)
    title_score = len(content_words(product.title) & desired) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal: Goal) -> int:
    text = product.reward_text()
    n = 0
    for wanted in goal.attributes:
        if any(fuzzy_match(have, wanted) for have in product.attributes) or wanted in text:
            n += 1
    return n


def option_matches(product: Product, goal: Goal, options: dict[str, str]) -> int:
    wanted = [normalize_color(v) for v in goal.options.values()]
    text = product.reward_text()
    n = 0
    for name, value in options.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in wanted
        else:
            matched = any(fuzzy_match(w, value) for w in wanted)
        if matched or value in text:
            n += 1
    return min(n, len(wanted))


def get_reward(product: Product, goal: Goal, options: dict[str, str], price: float | None = None) -> RewardBreakdown:
    """Score buying ``product`` with the chosen ``options`` (option name -> value) against ``goal``."""
    price = product.price if price is None else price
    r_type, query_match, category_match, title_score = type_reward(product, goal)
    n_att = attribute_matches(product, goal)
    n_opt = option_matches(product, goal, options)
    price_ok = price <= goal.price_upper
    denominator = len(goal.attributes) + len(goal.options) + 1
    total = r_type * (n_att + n_opt + int(price_ok)) / denominator
    return RewardBreakdown(
        total=total,
        r_type=r_type,
        n_att=n_att,
        n_goal_att=len(goal.attributes),
        n_opt=n_opt,
        n_goal_opt=len(goal.options),
        price_ok=price_ok,
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
    )
