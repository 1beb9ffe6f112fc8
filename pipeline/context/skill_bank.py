"""Skill banks in the SkillRL JSON schema, and seeded, model-free skill retrieval.

A bank is ``{"general_skills": [skill], "task_specific_skills": {task_type: [skill]},
"common_mistakes": [mistake], "metadata": {...}}`` with skill = ``{skill_id, title, principle,
when_to_apply}`` and mistake = ``{mistake_id, description, why_it_happens, how_to_avoid}`` (extra
keys are allowed and ignored). ``load_bank("alfworld")`` reads the packaged
``envs/skill_banks/alfworld.json`` (each env ships its bank as package data; this module only
reads the files, it imports nothing of ``envs``); ``load_bank(path)`` reads any file in the
schema, so SkillRL's own banks load too.

Keyword rules live in the bank's ``metadata`` (our extension; SkillRL hard-codes them in Python),
so one classifier serves every bank::

    "task_keywords": {task_type: [phrase, ...]}   # checked in order, whole-word, case-insensitive
    "default_task_type": "pick_and_place_simple"   # when no phrase matches (optional)
    "task_marker": "Your task is to:"              # match only the text after it (optional)

The marker matters for ALFWorld: the initial observation lists the room ("a desklamp 1, ...")
before the goal, and only the goal sentence may decide the task type.

Retrieval modes (``SkillRetriever``), all deterministic given (bank, state, seed):

* ``full``: every skill and every mistake (SDAR's ``skill_all``).
* ``keyword``: the task type's skills, the first ``top_k`` general skills and the first
  ``n_mistakes`` mistakes (SkillRL's ``template``; an explicit task type overrides the match;
  with no match and no default type, the general skills alone).
* ``random``: ``top_k`` skills drawn from the whole bank by an RNG seeded from (retriever seed,
  episode seed), so the G episodes of a GRPO group, which share a seed, see the same skills.
* ``ucb``: among the task type's skills and the general skills, the ``top_k`` with the highest
  ``mu + c * sqrt(ln N / n)``: mu = mean episode reward of episodes the skill was offered to,
  n = those episodes, N = episodes of that task type recorded by ``update``; never-offered skills
  come first (the type's own skills before general ones, then bank order). ``c`` is in reward
  units (ALFWorld rewards are 0 or 10). One retriever must own the statistics (e.g. in the
  controller); retrievals between two updates see the same state and return the same skills.

Deviations: SDAR's released code has only keyword (task type) and full retrieval; random and UCB
are ours. SkillRL's ``embedding`` mode needs an embedding model and is not offered. In random and
UCB mode ``top_k`` counts all returned skills (in keyword mode only the general ones), and the
mistakes are the first ``n_mistakes`` as in keyword mode. ``render`` writes our own Markdown
layout; ``why_it_happens`` stays in the bank but is not rendered, to keep prompts short.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path

SKILL_FIELDS = ("skill_id", "title", "principle", "when_to_apply")
MISTAKE_FIELDS = ("mistake_id", "description", "why_it_happens", "how_to_avoid")
_SECTIONS = ("general_skills", "task_specific_skills", "common_mistakes")


class SkillBankError(ValueError):
    """A bank file or dict does not follow the schema."""


@dataclass(frozen=True, slots=True)
class Skill:
    skill_id: str
    title: str
    principle: str
    when_to_apply: str
    task_type: str = ""  # "" = a general skill


@dataclass(frozen=True, slots=True)
class Mistake:
    mistake_id: str
    description: str
    why_it_happens: str
    how_to_avoid: str


def _fields(entry: object, names: Sequence[str], where: str) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise SkillBankError(f"{where}: expected an object, got {type(entry).__name__}")
    missing = [n for n in names if n not in entry]
    if missing:
        raise SkillBankError(f"{where}: missing field(s) {missing}; required: {list(names)}")
    bad = [n for n in names if not isinstance(entry[n], str) or not entry[n].strip()]
    if bad:
        raise SkillBankError(f"{where}: field(s) {bad} must be non-empty strings")
    return {n: entry[n].strip() for n in names}


class SkillBank:
    """A validated skill bank. Build with ``SkillBank.from_dict`` or ``load_bank``."""

    def __init__(
        self,
        general: list[Skill],
        task_specific: dict[str, list[Skill]],
        mistakes: list[Mistake],
        metadata: dict,
        source: str = "<dict>",
    ):
        self.general = general
        self.task_specific = task_specific
        self.mistakes = mistakes
        self.metadata = metadata
        self.source = source
        self._by_id = {s.skill_id: s for s in self.all_skills()}
        self._rules, self._default, self._marker = self._keyword_rules()

    @classmethod
    def from_dict(cls, data: object, source: str = "<dict>") -> SkillBank:
        if not isinstance(data, dict):
            raise SkillBankError(f"{source}: a skill bank is a JSON object with keys {list(_SECTIONS)}")
        missing = [k for k in _SECTIONS if k not in data]
        if missing:
            raise SkillBankError(f"{source}: missing top-level key(s) {missing}")
        if not isinstance(data["general_skills"], list) or not isinstance(data["common_mistakes"], list):
            raise SkillBankError(f"{source}: general_skills and common_mistakes must be lists")
        if not isinstance(data["task_specific_skills"], dict):
            raise SkillBankError(f"{source}: task_specific_skills must map task type -> list of skills")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, dict):
            raise SkillBankError(f"{source}: metadata must be an object")

        general = [
            Skill(**_fields(s, SKILL_FIELDS, f"{source}: general_skills[{i}]"))
            for i, s in enumerate(data["general_skills"])
        ]
        task_specific: dict[str, list[Skill]] = {}
        for task_type, skills in data["task_specific_skills"].items():
            where = f"{source}: task_specific_skills[{task_type!r}]"
            if not task_type or not isinstance(skills, list):
                raise SkillBankError(f"{where}: needs a non-empty task type name and a list of skills")
            task_specific[task_type] = [
                Skill(**_fields(s, SKILL_FIELDS, f"{where}[{i}]"), task_type=task_type) for i, s in enumerate(skills)
            ]
        mistakes = [
            Mistake(**_fields(m, MISTAKE_FIELDS, f"{source}: common_mistakes[{i}]"))
            for i, m in enumerate(data["common_mistakes"])
        ]

        skill_ids = [s.skill_id for s in general] + [s.skill_id for ss in task_specific.values() for s in ss]
        for kind, ids in (("skill_id", skill_ids), ("mistake_id", [m.mistake_id for m in mistakes])):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            if dup:
                raise SkillBankError(f"{source}: duplicate {kind}(s) {dup}; ids must be unique in a bank")
        return cls(general, task_specific, mistakes, metadata, source)

    # ----- lookup ---------------------------------------------------------------------------------
    @property
    def task_types(self) -> tuple[str, ...]:
        return tuple(self.task_specific)

    def all_skills(self) -> list[Skill]:
        """General skills, then each task type's skills, in bank order."""
        return self.general + [s for ss in self.task_specific.values() for s in ss]

    def skill(self, skill_id: str) -> Skill:
        if skill_id not in self._by_id:
            raise KeyError(f"{self.source}: no skill {skill_id!r}")
        return self._by_id[skill_id]

    def skills_of(self, task_type: str) -> list[Skill]:
        self.require_task_type(task_type)
        return list(self.task_specific[task_type])

    def require_task_type(self, task_type: str) -> None:
        if task_type not in self.task_specific:
            raise SkillBankError(
                f"{self.source}: unknown task type {task_type!r}; the bank has {list(self.task_specific)}"
            )

    def check_task_types(self, expected: Iterable[str]) -> None:
        """Raise unless the bank's task types are exactly ``expected`` (e.g. the env's task types)."""
        expected = list(expected)
        unknown = [t for t in self.task_specific if t not in expected]
        uncovered = [t for t in expected if t not in self.task_specific]
        if unknown or uncovered:
            raise SkillBankError(
                f"{self.source}: task types not produced by the env: {unknown}; "
                f"env task types without skills: {uncovered}"
            )

    # ----- keyword classification -----------------------------------------------------------------
    def _keyword_rules(self) -> tuple[list[tuple[str, list[re.Pattern]]], str, str]:
        meta, where = self.metadata, f"{self.source}: metadata"
        table = meta.get("task_keywords", {})
        if not isinstance(table, dict):
            raise SkillBankError(f"{where}.task_keywords must map task type -> list of phrases")
        rules = []
        for task_type, phrases in table.items():
            if task_type not in self.task_specific:
                raise SkillBankError(
                    f"{where}.task_keywords: unknown task type {task_type!r}; the bank has {list(self.task_specific)}"
                )
            if not isinstance(phrases, list) or not all(isinstance(p, str) and p.strip() for p in phrases):
                raise SkillBankError(f"{where}.task_keywords[{task_type!r}] must be a list of non-empty strings")
            # Whole words only: "hot" must not fire inside another word.
            rules.append((task_type, [re.compile(rf"\b{re.escape(p.strip().lower())}\b") for p in phrases]))
        default = meta.get("default_task_type", "")
        if default:
            self.require_task_type(default)
        marker = meta.get("task_marker", "")
        if not isinstance(marker, str):
            raise SkillBankError(f"{where}.task_marker must be a string")
        return rules, default, marker

    def classify(self, task_text: str) -> str:
        """The task type whose first matching phrase comes first in the rules; else the default ("" if none)."""
        text = task_text.lower()
        marker = self._marker.lower()
        if marker and marker in text:
            text = text.rsplit(marker, 1)[1]
        for task_type, patterns in self._rules:
            if any(p.search(text) for p in patterns):
                return task_type
        return self._default


def available_banks() -> list[str]:
    folder = resources.files("envs").joinpath("skill_banks")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_bank(name_or_path: str | Path) -> SkillBank:
    """A packaged bank by name (``"alfworld"``) or a JSON file by path."""
    path = Path(name_or_path)
    # A bare name is a packaged bank even if a folder of that name happens to be in the cwd.
    if path.suffix == ".json" or path.is_file() or len(path.parts) > 1:
        if not path.is_file():
            raise FileNotFoundError(f"skill bank file {path} does not exist")
        text, source = path.read_text(encoding="utf-8"), str(path)
    else:
        res = resources.files("envs").joinpath("skill_banks").joinpath(f"{name_or_path}.json")
        if not res.is_file():
            raise FileNotFoundError(
                f"no packaged skill bank {str(name_or_path)!r}; "
                f"choose one of {available_banks()} or give a path to a .json file"
            )
        text, source = res.read_text(encoding="utf-8"), f"skill_banks/{name_or_path}.json"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SkillBankError(f"{source}: not valid JSON ({e})") from None
    return SkillBank.from_dict(data, source=source)


def render(skills: Sequence[Skill], mistakes: Sequence[Mistake]) -> str:
    """Markdown: general skills, then one section per task type (first-seen order), then mistakes."""

    def line(s: Skill) -> str:
        return f"- **{s.title}**: {s.principle} (when: {s.when_to_apply})"

    sections = []
    general = [s for s in skills if not s.task_type]
    if general:
        sections.append("\n".join(["### General principles", *map(line, general)]))
    by_type: dict[str, list[Skill]] = {}
    for s in skills:
        if s.task_type:
            by_type.setdefault(s.task_type, []).append(s)
    for task_type, group in by_type.items():
        sections.append("\n".join([f"### Skills for {task_type}", *map(line, group)]))
    if mistakes:
        sections.append(
            "\n".join(["### Common mistakes", *(f"- **{m.description}**: {m.how_to_avoid}" for m in mistakes)])
        )
    return "\n\n".join(sections)


class RetrievalMode(StrEnum):
    FULL = "full"
    KEYWORD = "keyword"
    RANDOM = "random"
    UCB = "ucb"


@dataclass(frozen=True, slots=True)
class RetrievedSkills:
    text: str  # rendered Markdown, "" when nothing was retrieved
    skill_ids: tuple[str, ...]
    mistake_ids: tuple[str, ...] = ()
    task_type: str = ""  # the resolved task type (explicit or keyword match); pass it back to ``update``


class SkillRetriever:
    """Chooses the skills offered for one episode; holds the UCB statistics (checkpoint them)."""

    def __init__(
        self,
        bank: SkillBank,
        mode: str = "keyword",
        *,
        top_k: int = 6,
        n_mistakes: int = 5,
        seed: int = 0,
        ucb_c: float = 1.0,
    ):
        if mode not in set(RetrievalMode):
            raise ValueError(f"skill retrieval mode {mode!r}: choose one of {[m.value for m in RetrievalMode]}")
        if top_k < 1 or n_mistakes < 0 or ucb_c < 0:
            raise ValueError(
                f"skill retrieval needs top_k >= 1, n_mistakes >= 0, ucb_c >= 0 (got {top_k}, {n_mistakes}, {ucb_c})"
            )
        self.bank, self.mode = bank, RetrievalMode(mode)
        self.top_k, self.n_mistakes, self.seed, self.ucb_c = top_k, n_mistakes, seed, ucb_c
        # task type -> (N = episodes recorded, {skill_id: [n = episodes offered to, reward sum]})
        self._ucb: dict[str, tuple[int, dict[str, list[float]]]] = {}

    def resolve_task_type(self, task_text: str, task_type: str = "") -> str:
        if task_type:
            self.bank.require_task_type(task_type)
            return task_type
        return self.bank.classify(task_text)

    def retrieve(self, task_text: str, task_type: str = "", seed: int = 0) -> RetrievedSkills:
        task_type = self.resolve_task_type(task_text, task_type)
        bank, mistakes = self.bank, self.bank.mistakes[: self.n_mistakes]
        if self.mode is RetrievalMode.FULL:
            skills, mistakes = bank.all_skills(), bank.mistakes
        elif self.mode is RetrievalMode.KEYWORD:
            skills = bank.general[: self.top_k] + (bank.skills_of(task_type) if task_type else [])
        elif self.mode is RetrievalMode.RANDOM:
            pool = bank.all_skills()
            # A string seed is hashed with SHA-512 by ``random``: stable across processes and runs.
            rng = random.Random(f"skills:{self.seed}:{seed}")
            skills = [pool[i] for i in sorted(rng.sample(range(len(pool)), min(self.top_k, len(pool))))]
        else:
            skills = self._ucb_pick(task_type)
        return RetrievedSkills(
            text=render(skills, mistakes),
            skill_ids=tuple(s.skill_id for s in skills),
            mistake_ids=tuple(m.mistake_id for m in mistakes),
            task_type=task_type,
        )

    # ----- UCB ------------------------------------------------------------------------------------
    def _ucb_pool(self, task_type: str) -> list[Skill]:
        # The task type's own skills first: ties among never-offered skills go to them, so the
        # cold start looks like keyword retrieval rather than a list of general principles.
        return (self.bank.skills_of(task_type) if task_type else []) + self.bank.general

    def ucb_scores(self, task_type: str) -> dict[str, float]:
        """Score of every candidate skill for ``task_type``; ``inf`` for never-offered ones."""
        episodes, stats = self._ucb.get(task_type, (0, {}))
        scores = {}
        for s in self._ucb_pool(task_type):
            n, total = stats.get(s.skill_id, (0, 0.0))
            scores[s.skill_id] = (
                math.inf if n == 0 else total / n + self.ucb_c * math.sqrt(math.log(max(episodes, 1)) / n)
            )
        return scores

    def _ucb_pick(self, task_type: str) -> list[Skill]:
        scores = self.ucb_scores(task_type)
        pool = self._ucb_pool(task_type)
        # Highest score first; ties (including all unvisited, scored inf) keep bank order.
        order = sorted(range(len(pool)), key=lambda i: (-scores[pool[i].skill_id], i))
        chosen = {pool[i].skill_id for i in order[: self.top_k]}
        return [s for s in self.bank.all_skills() if s.skill_id in chosen]  # bank order for rendering

    def update(self, task_type: str, skill_ids: Iterable[str], reward: float) -> None:
        """Record one episode's reward for the skills it was offered (``RetrievedSkills`` fields)."""
        if task_type:
            self.bank.require_task_type(task_type)
        if not math.isfinite(reward):
            raise ValueError(f"UCB update: reward must be finite, got {reward}")
        episodes, stats = self._ucb.get(task_type, (0, {}))
        for sid in skill_ids:
            self.bank.skill(sid)  # raises on an id from another bank
            entry = stats.setdefault(sid, [0, 0.0])
            entry[0] += 1
            entry[1] += float(reward)
        self._ucb[task_type] = (episodes + 1, stats)

    def state_dict(self) -> dict:
        return {
            "ucb": {
                t: {"episodes": n, "skills": {s: list(v) for s, v in stats.items()}}
                for t, (n, stats) in self._ucb.items()
            }
        }

    def load_state_dict(self, state: dict) -> None:
        ucb = {}
        for task_type, entry in state.get("ucb", {}).items():
            for sid in entry["skills"]:
                self.bank.skill(sid)
            ucb[task_type] = (int(entry["episodes"]), {s: [int(v[0]), float(v[1])] for s, v in entry["skills"].items()})
        self._ucb = ucb
