"""Generated mini-repositories with an editing task, deterministic by (split, seed).

A repository holds one to three helper modules (text, math, list helpers: one to three functions
each, drawn from the 27 ``SPECS`` of ``specs.py``), a front-end module whose ``show_*`` wrappers
call some of them, and one visible test file ``tests/test_<project>.py`` (one ``test_*`` function
per case). Every task also carries hidden tests (run only by the final judgment, never placed in
the repo) and a reference solution: a list of exact ``replace_in_file`` edits that the scripted
expert replays; each applies exactly once and leaves no second match behind.

Task families (``FAMILIES``):

* ``fix_bug``: one function carries a one-line bug (``//`` for ``/``, a dropped ``.lower()``, an
  off-by-one range, ...) that at least one visible test exposes; hidden tests add one more case
  and a front-end check.
* ``add_param``: add a keyword parameter with a default to a function and use it in the body;
  visible tests pin the old behaviour, hidden tests call the new parameter. The rubric also
  checks the signature with ``ast``.
* ``rename``: rename a function and update its call sites (the front end imports and calls it);
  the visible tests already use the new name, hidden tests check the old name is gone.
* ``implement``: a function is a stub raising ``NotImplementedError`` under its docstring;
  visible tests hold its first cases, hidden tests the rest.

Expected values in the tests are computed by running the reference functions at generation time,
so tests and reference can never disagree. ``random.Random(f"code_edit/{split}/{seed}")`` drives
every choice, so the same (split, seed) always yields byte-identical files.

Splits (``SPLITS``: ``train``, ``valid``, ``test``; any other name raises ``ValueError``): a task's
reference edit is fixed by its (family, target spec) pair, so each pair belongs to exactly one
split (``SPLIT_PAIRS``, built at import by ``_assign_splits``) and ``generate_task`` draws the
target only among its split's pairs of the family. Per family, the eligible specs (all 27 of
``specs.SPECS``; for ``add_param`` the 21 with a parameter) are sorted within each kind by
``sha256(f"{family}/{key}")`` and dealt round-robin over the three kinds; the first
``n = max(3, round(0.15 * eligible))`` go to ``test``, the next ``n`` to ``valid``, the rest to
``train``: test 4 / valid 4 / train 19 pairs for ``fix_bug``, ``rename`` and ``implement``, and
3 / 3 / 15 for ``add_param`` (every kind in valid and in test), 102 pairs in all. Only the target
carries the answer: the other helper functions of a repository, and the project, module and
front-end names, are drawn from everything, whatever the split. So what is held out is the edit,
not the function: a held-out target's correct source can sit, unchanged, as a helper in a train
repository (and a held-out ``fix_bug`` target may be a train ``rename`` target).

A real task (``generate_task(2, "train")``)::

    Task: Rename the function `truncate` in `strutil.py` to `shorten` and update every place that
    uses it. The tests already use the new name. Do not modify the files under `tests/`. Work with
    the tools, run the tests, and when you are done call `finish` with a message that summarises
    your changes as a Markdown table with the columns `file` and `change`.
    files: strutil.py, app.py, tests/test_travel.py
    reference: strutil.py  "def truncate("                 -> "def shorten("
               app.py      "from strutil import truncate\n" -> "from strutil import shorten\n"
               app.py      "repr(truncate(*args))"        -> "repr(shorten(*args))"
    hidden tests: shorten('hello world', 8) == 'hello...', and
                  `not hasattr(strutil, "truncate")`
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from envs.code_edit.specs import SPEC_BY_KEY, SPECS, FunctionSpec, ParamSpec  # noqa: F401 - re-exported
from envs.code_edit.tools import format_tool_call

FAMILIES = ("fix_bug", "add_param", "rename", "implement")
KINDS = ("text", "math", "list")
MODULE_NAMES = {
    "text": ("textkit", "wordtools", "strutil"),
    "math": ("mathkit", "calc", "numtools"),
    "list": ("listkit", "seqtools", "itemutil"),
}
FRONTEND_NAMES = ("app", "report", "frontend", "display")
PROJECTS = ("ledger", "notes", "shop", "garden", "library", "weather", "recipes", "fitness", "travel", "music")
MODULE_DOCS = {"text": "Text helpers", "math": "Number helpers", "list": "List helpers"}
SPLITS = ("train", "valid", "test")
HELD_OUT_SHARE = 0.15  # of each family's pairs, for valid and for test each
MIN_HELD_OUT = 3  # pairs per family in valid and in test, at least


# ----- splits: each (family, target spec) pair belongs to exactly one split ---------------------------
def eligible_specs(family: str) -> tuple[FunctionSpec, ...]:
    """The specs that can be the target of ``family``: every one, or for add_param those with a parameter."""
    return tuple(s for s in SPECS if family != "add_param" or s.param is not None)


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _assign_splits() -> dict[str, dict[str, tuple[str, ...]]]:
    """split -> family -> the keys of the target specs of that split (in ``SPECS`` order).

    Per family: the eligible spec keys of each kind sorted by ``sha256(f"{family}/{key}")``, the
    kinds ordered by ``sha256(f"{family}/kind:{kind}")``, then dealt round-robin across the kinds
    (first of each kind, second of each kind, ...); the first ``n`` of that order go to ``test``,
    the next ``n`` to ``valid``, the rest to ``train``, with
    ``n = max(MIN_HELD_OUT, round(HELD_OUT_SHARE * eligible))``. So valid and test hold every kind.
    """
    pairs: dict[str, dict[str, tuple[str, ...]]] = {split: {} for split in SPLITS}
    for family in FAMILIES:
        specs = eligible_specs(family)
        by_kind = {
            kind: sorted((s.key for s in specs if s.kind == kind), key=lambda k: _rank(f"{family}/{k}"))
            for kind in KINDS
        }
        kinds = sorted(KINDS, key=lambda kind: _rank(f"{family}/kind:{kind}"))
        order: list[str] = []
        for i in range(max(len(keys) for keys in by_kind.values())):
            order += [by_kind[kind][i] for kind in kinds if i < len(by_kind[kind])]
        n = max(MIN_HELD_OUT, round(HELD_OUT_SHARE * len(order)))
        assert len(order) >= 3 * n, (family, len(order))
        chosen = {"test": set(order[:n]), "valid": set(order[n : 2 * n]), "train": set(order[2 * n :])}
        for split, keys in chosen.items():
            pairs[split][family] = tuple(s.key for s in specs if s.key in keys)
    return pairs


SPLIT_PAIRS = _assign_splits()


def split_of(family: str, key: str) -> str:
    """The split whose tasks may have target ``key`` in ``family``."""
    for split in SPLITS:
        if key in SPLIT_PAIRS[split].get(family, ()):
            return split
    raise KeyError(f"code_edit: no split holds ({family!r}, {key!r})")


@dataclass(frozen=True)
class Edit:
    """One exact replacement: ``old`` occurs exactly once in ``path``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class ParamRequirement:
    """What the ``param_added_and_used`` criterion checks in ``module``."""

    module: str  # file path, e.g. "calc.py"
    function: str
    name: str
    default: str  # Python source of the required default


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    split: str
    seed: int
    instruction: str
    files: dict[str, str]  # the initial repository: path -> content
    test_files: tuple[str, ...]  # visible tests (paths in the repo)
    hidden_tests: str  # source of the hidden test module, run only by the final judgment
    reference_edits: tuple[Edit, ...]
    target_module: str
    target_function: str  # its name in the initial repo
    param: ParamRequirement | None = None
    notes: dict = field(default_factory=dict)

    @property
    def original_tests(self) -> dict[str, str]:
        return {p: self.files[p] for p in self.test_files}


# ----- generation ---------------------------------------------------------------------------------
def generate_task(
    seed: int, split: str = "train", families: tuple[str, ...] = FAMILIES, hint_location: bool = True
) -> Task:
    """The task of (split, seed): family ``families[seed % len(families)]``, its target among the
    split's pairs of that family (``SPLIT_PAIRS``), the rest drawn by the seed."""
    if split not in SPLITS:
        raise ValueError(f"code_edit: unknown split {split!r}; choose one of {list(SPLITS)}")
    if not families:
        raise ValueError("code_edit: task_families must not be empty")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"code_edit: unknown task families {unknown}; choose from {list(FAMILIES)}")
    family = families[seed % len(families)]
    rng = random.Random(f"code_edit/{split}/{seed}")
    candidates = [SPEC_BY_KEY[key] for key in SPLIT_PAIRS[split][family]]  # the answer-bearing choice
    target = rng.choice(candidates)
    project = rng.choice(PROJECTS)

    # Which helper modules (the target's kind always), and 2-3 functions in each.
    other_kinds = [k for k in KINDS if k != target.kind]
    kinds = [target.kind] + rng.sample(other_kinds, rng.randint(0, 2))
    kinds.sort(key=KINDS.index)
    modules: dict[str, list[FunctionSpec]] = {}
    module_of: dict[str, str] = {}
    for kind in kinds:
        pool = [s for s in SPECS if s.kind == kind and s is not target]
        picked = rng.sample(pool, rng.randint(1, 2))
        if kind == target.kind:
            picked.insert(rng.randint(0, len(picked)), target)
        name = rng.choice(MODULE_NAMES[kind])
        modules[name] = picked
        for spec in picked:
            module_of[spec.key] = name
    frontend = rng.choice(FRONTEND_NAMES)
    every = [s for specs in modules.values() for s in specs]
    wrapped = [target] + rng.sample([s for s in every if s is not target], min(len(every) - 1, rng.randint(1, 3)))
    wrapped.sort(key=every.index)

    target_mod = module_of[target.key]
    new_name = target.alt_name if family == "rename" else target.name
    names = {s.key: s.name for s in every}

    # Source files as the agent first sees them.
    files: dict[str, str] = {}
    for mod, specs in modules.items():
        parts = [f'"""{MODULE_DOCS[specs[0].kind]} for the {project} project."""\n']
        for spec in specs:
            if spec is target and family == "fix_bug":
                parts.append(spec.buggy())
            elif spec is target and family == "implement":
                parts.append(spec.stub())
            else:
                parts.append(spec.source())
        files[f"{mod}.py"] = "\n\n".join(parts)
    files[f"{frontend}.py"] = _frontend_source(project, wrapped, module_of, names)

    # Tests: visible cases use the final API (the new name for rename), hidden ones the rest.
    test_names = dict(names, **{target.key: new_name})
    visible: list[tuple[str, str]] = []  # (test name, assertion)
    hidden: list[tuple[str, str]] = []
    env = _reference_namespace(every, wrapped, module_of, names)
    for spec in every:
        cases = list(spec.cases)
        if spec is target:
            keep = 2 if family == "implement" else len(cases) - 1
            hidden += [
                (f"test_{new_name}_hidden_{i}", _assertion(env, spec.name, test_names[spec.key], c))
                for i, c in enumerate(cases[keep:], 1)
            ]
            cases = cases[:keep]
        else:
            cases = cases[:2]
        visible += [
            (f"test_{test_names[spec.key]}_{i}", _assertion(env, spec.name, test_names[spec.key], c))
            for i, c in enumerate(cases, 1)
        ]
    for spec in wrapped:
        case = spec.cases[0]
        call = f"show_{spec.label}({case})"
        test = (f"test_show_{spec.label}", f"assert {call} == {env[f'show_{spec.label}'](*_args(env, case))!r}")
        (hidden if spec is target and family != "rename" else visible).append(test)
    if family == "add_param":
        assert target.param is not None
        pnames = _param_namespace(target)
        hidden += [
            (
                f"test_{target.name}_{target.param.name}_{i}",
                f"assert {target.name}({c}) == {pnames[target.name](*_args(pnames, c), **_kwargs(pnames, c))!r}",
            )
            for i, c in enumerate(target.param.cases, 1)
        ]
    if family == "rename":
        hidden.append(
            (
                f"test_{target.name}_is_gone",
                f"import {target_mod}\n    assert not hasattr({target_mod}, {target.name!r})",
            )
        )

    imports_visible = _imports(every, module_of, test_names, wrapped, frontend)
    test_path = f"tests/test_{project}.py"
    files[test_path] = _test_module(f"Tests for the {project} project.", imports_visible, visible)
    hidden_src = _test_module("Hidden tests (kept outside the repository).", imports_visible, hidden)

    # Reference solution as exact edits.
    edits: list[Edit] = []
    path = f"{target_mod}.py"
    if family == "fix_bug":
        good, bad = target.bug
        snippet_bad, snippet_good = _unique_snippet(files[path], target, good, bad)
        edits.append(Edit(path, snippet_bad, snippet_good))
    elif family == "implement":
        edits.append(Edit(path, target.stub(), target.source()))
    elif family == "add_param":
        edits.append(Edit(path, target.source(), target.with_param()))
    else:
        edits += [
            Edit(path, f"def {target.name}(", f"def {new_name}("),
            Edit(
                f"{frontend}.py", f"from {target_mod} import {target.name}\n", f"from {target_mod} import {new_name}\n"
            ),
            Edit(f"{frontend}.py", f"repr({target.name}(*args))", f"repr({new_name}(*args))"),
        ]
    after = dict(files)
    for e in edits:  # each applies exactly once, in order, and leaves no second match behind
        assert after[e.path].count(e.old) == 1, (seed, split, e)
        after[e.path] = after[e.path].replace(e.old, e.new)
    assert not any(e.old in after[e.path] for e in edits), (seed, split, edits)

    param = None
    if family == "add_param":
        assert target.param is not None
        param = ParamRequirement(path, target.name, target.param.name, target.param.default)
    instruction = _instruction(family, target, path, test_path, new_name, hint_location)
    return Task(
        task_id=f"code_edit-{split}-{seed}-{family}-{target.key}",
        family=family,
        split=split,
        seed=seed,
        instruction=instruction,
        files=files,
        test_files=(test_path,),
        hidden_tests=hidden_src,
        reference_edits=tuple(edits),
        target_module=path,
        target_function=target.name,
        param=param,
        notes={"project": project, "frontend": f"{frontend}.py", "new_name": new_name},
    )


def _unique_snippet(text: str, spec: FunctionSpec, good: str, bad: str) -> tuple[str, str]:
    """The smallest (buggy, fixed) pair around the bug that occurs once in ``text`` and no longer
    occurs once it is replaced (an inserted line must not leave ``old`` intact: the env's expert
    applies each edit whose ``old`` text is still there)."""
    buggy_body = spec.body.replace(good, bad)
    lines = buggy_body.splitlines(keepends=True)
    good_lines = spec.body.splitlines(keepends=True)
    # Grow a window of whole lines around the first differing line until it is unique.
    first = next(i for i, (a, b) in enumerate(zip(lines + [""], good_lines)) if a != b)
    extra = len(good_lines) - len(lines)
    for width in range(1, len(lines) + 1):
        for start in range(max(0, first - width + 1), min(first, len(lines) - 1) + 1):
            old = "".join(lines[start : start + width])
            new = "".join(good_lines[start : start + width + extra])
            if old and text.count(old) == 1 and old not in text.replace(old, new):
                return old, new
    return spec.buggy(), spec.source()


def _instruction(family: str, spec: FunctionSpec, path: str, test_path: str, new_name: str, hint: bool) -> str:
    if family == "fix_bug":
        where = f" The bug is in the function `{spec.name}` in `{path}`." if hint else ""
        head = (
            f"The tests in `{test_path}` fail because of a bug in the source code.{where} "
            "Fix the bug so that all tests pass."
        )
    elif family == "add_param":
        assert spec.param is not None
        p = spec.param
        head = (
            f"Add a parameter `{p.name}` with the default value `{p.default}` to the function "
            f"`{spec.name}` in `{path}`, and use it: {p.describe}. Calls that do not pass "
            f"`{p.name}` must behave exactly as before."
        )
    elif family == "rename":
        head = (
            f"Rename the function `{spec.name}` in `{path}` to `{new_name}` and update every place "
            "that uses it. The tests already use the new name."
        )
    else:
        head = (
            f"Implement the function `{spec.name}` in `{path}`; it currently raises "
            f"NotImplementedError. Its docstring says what it must do: {spec.doc}"
        )
    return (
        f"Task: {head} Do not modify the files under `tests/`. Work with the tools, run the tests, "
        "and when you are done call `finish` with a message that summarises your changes as a "
        "Markdown table with the columns `file` and `change`."
    )


def _frontend_source(
    project: str, wrapped: list[FunctionSpec], module_of: dict[str, str], names: dict[str, str]
) -> str:
    lines = [f'"""Front end of the {project} project: formats helper results for display."""']
    lines += [f"from {module_of[s.key]} import {names[s.key]}" for s in wrapped]
    parts = ["\n".join(lines) + "\n"]
    for s in wrapped:
        parts.append(
            f"def show_{s.label}(*args):\n"
            f'    """Format one result for display."""\n'
            f'    return "{s.label}: " + repr({names[s.key]}(*args))\n'
        )
    return "\n\n".join(parts)


def _imports(
    every: list[FunctionSpec],
    module_of: dict[str, str],
    names: dict[str, str],
    wrapped: list[FunctionSpec],
    frontend: str,
) -> list[str]:
    by_module: dict[str, list[str]] = {}
    for s in every:
        by_module.setdefault(module_of[s.key], []).append(names[s.key])
    lines = [f"from {m} import {', '.join(ns)}" for m, ns in by_module.items()]
    lines.append(f"from {frontend} import {', '.join(f'show_{s.label}' for s in wrapped)}")
    return lines


def _test_module(doc: str, imports: list[str], tests: list[tuple[str, str]]) -> str:
    parts = [f'"""{doc}"""\n' + "\n".join(imports) + "\n"]
    parts += [f"def {name}():\n    {body}\n" for name, body in tests]
    return "\n\n".join(parts)


def _reference_namespace(
    every: list[FunctionSpec], wrapped: list[FunctionSpec], module_of: dict[str, str], names: dict[str, str]
) -> dict:
    env: dict = {}
    for s in every:
        exec(s.source(), env)  # our own reference code, to compute expected values
    for s in wrapped:
        wrapper = f"def show_{s.label}(*args):\n    return {s.label!r} + ': ' + repr({names[s.key]}(*args))\n"
        exec(wrapper, env)
    return env


def _param_namespace(spec: FunctionSpec) -> dict:
    env: dict = {}
    exec(spec.with_param(), env)
    return env


def _args(env: dict, case: str) -> tuple:
    return eval(f"(lambda *a, **k: a)({case})", env)  # generator-owned literals


def _kwargs(env: dict, case: str) -> dict:
    return eval(f"(lambda *a, **k: k)({case})", env)


def _assertion(env: dict, ref_name: str, shown_name: str, case: str) -> str:
    expected = env[ref_name](*_args(env, case))
    return f"assert {shown_name}({case}) == {expected!r}"


# ----- the scripted expert -----------------------------------------------------------------------------
def expert_responses(task: Task) -> list[str]:
    """The reference solution as model responses: view, the edits, run the tests, finish with a table."""
    return [
        view_call(task),
        *(edit_call(e) for e in task.reference_edits),
        format_tool_call("run_tests", {}),
        finish_call(task),
    ]


def view_call(task: Task) -> str:
    return f"I will read the file first.\n{format_tool_call('view_file', {'path': task.target_module})}"


def edit_call(edit: Edit) -> str:
    return format_tool_call("replace_in_file", {"path": edit.path, "old": edit.old, "new": edit.new})


def finish_call(task: Task) -> str:
    paths = dict.fromkeys(e.path for e in task.reference_edits)
    rows = "\n".join(f"| {p} | {_change_summary(task, p)} |" for p in paths)
    return format_tool_call("finish", {"message": f"Done.\n\n| file | change |\n|---|---|\n{rows}"})


def _change_summary(task: Task, path: str) -> str:
    return {
        "fix_bug": f"fixed the bug in `{task.target_function}`",
        "add_param": f"added `{task.param.name if task.param else ''}` to `{task.target_function}`",
        "rename": f"renamed `{task.target_function}` to `{task.notes['new_name']}`",
        "implement": f"implemented `{task.target_function}`",
    }[task.family]
