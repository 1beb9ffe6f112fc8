"""WebShop: an offline shop in WebShop's format (generated catalog, ``search[...]`` / ``click[...]``,
WebShop's reward formula), and an adapter over the real WebShop for users who have it.

Importing this package registers the ``webshop`` env (``envs.make_env("webshop", options, split)``).
Modules: ``catalog`` (products and instructions), ``engine`` (pages, BM25 search), ``reward``
(WebShop's reward formula), ``env`` (the ``TextEnv`` and verl-agent's prompt), ``adapter``
(``webshop_real``, registered when ``envs.webshop.adapter`` is imported).
"""

from envs.webshop.catalog import SPLITS, TASK_TYPES, Catalog, Goal, Product, build_catalog, generate_goal
from envs.webshop.env import FEEDBACK, WebShopEnv, WebShopOptions
from envs.webshop.reward import RewardBreakdown, get_reward

__all__ = [
    "Catalog",
    "FEEDBACK",
    "Goal",
    "Product",
    "RewardBreakdown",
    "SPLITS",
    "TASK_TYPES",
    "WebShopEnv",
    "WebShopOptions",
    "build_catalog",
    "generate_goal",
    "get_reward",
]
