"""webshop: held-out goals share no target product and no requirement with train, checked as sets.

Goals are drawn as the env draws them (``env.draw_goal``: ``catalog.generate_goal`` redrawn until
the requirement is of the split and the instruction finds its target), for thousands of task
indices per split (the env uses the first 5,000 train and 500 valid / test indices by default).
A goal's requirement (product type, attribute set, option values) is what decides which products
earn its full reward; each requirement belongs to one split, so a valid or test instruction is
never a train instruction with another price or sentence.
"""

from __future__ import annotations

from collections import Counter

import pytest

from envs import make_env
from envs.webshop.catalog import SPLITS, TASK_TYPES, requirement
from envs.webshop.engine import catalog_and_index
from envs.webshop.env import draw_goal

HELD_OUT = ("valid", "test")
N_GOALS = 2000  # per split


def goals_of(catalog_seed: int, n_products: int) -> dict[str, list]:
    catalog, index = catalog_and_index(catalog_seed, n_products)
    return {s: [draw_goal(catalog, index, s, i) for i in range(N_GOALS)] for s in SPLITS}


# (catalog seed, products) -> split -> distinct (targets, requirements, instructions) of N_GOALS goals
EXPECTED = {
    (0, 400): {"train": (319, 1664, 1987), "valid": (37, 265, 1546), "test": (40, 271, 1543)},
    (1, 2000): {"train": (1119, 1747, 1995), "valid": (189, 708, 1877), "test": (191, 731, 1858)},
}


@pytest.mark.parametrize("catalog_seed, n_products", sorted(EXPECTED))
def test_held_out_targets_requirements_and_instructions_never_occur_in_train(catalog_seed, n_products):
    catalog, _ = catalog_and_index(catalog_seed, n_products)
    goals = goals_of(catalog_seed, n_products)
    targets = {s: {g.asin for g in goals[s]} for s in SPLITS}
    needs = {s: {requirement(g) for g in goals[s]} for s in SPLITS}
    texts = {s: {g.instruction for g in goals[s]} for s in SPLITS}
    for s in SPLITS:
        assert targets[s] <= set(catalog.targets[s])  # every target is from the split's own pool
        assert {g.category for g in goals[s]} == set(TASK_TYPES)
        assert set(Counter(len(g.attributes) for g in goals[s])) == {1, 2, 3}
    for s in HELD_OUT:
        assert not targets[s] & targets["train"], f"{s} targets that are train targets: {targets[s] & targets['train']}"
        shared = needs[s] & needs["train"]
        assert not shared, (
            f"{len(shared)} of {len(needs[s])} {s} requirements are also train requirements, e.g. {sorted(shared)[:3]}"
        )
        shared = texts[s] & texts["train"]
        assert not shared, f"{len(shared)} {s} instructions are train instructions, e.g. {sorted(shared)[:2]}"
    assert targets["valid"] != targets["test"]
    assert not targets["valid"] & targets["test"] and not needs["valid"] & needs["test"]
    assert not set(catalog.targets["valid"]) & set(catalog.targets["test"])
    for s in SPLITS:
        assert (len(targets[s]), len(needs[s]), len(texts[s])) == EXPECTED[(catalog_seed, n_products)][s], s


def test_the_env_draws_these_goals():
    catalog, index = catalog_and_index(0, 400)
    for s in SPLITS:
        env = make_env("webshop", {}, split=s)
        for seed in (0, 7, 499, 500):
            env.reset(seed)
            n = {"train": 5000}.get(s, 500)
            assert env.goal == draw_goal(catalog, index, s, seed % n)
