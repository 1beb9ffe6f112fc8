"""Generated mini-repositories with an editing task, deterministic by (split, seed).

A repository holds one to three helper modules (text, math, list helpers: one to three functions
each, drawn from ``SPECS``), a front-end module whose ``show_*`` wrappers call some of them, and
one visible test file ``tests/test_<project>.py`` (one ``test_*`` function per case). Every task
also carries hidden tests (run only by the final judgment, never placed in the repo) and a
reference solution: a list of exact ``replace_in_file`` edits that the scripted expert replays.

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

A real task (``generate_task(2, "train")``)::

    Task: Rename the function `is_palindrome` in `strutil.py` to `reads_same_backwards` and update
    every place that uses it. The tests already use the new name. Do not modify the files under
    `tests/`. Work with the tools, run the tests, and when you are done call `finish` with a
    message that summarises your changes as a Markdown table with the columns `file` and `change`.
    files: strutil.py, app.py, tests/test_travel.py
    reference: strutil.py  "def is_palindrome("                 -> "def reads_same_backwards("
               app.py      "from strutil import is_palindrome\n" -> "from strutil import reads_same_backwards\n"
               app.py      "repr(is_palindrome(*args))"        -> "repr(reads_same_backwards(*args))"
    hidden tests: reads_same_backwards('No lemon, no melon') is True, and
                  `not hasattr(strutil, "is_palindrome")`
"""
from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass, field

from envs.code_edit.tools import format_tool_call

FAMILIES = ("fix_bug", "add_param", "rename", "implement")
KINDS = ("text", "math", "list")
MODULE_NAMES = {"text": ("textkit", "wordtools", "strutil"), "math": ("mathkit", "calc", "numtools"),
                "list": ("listkit", "seqtools", "itemutil")}
FRONTEND_NAMES = ("app", "report", "frontend", "display")
PROJECTS = ("ledger", "notes", "shop", "garden", "library", "weather", "recipes", "fitness", "travel", "music")
MODULE_DOCS = {"text": "Text helpers", "math": "Number helpers", "list": "List helpers"}


@dataclass(frozen=True)
class ParamSpec:
    """A parameter to add: ``name=default`` and the body that uses it."""

    name: str
    default: str  # Python source of the default value
    body: str  # new function body (4-space indented)
    cases: tuple[str, ...]  # argument lists (source) that pass the new parameter
    describe: str  # how the body must use it (goes into the instruction)


@dataclass(frozen=True)
class FunctionSpec:
    """One small pure function, with a bug, an alternative name and (optionally) a parameter to add."""

    key: str
    kind: str  # text | math | list
    name: str
    alt_name: str  # the rename target
    label: str  # the front end's wrapper is show_<label>
    params: str
    doc: str
    body: str  # 4-space indented, ends with a newline
    bug: tuple[str, str]  # (correct snippet, buggy snippet) of the body
    cases: tuple[str, ...]  # argument lists (source); the last one is kept for hidden tests
    param: ParamSpec | None = None

    def source(self, name: str | None = None, *, body: str | None = None, params: str | None = None) -> str:
        return (f"def {name or self.name}({params or self.params}):\n"
                f'    """{self.doc}"""\n{body if body is not None else self.body}')

    def stub(self) -> str:
        return self.source(body="    raise NotImplementedError\n")

    def buggy(self) -> str:
        good, bad = self.bug
        assert self.body.count(good) == 1, self.key
        return self.source(body=self.body.replace(good, bad))

    def with_param(self) -> str:
        assert self.param is not None
        return self.source(body=self.param.body, params=f"{self.params}, {self.param.name}={self.param.default}")


def _b(text: str) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n") + "\n", "    ")


SPECS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        key="count_words", kind="text", name="count_words", alt_name="word_count", label="words",
        params="text", doc="Return the number of whitespace-separated words in `text`.",
        body=_b("return len(text.split())"), bug=("text.split()", 'text.split(" ")'),
        cases=("'a b  c'", "''", "'one'", "'  lead and trail '"),
        param=ParamSpec("min_length", "1", _b("return len([word for word in text.split() if len(word) >= min_length])"),
                        ("'a bb ccc', min_length=2", "'a bb ccc', min_length=4"),
                        "only words with at least `min_length` characters are counted")),
    FunctionSpec(
        key="is_palindrome", kind="text", name="is_palindrome", alt_name="reads_same_backwards",
        label="palindrome", params="text",
        doc="Return True if `text` reads the same backwards, ignoring case and any character that is "
            "not a letter or digit.",
        body=_b("""
            letters = [c.lower() for c in text if c.isalnum()]
            return letters == letters[::-1]"""),
        bug=("[c.lower() for c", "[c for c"),
        cases=("'Racecar'", "'A man, a plan, a canal: Panama'", "'abc'", "'No lemon, no melon'"),
        param=ParamSpec("ignore_case", "True", _b("""
            letters = [c.lower() if ignore_case else c for c in text if c.isalnum()]
            return letters == letters[::-1]"""),
                        ("'Racecar', ignore_case=False", "'abba', ignore_case=False"),
                        "when `ignore_case` is false, upper- and lower-case letters count as different")),
    FunctionSpec(
        key="title_case", kind="text", name="title_case", alt_name="capitalize_words", label="title",
        params="text",
        doc="Return `text` with every word capitalised (first letter upper-case, the rest lower-case), "
            "words separated by single spaces.",
        body=_b('return " ".join(word[:1].upper() + word[1:].lower() for word in text.split())'),
        bug=("word[1:].lower()", "word[1:]"),
        cases=("'hELLO wORLD'", "'hello world'", "''", "'pYTHON'"),
        param=ParamSpec("sep", '" "',
                        _b("return sep.join(word[:1].upper() + word[1:].lower() for word in text.split())"),
                        ("'big red dog', sep='-'", "'x y', sep=''"), "the words are joined with `sep`")),
    FunctionSpec(
        key="truncate", kind="text", name="truncate", alt_name="shorten", label="short", params="text, limit",
        doc="Return `text` unchanged if it has at most `limit` characters, else its first `limit - 3` "
            "characters followed by '...'.",
        body=_b("""
            if len(text) <= limit:
                return text
            return text[:limit - 3] + "..."
            """),
        bug=("len(text) <= limit", "len(text) < limit"),
        cases=("'abcde', 5", "'abcdefgh', 6", "'hi', 10", "'hello world', 8"),
        param=ParamSpec("ellipsis", '"..."', _b("""
            if len(text) <= limit:
                return text
            return text[:limit - len(ellipsis)] + ellipsis
            """), ("'abcdefgh', 6, ellipsis='~'", "'abcdefgh', 5, ellipsis=''"),
            "`ellipsis` replaces the '...' marker and the result still has at most `limit` characters")),
    FunctionSpec(
        key="initials", kind="text", name="initials", alt_name="name_initials", label="initials", params="name",
        doc="Return the upper-case first letters of the words of `name`, e.g. 'ada lovelace' -> 'AL'.",
        body=_b('return "".join(part[0].upper() for part in name.split())'),
        bug=("name.split()", 'name.split(" ")'),
        cases=("'Grace  Brewster Hopper'", "'ada lovelace'", "''", "' alan turing'"),
        param=ParamSpec("sep", '""', _b("return sep.join(part[0].upper() for part in name.split())"),
                        ("'ada lovelace', sep='.'", "'alan mathison turing', sep=' '"),
                        "the initials are joined with `sep`")),
    FunctionSpec(
        key="clamp", kind="math", name="clamp", alt_name="bound", label="clamped", params="value, low, high",
        doc="Return `value` limited to the range [`low`, `high`].",
        body=_b("return max(low, min(value, high))"),
        bug=("max(low, min(value, high))", "min(low, max(value, high))"),
        cases=("5, 0, 10", "-3, 0, 10", "42, 0, 10", "0.5, 0, 1")),
    FunctionSpec(
        key="mean", kind="math", name="mean", alt_name="average", label="mean", params="values",
        doc="Return the arithmetic mean of `values`, or 0.0 for an empty list.",
        body=_b("""
            if not values:
                return 0.0
            return sum(values) / len(values)
            """),
        bug=("sum(values) / len", "sum(values) // len"),
        cases=("[1, 2]", "[2, 4, 6]", "[]", "[1.5, 2.5, 4]"),
        param=ParamSpec("default", "0.0", _b("""
            if not values:
                return default
            return sum(values) / len(values)
            """), ("[], default=None", "[], default=-1"), "`default` is returned for an empty list")),
    FunctionSpec(
        key="percent", kind="math", name="percent", alt_name="percentage", label="percent", params="part, whole",
        doc="Return `part` as a percentage of `whole`, rounded to 1 decimal place; 0.0 when `whole` is 0.",
        body=_b("""
            if whole == 0:
                return 0.0
            return round(100 * part / whole, 1)
            """),
        bug=("round(100 * part / whole, 1)", "round(part / whole, 1)"),
        cases=("1, 4", "1, 3", "0, 0", "5, 8"),
        param=ParamSpec("ndigits", "1", _b("""
            if whole == 0:
                return 0.0
            return round(100 * part / whole, ndigits)
            """), ("1, 3, ndigits=2", "2, 3, ndigits=0"), "the result is rounded to `ndigits` decimal places")),
    FunctionSpec(
        key="median", kind="math", name="median", alt_name="middle_value", label="median", params="values",
        doc="Return the median of a non-empty list of numbers (the mean of the two middle values for an "
            "even count).",
        body=_b("""
            ordered = sorted(values)
            mid = len(ordered) // 2
            if len(ordered) % 2:
                return ordered[mid]
            return (ordered[mid - 1] + ordered[mid]) / 2
            """),
        bug=("ordered = sorted(values)", "ordered = list(values)"),
        cases=("[3, 1, 2]", "[4, 1, 3, 2]", "[5]", "[9, 7, 8]")),
    FunctionSpec(
        key="scale", kind="math", name="scale", alt_name="rescale", label="scaled", params="values, factor",
        doc="Return a new list with every value of `values` multiplied by `factor`.",
        body=_b("return [value * factor for value in values]"),
        bug=("value * factor", "value + factor"),
        cases=("[1, 2, 3], 3", "[], 5", "[0.5], 4", "[-1, 10], 0"),
        param=ParamSpec("offset", "0", _b("return [value * factor + offset for value in values]"),
                        ("[1, 2], 3, offset=1", "[0], 2, offset=-1"), "`offset` is added to every scaled value")),
    FunctionSpec(
        key="chunk", kind="list", name="chunk", alt_name="split_into_chunks", label="chunks", params="items, size",
        doc="Split `items` into consecutive lists of `size` items; the last one may be shorter.",
        body=_b("return [items[i:i + size] for i in range(0, len(items), size)]"),
        bug=("range(0, len(items), size)", "range(0, len(items) - size, size)"),
        cases=("[1, 2, 3, 4, 5], 2", "[], 3", "[1, 2], 5", "['a', 'b', 'c', 'd'], 2")),
    FunctionSpec(
        key="dedupe", kind="list", name="dedupe", alt_name="unique_items", label="unique", params="items",
        doc="Return the items of `items` without duplicates, keeping the first occurrence of each, in order.",
        body=_b("""
            seen = set()
            result = []
            for item in items:
                if item not in seen:
                    seen.add(item)
                    result.append(item)
            return result
            """),
        bug=("            seen.add(item)\n", ""),
        cases=("[3, 1, 3, 2, 1]", "[]", "['a', 'b', 'a']", "[1, 1, 1]"),
        param=ParamSpec("key", "None", _b("""
            seen = set()
            result = []
            for item in items:
                marker = item if key is None else key(item)
                if marker not in seen:
                    seen.add(marker)
                    result.append(item)
            return result
            """), ("['a', 'A', 'b'], key=str.lower", "[1, -1, 2], key=abs"),
            "when `key` is given, two items are duplicates if `key(item)` is equal")),
    FunctionSpec(
        key="running_total", kind="list", name="running_total", alt_name="cumulative_sum", label="totals",
        params="values",
        doc="Return the running totals of `values`: element i is the sum of values[0] to values[i].",
        body=_b("""
            totals = []
            total = 0
            for value in values:
                total += value
                totals.append(total)
            return totals
            """),
        bug=("totals.append(total)", "totals.append(value)"),
        cases=("[1, 2, 3]", "[]", "[5, -2]", "[0, 4, 4]"),
        param=ParamSpec("start", "0", _b("""
            totals = []
            total = start
            for value in values:
                total += value
                totals.append(total)
            return totals
            """), ("[1, 2], start=10", "[3], start=-3"), "the running total starts at `start`")),
    FunctionSpec(
        key="flatten", kind="list", name="flatten", alt_name="flatten_lists", label="flat", params="nested",
        doc="Return one list holding the items of every list in `nested`, in order.",
        body=_b("return [item for group in nested for item in group]"),
        bug=("in nested for", "in nested[1:] for"),
        cases=("[[1, 2], [3], []]", "[]", "[['a'], ['b', 'c']]", "[[0], [0, 1]]")),
    FunctionSpec(
        key="top_n", kind="list", name="top_n", alt_name="largest", label="top", params="items, n",
        doc="Return the `n` largest items of `items`, largest first.",
        body=_b("return sorted(items, reverse=True)[:n]"),
        bug=("sorted(items, reverse=True)", "sorted(items)"),
        cases=("[3, 1, 2], 2", "[5], 3", "[], 1", "[1, 9, 4, 7], 1"),
        param=ParamSpec("key", "None", _b("return sorted(items, key=key, reverse=True)[:n]"),
                        ("['bb', 'a', 'ccc'], 2, key=len", "[-5, 2, -1], 1, key=abs"),
                        "`key` is passed to `sorted` as the sort key")),
)
SPEC_BY_KEY = {s.key: s for s in SPECS}


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
def generate_task(seed: int, split: str = "train", families: tuple[str, ...] = FAMILIES,
                  hint_location: bool = True) -> Task:
    """The task of (split, seed): family ``families[seed % len(families)]``, the rest drawn by the seed."""
    if not families:
        raise ValueError("code_edit: task_families must not be empty")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"code_edit: unknown task families {unknown}; choose from {list(FAMILIES)}")
    family = families[seed % len(families)]
    rng = random.Random(f"code_edit/{split}/{seed}")
    candidates = [s for s in SPECS if family != "add_param" or s.param is not None]
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
            hidden += [(f"test_{new_name}_hidden_{i}", _assertion(env, spec.name, test_names[spec.key], c))
                       for i, c in enumerate(cases[keep:], 1)]
            cases = cases[:keep]
        else:
            cases = cases[:2]
        visible += [(f"test_{test_names[spec.key]}_{i}", _assertion(env, spec.name, test_names[spec.key], c))
                    for i, c in enumerate(cases, 1)]
    for spec in wrapped:
        case = spec.cases[0]
        call = f"show_{spec.label}({case})"
        test = (f"test_show_{spec.label}", f"assert {call} == {env[f'show_{spec.label}'](*_args(env, case))!r}")
        (hidden if spec is target and family != "rename" else visible).append(test)
    if family == "add_param":
        assert target.param is not None
        pnames = _param_namespace(target)
        hidden += [(f"test_{target.name}_{target.param.name}_{i}",
                    f"assert {target.name}({c}) == {pnames[target.name](*_args(pnames, c), **_kwargs(pnames, c))!r}")
                   for i, c in enumerate(target.param.cases, 1)]
    if family == "rename":
        hidden.append((f"test_{target.name}_is_gone",
                       f"import {target_mod}\n    assert not hasattr({target_mod}, {target.name!r})"))

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
        edits += [Edit(path, f"def {target.name}(", f"def {new_name}("),
                  Edit(f"{frontend}.py", f"from {target_mod} import {target.name}\n",
                       f"from {target_mod} import {new_name}\n"),
                  Edit(f"{frontend}.py", f"repr({target.name}(*args))", f"repr({new_name}(*args))")]
    for e in edits:
        assert files[e.path].count(e.old) == 1, (seed, split, e)

    param = None
    if family == "add_param":
        assert target.param is not None
        param = ParamRequirement(path, target.name, target.param.name, target.param.default)
    instruction = _instruction(family, target, path, test_path, new_name, hint_location)
    return Task(task_id=f"code_edit-{split}-{seed}-{family}-{target.key}", family=family, split=split, seed=seed,
                instruction=instruction, files=files, test_files=(test_path,), hidden_tests=hidden_src,
                reference_edits=tuple(edits), target_module=path, target_function=target.name, param=param,
                notes={"project": project, "frontend": f"{frontend}.py", "new_name": new_name})


def _unique_snippet(text: str, spec: FunctionSpec, good: str, bad: str) -> tuple[str, str]:
    """The smallest (buggy, fixed) pair around the bug that occurs once in ``text``."""
    buggy_body = spec.body.replace(good, bad)
    lines = buggy_body.splitlines(keepends=True)
    good_lines = spec.body.splitlines(keepends=True)
    # Grow a window of whole lines around the first differing line until it is unique.
    first = next(i for i, (a, b) in enumerate(zip(lines + [""], good_lines)) if a != b)
    extra = len(good_lines) - len(lines)
    for width in range(1, len(lines) + 1):
        for start in range(max(0, first - width + 1), min(first, len(lines) - 1) + 1):
            old = "".join(lines[start:start + width])
            new = "".join(good_lines[start:start + width + extra])
            if old and text.count(old) == 1:
                return old, new
    return spec.buggy(), spec.source()


def _instruction(family: str, spec: FunctionSpec, path: str, test_path: str, new_name: str, hint: bool) -> str:
    if family == "fix_bug":
        where = f" The bug is in the function `{spec.name}` in `{path}`." if hint else ""
        head = (f"The tests in `{test_path}` fail because of a bug in the source code.{where} "
                "Fix the bug so that all tests pass.")
    elif family == "add_param":
        assert spec.param is not None
        p = spec.param
        head = (f"Add a parameter `{p.name}` with the default value `{p.default}` to the function "
                f"`{spec.name}` in `{path}`, and use it: {p.describe}. Calls that do not pass "
                f"`{p.name}` must behave exactly as before.")
    elif family == "rename":
        head = (f"Rename the function `{spec.name}` in `{path}` to `{new_name}` and update every place "
                "that uses it. The tests already use the new name.")
    else:
        head = (f"Implement the function `{spec.name}` in `{path}`; it currently raises "
                f"NotImplementedError. Its docstring says what it must do: {spec.doc}")
    return (f"Task: {head} Do not modify the files under `tests/`. Work with the tools, run the tests, "
            "and when you are done call `finish` with a message that summarises your changes as a "
            "Markdown table with the columns `file` and `change`.")


def _frontend_source(project: str, wrapped: list[FunctionSpec], module_of: dict[str, str],
                     names: dict[str, str]) -> str:
    lines = [f'"""Front end of the {project} project: formats helper results for display."""']
    lines += [f"from {module_of[s.key]} import {names[s.key]}" for s in wrapped]
    parts = ["\n".join(lines) + "\n"]
    for s in wrapped:
        parts.append(f"def show_{s.label}(*args):\n"
                     f'    """Format one result for display."""\n'
                     f'    return "{s.label}: " + repr({names[s.key]}(*args))\n')
    return "\n\n".join(parts)


def _imports(every: list[FunctionSpec], module_of: dict[str, str], names: dict[str, str],
             wrapped: list[FunctionSpec], frontend: str) -> list[str]:
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


def _reference_namespace(every: list[FunctionSpec], wrapped: list[FunctionSpec], module_of: dict[str, str],
                         names: dict[str, str]) -> dict:
    env: dict = {}
    for s in every:
        exec(s.source(), env)  # noqa: S102 - our own reference code, to compute expected values
    for s in wrapped:
        wrapper = f"def show_{s.label}(*args):\n    return {s.label!r} + ': ' + repr({names[s.key]}(*args))\n"
        exec(wrapper, env)  # noqa: S102
    return env


def _param_namespace(spec: FunctionSpec) -> dict:
    env: dict = {}
    exec(spec.with_param(), env)  # noqa: S102
    return env


def _args(env: dict, case: str) -> tuple:
    return eval(f"(lambda *a, **k: a)({case})", env)  # noqa: S307 - generator-owned literals


def _kwargs(env: dict, case: str) -> dict:
    return eval(f"(lambda *a, **k: k)({case})", env)  # noqa: S307


def _assertion(env: dict, ref_name: str, shown_name: str, case: str) -> str:
    expected = env[ref_name](*_args(env, case))
    return f"assert {shown_name}({case}) == {expected!r}"


# ----- the scripted expert -----------------------------------------------------------------------------
def expert_responses(task: Task) -> list[str]:
    """The reference solution as model responses: view, the edits, run the tests, finish with a table."""
    return [view_call(task), *(edit_call(e) for e in task.reference_edits), format_tool_call("run_tests", {}),
            finish_call(task)]


def view_call(task: Task) -> str:
    return f"I will read the file first.\n{format_tool_call('view_file', {'path': task.target_module})}"


def edit_call(edit: Edit) -> str:
    return format_tool_call("replace_in_file", {"path": edit.path, "old": edit.old, "new": edit.new})


def finish_call(task: Task) -> str:
    paths = dict.fromkeys(e.path for e in task.reference_edits)
    rows = "\n".join(f"| {p} | {_change_summary(task, p)} |" for p in paths)
    return format_tool_call("finish", {"message": f"Done.\n\n| file | change |\n|---|---|\n{rows}"})


def _change_summary(task: Task, path: str) -> str:
    return {"fix_bug": f"fixed the bug in `{task.target_function}`",
            "add_param": f"added `{task.param.name if task.param else ''}` to `{task.target_function}`",
            "rename": f"renamed `{task.target_function}` to `{task.notes['new_name']}`",
            "implement": f"implemented `{task.target_function}`"}[task.family]
