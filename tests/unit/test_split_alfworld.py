"""alfworld: held-out games never ask what a train game asks in the same room, checked as sets.

What decides a generated game's solution is its floor plan, task type, goal object type and goal
receptacle (or lamp) type, then where the objects lie. The test enumerates the generator's
problem descriptions (``generator.problem_for``: the pure function ``get_game`` plans, without
the planner) for thousands of games per split and checks, as sets, that no ``valid_seen`` goal
key (floor plan, task type, object type, receptacle type, lamp type) is a ``train`` one,
that ``valid_seen`` draws from the training rooms and ``valid_unseen`` from other rooms.
"""

from __future__ import annotations

from collections import Counter

import pytest

from envs.alfworld import generator
from envs.alfworld.generator import SPLITS, TASK_TYPES, SceneLimits, problem_for, split_floorplans

CASES = {  # limits -> games per task type and split
    SceneLimits(max_receptacles=8, max_objects=8): 1000,  # conf/env/alfworld.yaml's scenes
    SceneLimits(seed=1): 400,  # whole floor plans (alfworld_paper), another task pool
}


def key(p) -> tuple:
    return (p.floorplan, p.task_type, p.obj, p.recep, p.toggle)


def layout(p) -> tuple:
    """Everything the solution depends on: the goal key, the receptacles and where each object lies."""
    return key(p) + (tuple(sorted(r.id for r in p.receptacles)), tuple(sorted((t, h.id) for _, t, h in p.objects)))


@pytest.mark.parametrize("limits", list(CASES), ids=["small_scenes", "whole_floor_plans_seed1"])
def test_held_out_goal_keys_and_rooms_never_occur_in_train(limits):
    n = CASES[limits]
    problems = {s: [problem_for(limits, s, t, i) for t in TASK_TYPES for i in range(n)] for s in SPLITS}
    keys = {s: {key(p) for p in problems[s]} for s in SPLITS}
    rooms = {s: {p.floorplan for p in problems[s]} for s in SPLITS}
    shared = keys["valid_seen"] & keys["train"]
    assert not shared, (
        f"{len(shared)} of {len(keys['valid_seen'])} valid_seen goal keys are train's, e.g. {sorted(shared)[:3]}"
    )
    assert not keys["valid_unseen"] & keys["train"] and not keys["valid_unseen"] & keys["valid_seen"]
    assert not rooms["valid_unseen"] & (rooms["train"] | rooms["valid_seen"])
    assert rooms["valid_seen"] <= set(split_floorplans("train"))
    assert rooms["valid_unseen"] <= set(split_floorplans("valid_unseen"))
    assert keys["valid_seen"] != keys["valid_unseen"]
    layouts = {s: {layout(p) for p in problems[s]} for s in SPLITS}
    assert not layouts["valid_seen"] & layouts["train"]  # implied by the keys; the finer unit too
    for s in SPLITS:
        assert Counter(p.task_type for p in problems[s]) == {t: n for t in TASK_TYPES}
        assert len(keys[s]) > n  # thousands of games over many goals, not a few repeated
    assert len(rooms["valid_seen"]) >= 90 and len(rooms["train"]) == 96  # "seen": the training rooms
    assert len(rooms["valid_unseen"]) == 24


def test_get_game_plays_the_problem_described(tmp_path):
    limits = SceneLimits(max_receptacles=6, max_objects=6)
    for split in SPLITS:
        record = generator.get_game(limits, split, "pick_and_place_simple", 0, str(tmp_path))
        p = problem_for(limits, split, "pick_and_place_simple", 0)
        assert (record.floorplan, record.task_desc) == (p.floorplan, p.task_desc)
