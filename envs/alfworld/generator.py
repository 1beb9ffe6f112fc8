"""Render sampled tasks as ALFRED game directories, verify them with the engine, cache them.

A game is identified by (limits, split, task type, index within the type). Its directory,
``<cache_dir>/v<GENERATOR_VERSION>-<hash of limits + alfworld version>/<split>/<task_type>/<index>/``,
holds what ALFWorld's own tooling reads (``AlfredTWEnv`` would collect it as a data set):

    game.tw-pddl        {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
    traj_data.json      task_type, pddl_params (ALFWorld's handcoded expert reads these), scene
    initial_state.pddl  the problem alone

The grammar is the wheel's ``alfred.twl2`` with ``UNKNOWN GOAL`` replaced by the task sentence
(what ``alfworld.agents.utils.misc.add_task_to_grammar`` does, minus its unseeded template draw).
Before a game is cached, Fast Downward plans it (``_plan``) and the plan is replayed in the full
game (``_check``): the goal must be false at reset and the replay must win. A draw that fails is
redrawn from the same random stream, as is a draw whose goal key (floor plan, task type, goal
types) belongs to another split (``scenes.goal_split``). The problems tried, in order, are
``problem_candidates`` (no planner, no files: what tests enumerate by the thousand); the game is
the first the planner solves. Generation is a pure function of the key, so a re-run, or
another process racing on the same key, writes the same bytes; files are written to a temporary
directory and renamed into place.

Excerpt of a generated ``initial_state.pddl`` (train ``pick_and_place_simple`` #0 with
``max_receptacles=8, max_objects=8``, FloorPlan326, "put some creditcard on shelf")::

    (:objects
        agent1 - agent
        CreditCardType - otype ...  ShelfType - rtype ...
        CreditCard_bar__plus_02_dot_20_bar__minus_00_dot_38_bar__plus_01_dot_67 - object
        Shelf_bar__plus_00_dot_92_bar__plus_01_dot_13_bar__minus_02_dot_16 - receptacle ...
    (:init
        (atLocation agent1 loc_bar_0_bar_0_bar_0_bar_0)
        (receptacleType Shelf_bar__plus_00_dot_92_bar__plus_01_dot_13_bar__minus_02_dot_16 ShelfType)
        (receptacleAtLocation Shelf_bar__plus_00_dot_92_bar__plus_01_dot_13_bar__minus_02_dot_16 loc_bar_1_bar__minus_9_bar_1_bar_30)
        (canContain ShelfType CreditCardType) ...
        (objectType CreditCard_bar__plus_02_dot_20_bar__minus_00_dot_38_bar__plus_01_dot_67 CreditCardType)
        (inReceptacle CreditCard_bar__plus_02_dot_20_bar__minus_00_dot_38_bar__plus_01_dot_67 DiningTable_bar__plus_03_dot_16_bar__minus_00_dot_01_bar__minus_01_dot_42)
        (pickupable CreditCard_bar__plus_02_dot_20_bar__minus_00_dot_38_bar__plus_01_dot_67) ...
    (:goal (and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r)
        (objectType ?o CreditCardType) (receptacleType ?r ShelfType))))))
    (:metric minimize (total-cost))

Its walkthrough: go to diningtable 1, take creditcard 1 from diningtable 1, go to shelf 3,
move creditcard 1 to shelf 3.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import alfworld.gen.constants as C
import alfworld.gen.goal_library as goal_library
import alfworld.info
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

from envs.alfworld.scenes import (
    _AFFORDANCE_FACTS,
    _STATIC_RTYPES,
    SPLITS,
    TASK_TYPES,
    Problem,
    SceneLimits,
    goal_key,
    goal_split,
    load_floorplan,
    sample_problem,
    split_floorplans,
    supports,
)

# Bump whenever the games written for a given key change. 2: a draw whose goal key (floor plan,
# task type, goal types) is of another split is redrawn, so valid_seen never repeats a train goal.
GENERATOR_VERSION = 2
_MAX_DRAWS = 200  # problems planned before giving up
_MAX_SAMPLES = 20_000  # draws (fitting or not) before giving up


@dataclass(frozen=True)
class GameRecord:
    """A generated, verified game on disk."""

    path: str  # .../game.tw-pddl
    task_type: str
    floorplan: int
    task_desc: str  # "put some potato on diningtable"
    walkthrough: tuple[str, ...]  # the planner's plan from the initial state


class GenerationError(RuntimeError):
    pass


def mangle(name: str) -> str:
    """ALFRED id -> PDDL name (the demangler reverses it)."""
    for a, b in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_")):
        name = name.replace(a, b)
    return name


def _loc(pose: tuple[int, int, int, int]) -> str:
    return mangle("loc|" + "|".join(str(v) for v in pose))


@functools.lru_cache(maxsize=1)
def _domain_and_grammar() -> tuple[str, str, frozenset[str]]:
    domain = Path(ALFRED_PDDL_PATH).read_text()
    grammar = Path(ALFRED_TWL2_PATH).read_text()
    constants = frozenset(re.findall(r"\b([A-Z]\w*Type)\b", domain))  # SinkBasinType, KnifeType, ...
    return domain, grammar, constants


def render_problem(p: Problem) -> str:
    _, _, domain_constants = _domain_and_grammar()
    rtypes = sorted(_STATIC_RTYPES)
    otypes = sorted({t for _, t, _ in p.objects} | {c[: -len("Type")] for c in domain_constants} - _STATIC_RTYPES)
    locations = {r.id: _loc(r.pose) for r in p.receptacles}
    start = _loc(p.start_pose)
    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    objects += [f"{mangle(oid)} - object" for oid, _, _ in p.objects]
    objects += [f"{mangle(r.id)} - receptacle" for r in p.receptacles]
    objects += [f"{loc} - location" for loc in sorted({start, *locations.values()})]
    init = ["(= (total-cost) 0)", f"(atLocation agent1 {start})"]
    for r in p.receptacles:
        init.append(f"(receptacleType {mangle(r.id)} {r.type}Type)")
        init.append(f"(receptacleAtLocation {mangle(r.id)} {locations[r.id]})")
        if r.type in C.OPENABLE_CLASS_SET:
            init.append(f"(openable {mangle(r.id)})")
    init += [
        f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if o in C.VAL_RECEPTACLE_OBJECTS.get(r, ())
    ]
    for oid, otype, home in p.objects:
        o = mangle(oid)
        init += [
            f"(objectType {o} {otype}Type)",
            f"(inReceptacle {o} {mangle(home.id)})",
            f"(objectAtLocation {o} {locations[home.id]})",
        ]
        if otype not in ("DeskLamp", "FloorLamp"):
            init.append(f"(pickupable {o})")
        init += [f"({fact} {o})" for aff, fact in _AFFORDANCE_FACTS.items() if otype in C.VAL_ACTION_OBJECTS[aff]]
        if otype in C.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {o})")
    goal = goal_library.gdict[p.task_type]["pddl"].replace("#", "-")
    goal = goal.format(obj=p.obj, recep=p.recep, toggle=p.toggle, mrecep="")
    goal = goal.rstrip()
    assert goal.endswith(")"), "the goal library's goal closes the (define ...)"
    lines = ["(define (problem plan_trial)", "    (:domain alfred)", "    (:objects"]
    lines += [f"        {x}" for x in objects] + ["    )", "    (:init"] + [f"        {x}" for x in init]
    lines += ["    )", goal[:-1].strip("\n").rstrip(), "    (:metric minimize (total-cost))", ")"]
    return "\n".join(lines) + "\n"


def _write_game_dir(directory: Path, p: Problem, walkthrough: list[str]) -> None:
    domain, grammar, _ = _domain_and_grammar()
    problem = render_problem(p)
    game = {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", p.task_desc),
        "pddl_problem": problem,
        "solvable": True,
        "walkthrough": walkthrough,
    }
    traj = {
        "task_type": p.task_type,
        "scene": {"floor_plan": f"FloorPlan{p.floorplan}", "scene_num": p.floorplan},
        "pddl_params": {
            "object_target": p.obj,
            "parent_target": p.recep,
            "toggle_target": p.toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": p.task_desc}]},
    }
    (directory / "initial_state.pddl").write_text(problem)
    (directory / "traj_data.json").write_text(json.dumps(traj, indent=1))
    (directory / "game.tw-pddl").write_text(json.dumps(game))


def _plan(directory: Path, p: Problem) -> list[str]:
    """The planner's walkthrough for ``p``, searched on the problem without distractor objects.

    Fast Downward's search grows quickly with the number of pickupable objects (a real-size
    two-object kitchen took 100 s with every distractor, well under a second without them).
    Distractors never enable or block an action here (receptacles have no capacity), and they
    are of other types than the targets, so the demangled names, hence the commands, are the
    same in the full game; ``_check`` then replays the plan there.
    """
    from envs.alfworld.engine import load_engine, release_engine  # the engine pulls in textworld + Fast Downward

    relevant = dataclasses.replace(p, objects=[o for o in p.objects if o[1] in (p.obj, p.toggle)])
    _write_game_dir(directory, relevant, [])
    env = load_engine(str(directory / "game.tw-pddl"), walkthrough=True)
    try:
        plan = list(env.reset()["extra.walkthrough"] or [])
    finally:
        release_engine(env)
    if not plan:
        raise GenerationError("the planner found no plan")
    return plan


def _check(gamefile: str, plan: list[str]) -> None:
    """Not won at reset, and replaying ``plan`` command by command wins."""
    from envs.alfworld.engine import load_engine, release_engine

    env = load_engine(gamefile)
    try:
        state = env.reset()
        if state["won"]:
            raise GenerationError("goal already true at reset")
        for command in plan:
            if command not in state["admissible_commands"]:
                raise GenerationError(f"plan step {command!r} is not admissible")
            state, _, _ = env.step(command)
        if not state["won"]:
            raise GenerationError("executing the plan does not win")
    finally:
        release_engine(env)


def cache_key(limits: SceneLimits) -> str:
    blob = json.dumps({"limits": asdict(limits), "alfworld": alfworld.info.__version__}, sort_keys=True)
    return f"v{GENERATOR_VERSION}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


def default_cache_dir() -> str:
    root = os.environ.get("PRIVY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "privy-rl")
    return os.path.join(root, "alfworld")


def game_dir(cache_dir: str, limits: SceneLimits, split: str, task_type: str, index: int) -> Path:
    return Path(cache_dir) / cache_key(limits) / split / task_type / f"{index:06d}"


def _read_record(directory: Path) -> GameRecord | None:
    try:
        game = json.loads((directory / "game.tw-pddl").read_text())
        traj = json.loads((directory / "traj_data.json").read_text())
    except (OSError, ValueError):
        return None
    return GameRecord(
        str(directory / "game.tw-pddl"),
        traj["task_type"],
        traj["scene"]["scene_num"],
        traj["turk_annotations"]["anns"][0]["task_desc"],
        tuple(game["walkthrough"]),
    )


@functools.lru_cache(maxsize=None)
def _floorplans_for(split: str, n_floorplans: int, task_type: str) -> list[int]:
    """The split's floor plans with a goal key of ``task_type`` in the split (shared: do not modify)."""
    return [n for n in split_floorplans(split, n_floorplans) if supports(load_floorplan(n), task_type, split)]


def problem_candidates(limits: SceneLimits, split: str, task_type: str, index: int) -> Iterator[Problem]:
    """The problems ``get_game`` tries, in order, for the ``index``-th game of ``task_type`` in
    ``split``: a pure function of its arguments (no planner, no files). The game is the first
    one the planner solves, nearly always the first. Every one has a goal key of ``split``
    (``scenes.goal_split``)."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; choose from {list(TASK_TYPES)}")
    floorplans = _floorplans_for(split, limits.n_floorplans, task_type)
    if not floorplans:
        raise GenerationError(f"no floor plan of split {split!r} supports {task_type}")
    rng = random.Random(f"{limits.seed}:{split}:{task_type}:{index}")
    for _ in range(_MAX_SAMPLES):
        problem = sample_problem(rng, load_floorplan(rng.choice(floorplans)), task_type, limits, split)
        if problem is not None:
            assert goal_split(goal_key(problem)) == split
            yield problem


def problem_for(limits: SceneLimits, split: str, task_type: str, index: int) -> Problem:
    """The first of ``problem_candidates``: the game's problem unless the planner rejects it."""
    for problem in problem_candidates(limits, split, task_type, index):
        return problem
    raise GenerationError(f"no {task_type} problem for {split}/{index} in {_MAX_SAMPLES} draws")


def get_game(limits: SceneLimits, split: str, task_type: str, index: int, cache_dir: str | None = None) -> GameRecord:
    """The ``index``-th game of ``task_type`` in ``split``: from the cache, else generated and verified."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; choose from {list(TASK_TYPES)}")
    final = game_dir(cache_dir or default_cache_dir(), limits, split, task_type, index)
    record = _read_record(final)
    if record is not None:
        return record
    candidates = problem_candidates(limits, split, task_type, index)
    final.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for problem in itertools.islice(candidates, _MAX_DRAWS):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            walkthrough = _plan(tmp, problem)
            _write_game_dir(tmp, problem, walkthrough)
            _check(str(tmp / "game.tw-pddl"), walkthrough)
            try:
                os.replace(tmp, final)
            except OSError:  # another process finished the same game first; its copy is identical
                pass
            return _read_record(final) or GameRecord(
                str(final / "game.tw-pddl"), task_type, problem.floorplan, problem.task_desc, tuple(walkthrough)
            )
        except GenerationError as e:
            errors.append(str(e))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise GenerationError(
        f"no valid {task_type} game for {split}/{index} after {len(errors)} planned draws: {errors[-3:]}"
    )


__all__ = [
    "GENERATOR_VERSION",
    "GameRecord",
    "GenerationError",
    "SPLITS",
    "TASK_TYPES",
    "SceneLimits",
    "cache_key",
    "default_cache_dir",
    "get_game",
    "problem_candidates",
    "problem_for",
    "render_problem",
    "split_floorplans",
]
