"""ALFRED floor plans and task sampling: which objects go where, and what the goal is.

The ``alfworld`` wheel ships no games (``alfworld-download`` needs GitHub) but it ships 120
AI2-THOR scenes (``gen/layouts/FloorPlanN-objects.json``: the object types of the scene;
``-openable.json``: its interactable receptacles with real ALFRED ids and poses), the
``canContain`` table and affordances (``gen/constants.py``) and the goal library. From these
``sample_problem`` draws a task, all randomness from the ``random.Random`` it is given:

- a floor plan of the split that supports the task type (``supports``);
- an object type of the scene with the needed affordance (cleanable, heatable, coolable);
- a goal receptacle type that can hold it and is not the task's appliance (``look_at_obj_in_light``:
  a lamp of the scene instead, standing on a table-like receptacle);
- 1-2 target instances (2-3 for ``pick_two_obj_and_place``) in one or two receptacles of *other*
  types, so the goal is false at reset;
- the appliance (sink basin, microwave, fridge), then random extra receptacles and one
  distractor of each other object type of the scene, up to ``max_receptacles`` / ``max_objects``.

Receptacles keep their ALFRED ids (``Cabinet|+00.68|+00.50|-02.20``, ``Sink|...|SinkBasin``) and
poses; static receptacle types listed in ``objects.json`` but missing from ``openable.json``
(coffee machine, stove burner, garbage can, ...) get one synthetic instance. Every receptacle has
its own location and the agent starts in the middle of the room.

Deviations from the ALFRED data: objects are placed by the ``canContain`` table, not by THOR's
physics, so placements are plausible rather than THOR's; floor lamps stand on a table-like
receptacle (the PDDL ``ToggleObject`` needs one); sliced and movable-receptacle tasks are not
drawn (ALFWorld skips them too); task sentences use the goal library's templates, never human
annotations.

Splits follow ALFRED's scene split: ``train`` and ``valid_seen`` draw from the training floor
plans (7-30, 207-230, 307-330, 407-430), ``valid_unseen`` from the held-out ones (1-6, 201-206,
301-306, 401-406). What decides a task's solution is its floor plan, task type and goal types
(``goal_key``: the object type, and the goal receptacle type or the lamp type); each such key of
a training floor plan belongs to one of ``train`` and ``valid_seen`` (``goal_split``: 1 in 10 to
``valid_seen`` by a stable hash), and ``sample_problem(..., split=...)`` rejects a draw whose key
is of another split. So no ``valid_seen`` task asks for what a ``train`` task asks for in the same
room, and ``valid_unseen`` shares not even a floor plan with them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import alfworld
import alfworld.gen.constants as C
import alfworld.gen.goal_library as goal_library

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")

_LAYOUTS = Path(alfworld.__file__).parent / "gen" / "layouts"
_STATIC_RTYPES = frozenset(C.VAL_RECEPTACLE_OBJECTS) - frozenset(C.MOVABLE_RECEPTACLES)
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOSTS = frozenset({"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "CounterTop"})
_PICKUPABLE = frozenset(
    (set().union(*C.VAL_RECEPTACLE_OBJECTS.values()) | set(C.MOVABLE_RECEPTACLES)) & set(C.OBJECTS)
) - frozenset(_LAMPS)
_APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
_NEEDED_AFFORDANCE = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
_AFFORDANCE_FACTS = {
    "Cleanable": "cleanable",
    "Heatable": "heatable",
    "Coolable": "coolable",
    "Toggleable": "toggleable",
    "Sliceable": "sliceable",
}


@dataclass(frozen=True)
class SceneLimits:
    """What shapes generated games; part of the cache key."""

    seed: int = 0  # generator seed: a different seed gives a different task pool
    max_receptacles: int = 0  # receptacles per scene (0 = every receptacle of the floor plan), else >= 4
    max_objects: int = 0  # object instances per scene (0 = targets + one of every other type), else >= 4
    n_floorplans: int = 0  # floor plans per split (0 = all; the order alternates room types)


@dataclass(frozen=True)
class Receptacle:
    id: str  # ALFRED id, e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|...|SinkBasin"
    type: str  # e.g. "Cabinet", "SinkBasin"
    pose: tuple[int, int, int, int]  # ALFRED location key: x*4, z*4, rotation/90, horizon


@dataclass(frozen=True)
class Floorplan:
    number: int
    receptacles: tuple[Receptacle, ...]
    object_types: tuple[str, ...]  # pickupable types listed for the scene
    lamps: tuple[str, ...]


@dataclass
class Problem:
    """One sampled task before rendering."""

    task_type: str
    floorplan: int
    obj: str
    recep: str  # "" for look_at_obj_in_light
    toggle: str  # "" unless look_at_obj_in_light
    task_desc: str  # e.g. "put some potato on diningtable"
    receptacles: list[Receptacle]
    objects: list[tuple[str, str, Receptacle]]  # (id, type, the receptacle holding it)
    start_pose: tuple[int, int, int, int]


def split_floorplans(split: str, n_floorplans: int = 0) -> list[int]:
    """Floor plans of a split, alternating kitchen / living room / bedroom / bathroom."""
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {list(SPLITS)}")
    numbers = C.TEST_SCENE_NUMBERS if split == "valid_unseen" else C.TRAIN_SCENE_NUMBERS
    ordered = sorted(numbers, key=lambda n: (n % 100, n // 100))
    return ordered[:n_floorplans] if n_floorplans > 0 else ordered


def _pose(x: float, z: float, rotation: float, horizon: float) -> tuple[int, int, int, int]:
    return (round(x * 4), round(z * 4), round(rotation / 90) % 4, round(horizon))


def _fake_coords(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))


@functools.lru_cache(maxsize=None)
def load_floorplan(number: int) -> Floorplan:
    openable = json.loads((_LAYOUTS / f"FloorPlan{number}-openable.json").read_text())
    listed = json.loads((_LAYOUTS / f"FloorPlan{number}-objects.json").read_text())
    receptacles = []
    for rid, (x, z, rotation, horizon) in sorted(openable.items()):
        parts = rid.split("|")
        rtype = parts[4] if len(parts) == 5 else parts[0]  # "Sink|x|y|z|SinkBasin" is a SinkBasin
        if rtype in _STATIC_RTYPES:
            receptacles.append(Receptacle(rid, rtype, _pose(x, z, rotation, horizon)))
    present = {r.type for r in receptacles}
    rng = random.Random(f"floorplan:{number}")
    for rtype in sorted(set(listed) & _STATIC_RTYPES - present):
        # Basins are named the ALFRED way: the demangler appends "basin" to any id containing it.
        base = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}.get(rtype)
        rid = f"{base}|{_fake_coords(rng)}|{rtype}" if base else f"{rtype}|{_fake_coords(rng)}"
        pose = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randint(0, 3), rng.choice((0, 30, 60)))
        receptacles.append(Receptacle(rid, rtype, pose))
    # ALFWorld's "go to" names every receptacle at the target location, so each one gets its own
    # location; some ALFRED receptacles share a pose (stacked drawers), those are nudged apart.
    taken: set[tuple[int, int, int, int]] = {(0, 0, 0, 0)}  # reserved for the agent's start
    for i, r in enumerate(receptacles):
        x, z, rotation, horizon = r.pose
        while (x, z, rotation, horizon) in taken:
            horizon += 1
        taken.add((x, z, rotation, horizon))
        receptacles[i] = Receptacle(r.id, r.type, (x, z, rotation, horizon))
    return Floorplan(
        number, tuple(receptacles), tuple(sorted(set(listed) & _PICKUPABLE)), tuple(sorted(set(listed) & set(_LAMPS)))
    )


def _can_hold(rtype: str, otype: str) -> bool:
    return otype in C.VAL_RECEPTACLE_OBJECTS.get(rtype, ())


def _target_types(fp: Floorplan, task_type: str) -> list[str]:
    affordance = _NEEDED_AFFORDANCE.get(task_type)
    return [o for o in fp.object_types if affordance is None or o in C.VAL_ACTION_OBJECTS[affordance]]


def _goal_types(fp: Floorplan, task_type: str, obj: str) -> list[str]:
    """Goal receptacle types for ``obj``: can hold it, and another receptacle type can too."""
    rtypes = sorted({r.type for r in fp.receptacles})
    holders = [t for t in rtypes if _can_hold(t, obj)]
    return [t for t in holders if t != _APPLIANCE.get(task_type) and len(holders) > 1]


def _supports_type(fp: Floorplan, task_type: str) -> bool:
    rtypes = {r.type for r in fp.receptacles}
    if task_type in _APPLIANCE and _APPLIANCE[task_type] not in rtypes:
        return False
    if task_type == "look_at_obj_in_light":
        return (
            bool(fp.lamps)
            and bool(rtypes & _LAMP_HOSTS)
            and any(_can_hold(t, o) for o in fp.object_types for t in rtypes)
        )
    return any(_goal_types(fp, task_type, o) for o in _target_types(fp, task_type))


# (floor plan, task type, object type, goal receptacle type or "", lamp type or "")
GoalKey = tuple[int, str, str, str, str]
VALID_SEEN_SHARE = 10  # 1 in this many goal keys of the training floor plans is valid_seen's


@functools.lru_cache(maxsize=1 << 16)
def goal_split(key: GoalKey) -> str:
    """The one split a goal key belongs to: ``valid_unseen`` on its floor plans, else ``valid_seen``
    for 1 key in ``VALID_SEEN_SHARE`` (a SHA-256 hash of the key) and ``train`` for the rest."""
    if key[0] in C.TEST_SCENE_NUMBERS:
        return "valid_unseen"
    digest = hashlib.sha256("|".join(map(str, key)).encode()).hexdigest()
    return "valid_seen" if int(digest, 16) % VALID_SEEN_SHARE == 0 else "train"


def goal_key(p: "Problem") -> GoalKey:
    return (p.floorplan, p.task_type, p.obj, p.recep, p.toggle)


def goal_keys(fp: Floorplan, task_type: str) -> list[GoalKey]:
    """Every goal key ``sample_problem`` can draw in ``fp`` for ``task_type``."""
    if not _supports_type(fp, task_type):
        return []
    objs = _target_types(fp, task_type)
    if task_type == "look_at_obj_in_light":
        objs = [o for o in objs if any(_can_hold(r.type, o) for r in fp.receptacles)]
        return [(fp.number, task_type, o, "", lamp) for o in objs for lamp in fp.lamps]
    return [(fp.number, task_type, o, r, "") for o in objs for r in _goal_types(fp, task_type, o)]


def supports(fp: Floorplan, task_type: str, split: str | None = None) -> bool:
    """Whether a task of this type can be drawn in this floor plan (for ``split``: with a goal key
    of that split)."""
    if split is None:
        return _supports_type(fp, task_type)
    return any(goal_split(k) == split for k in goal_keys(fp, task_type))


def sample_problem(
    rng: random.Random, fp: Floorplan, task_type: str, limits: SceneLimits, split: str | None = None
) -> Problem | None:
    """Draw one task in ``fp``; None when this draw does not fit (the caller redraws). With
    ``split``, a draw whose goal key is of another split (``goal_split``) does not fit either: it
    is given up right after the goal types are drawn."""
    objs = _target_types(fp, task_type)
    if task_type == "look_at_obj_in_light":
        objs = [o for o in objs if any(_can_hold(r.type, o) for r in fp.receptacles)]
    else:
        objs = [o for o in objs if _goal_types(fp, task_type, o)]
    if not objs or not supports(fp, task_type):
        return None
    obj = rng.choice(objs)
    recep = toggle = ""
    required: list[Receptacle] = []
    if task_type == "look_at_obj_in_light":
        toggle = rng.choice(fp.lamps)
        if split is not None and goal_split((fp.number, task_type, obj, recep, toggle)) != split:
            return None
        lamp_host = rng.choice([r for r in fp.receptacles if r.type in _LAMP_HOSTS])
        required.append(lamp_host)
    else:
        recep = rng.choice(_goal_types(fp, task_type, obj))
        if split is not None and goal_split((fp.number, task_type, obj, recep, toggle)) != split:
            return None
        required.append(rng.choice([r for r in fp.receptacles if r.type == recep]))
        if task_type in _APPLIANCE:
            required.append(rng.choice([r for r in fp.receptacles if r.type == _APPLIANCE[task_type]]))
    n_targets = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    starts = [r for r in fp.receptacles if _can_hold(r.type, obj) and r.type != recep]
    homes = rng.sample(starts, k=min(2, len(starts)))  # at most two, so 4-receptacle scenes fit
    target_homes = [rng.choice(homes) for _ in range(n_targets)]

    chosen: dict[str, Receptacle] = {r.id: r for r in required + target_homes}
    extras = [r for r in fp.receptacles if r.id not in chosen]
    rng.shuffle(extras)
    room = len(extras) if limits.max_receptacles <= 0 else limits.max_receptacles - len(chosen)
    if room < 0:
        return None
    for r in extras[:room]:
        chosen[r.id] = r
    receptacles = sorted(chosen.values(), key=lambda r: r.id)

    used_ids: set[str] = set()

    def new_id(otype: str) -> str:
        while True:
            oid = f"{otype}|{_fake_coords(rng)}"
            if oid not in used_ids:
                used_ids.add(oid)
                return oid

    objects = [(new_id(obj), obj, home) for home in target_homes]
    if toggle:
        objects.append((new_id(toggle), toggle, required[0]))
    others = [o for o in fp.object_types if o != obj]
    rng.shuffle(others)
    budget = len(others) if limits.max_objects <= 0 else max(0, limits.max_objects - len(objects))
    for otype in others:
        if budget == 0:
            break
        holders = [r for r in receptacles if _can_hold(r.type, otype)]
        if holders:
            objects.append((new_id(otype), otype, rng.choice(holders)))
            budget -= 1

    template = rng.choice(goal_library.gdict[task_type]["templates"])
    desc = template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")
    return Problem(task_type, fp.number, obj, recep, toggle, desc, receptacles, objects, (0, 0, 0, 0))
