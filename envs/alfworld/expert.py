"""A searching expert for ALFWorld: the stored walkthrough without its knowledge of where things lie.

The walkthrough goes straight to the receptacle that holds the object (the planner sees the whole
state), so a model cloned on it learns to guess where things are and, on a new scene, walks to
the wrong receptacle for ever. This expert follows the walkthrough except where it *finds*
something: a ``go to R`` whose purpose is to ``take X from R`` (or to ``use`` a lamp there)
becomes a search, and it takes the first instance of X's type it sees. The object's name then
replaces the walkthrough's in later steps. Steps the search made moot (an ``open`` of what is
already open) are skipped; a step that is not admissible otherwise falls back to the planner.

The search has no memory, so that a model can learn it from one prompt: from receptacle R it
goes to the receptacle that follows R in alphabetical order (wrapping round; from the middle of
the room, the first), opening closed ones on the way. Its reasoning says that step out loud
(``No cloth at drawer 1. Next after drawer 1: drawer 2.``): every word of it is in the prompt
(the current observation names R, the admissible ``go to`` list the candidates), so the clone
copies a state it can see instead of remembering where it has been. A clone of an expert that
skipped the receptacles it had visited, saying only "the drawer 2 may have what the task needs",
looped between two receptacles (docs/learning.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_SEEN = re.compile(r"\b(?:a|an) ([a-z]+ \d+)")


def kind(obj: str) -> str:
    """``pencil 3`` -> ``pencil``."""
    return re.sub(r" \d+$", "", obj)


class SearchingExpert:
    def __init__(self, plan: Sequence[str]):
        self.plan = list(plan)
        self.i = 0  # the next walkthrough step
        self.rename: dict[str, str] = {}  # walkthrough object -> the instance found
        self.used: set[str] = set()  # instances taken or used so far
        self.search: tuple[str, str] | None = None  # (walkthrough object, its verb: take | use)
        self.here = ""
        self.reason = ""  # why the last command: its <think> text

    def _named(self, step: str) -> str:
        for old, new in self.rename.items():
            step = re.sub(rf"\b{re.escape(old)}\b", new, step)
        return step

    def _finds(self, i: int) -> tuple[str, str] | None:
        """``(object, verb)`` if walkthrough step i is a ``go to R`` made to take or use something at R."""
        m = re.fullmatch(r"go to (.+)", self.plan[i])
        if not m:
            return None
        j = i + 1
        if j < len(self.plan) and self.plan[j] == f"open {m[1]}":
            j += 1
        if j < len(self.plan):
            if t := re.fullmatch(rf"take (.+) from {re.escape(m[1])}", self.plan[j]):
                return t[1], "take"
            if u := re.fullmatch(r"use (.+)", self.plan[j]):
                return u[1], "use"
        return None

    def _skip_find(self) -> None:
        """Past the walkthrough's ``go to R`` [, ``open R``], ``take X from R`` | ``use L``."""
        self.i += 1
        if self.i < len(self.plan) and self.plan[self.i].startswith("open "):
            self.i += 1
        self.i += 1

    def next(self, observation: str, admissible: Sequence[str], replan: Callable[[], list[str]]) -> str | None:
        """The next command for the current state (why, in ``self.reason``), or None when the plan is done."""
        while self.search is None and self.i < len(self.plan):
            found = self._finds(self.i)
            if found is not None:
                self.search = found
                break
            step = self._named(self.plan[self.i])
            if step in admissible:
                self.i += 1
                after = self._named(self.plan[self.i]) if self.i < len(self.plan) else ""
                return self._says(step, planned_reason(step, after))
            if re.match(r"(open|close) ", step):  # the search already opened it
                self.i += 1
                continue
            return self._replanned(replan)  # something else changed: the planner picks up from here
        if self.search is None:
            return None
        obj, verb = self.search
        want = kind(obj)
        for inst in (o for o in _SEEN.findall(observation) if kind(o) == want and o not in self.used):
            cmd = f"take {inst} from {self.here}" if verb == "take" else f"use {inst}"
            if cmd in admissible:
                self.rename[obj], self.search = inst, None
                self.used.add(inst)
                self._skip_find()
                return self._says(cmd, f"I see the {inst}. I {verb} it.")
        if self.here and f"open {self.here}" in admissible and "is closed" in observation:
            return self._says(f"open {self.here}", f"The {self.here} is closed. I open it to look for a {want}.")
        dest = successor(self.here, [c[6:] for c in admissible if c.startswith("go to ")])
        if dest is None:
            return self._replanned(replan)
        if not self.here:
            return self._says(f"go to {dest}", f"I look for a {want}. First: {dest}.")
        return self._says(f"go to {dest}", f"No {want} at {self.here}. Next after {self.here}: {dest}.")

    def _replanned(self, replan: Callable[[], list[str]]) -> str | None:
        rest = replan()
        return self._says(rest[0], expert_reason(rest[0])) if rest else None

    def _says(self, cmd: str, reason: str) -> str:
        if cmd.startswith("go to "):
            self.here = cmd[6:]
        self.reason = reason
        return cmd


def successor(here: str, places: Sequence[str]) -> str | None:
    """The receptacle after ``here`` in alphabetical order, wrapping round (the first if ``here`` is "")."""
    if not places:
        return None
    ordered = sorted(places)
    return next((p for p in ordered if p > here), ordered[0])


def planned_reason(step: str, after: str) -> str:
    """Why a walkthrough step: a ``go to`` says what it goes there to do (the step after it)."""
    if step.startswith("go to ") and after and not after.startswith("go to "):
        return f"I go to the {step[6:]} to {after}."
    return expert_reason(step)


_REASONS = (  # ALFWorld's command verbs -> a short reason an expert would give
    ("go to ", "the {0} may have what the task needs"),
    ("take ", "the task needs the {0}"),
    ("move ", "the {0} belongs there"),
    ("put ", "the {0} belongs there"),
    ("open ", "the {0} is closed"),
    ("close ", "the {0} is done"),
    ("heat ", "the {0} must be hot"),
    ("cool ", "the {0} must be cool"),
    ("clean ", "the {0} must be clean"),
    ("use ", "the {0} gives light"),
    ("examine ", "look at the {0}"),
)


def expert_reason(action: str) -> str:
    """A one-line reason for an expert command (``take mug 1 from shelf 2`` -> ``the task needs
    the mug 1``): short, because every token of it is cloned and later sampled."""
    for verb, reason in _REASONS:
        if action.startswith(verb):
            obj = re.split(r" (?:from|in/on|with|to) ", action[len(verb) :])[0]
            return reason.format(obj)
    return "this is the next step"


def walkthrough_hint(plan: Sequence[str]) -> str:
    """The facts a plan relies on: where each taken object lies, what tool is used, where it goes."""
    facts, here = [], ""
    for a in plan:
        if m := re.fullmatch(r"go to (.+)", a):
            here = m[1]
        elif m := re.fullmatch(r"take (.+) from (.+)", a):
            facts.append(f"The {m[1]} is in/on the {m[2]}.")
        elif m := re.fullmatch(r"(?:put|move) (.+?) (?:in/on|to) (.+)", a):
            facts.append(f"The {m[1]} goes in/on the {m[2]}.")
        elif m := re.fullmatch(r"(heat|cool|clean) (.+) with (.+)", a):
            facts.append(f"{m[1].capitalize()} the {m[2]} with the {m[3]}.")
        elif (m := re.fullmatch(r"use (.+)", a)) and here:
            facts.append(f"The {m[1]} is in/on the {here}.")
    return " ".join(dict.fromkeys(facts))
