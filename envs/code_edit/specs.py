"""The small pure functions that code_edit's generated repositories are made of (``SPECS``).

The table is data, ``specs.yaml`` beside this module (package data); ``load_specs`` reads it once at
import into the typed records below and rejects an entry with a missing, unknown or non-string
field (``ValueError`` naming the entry's key and the field).

Each ``FunctionSpec`` is one function of kind text, math or list with ONE fixed one-line bug
(``bug``: the correct snippet and its buggy replacement; at least one of the cases a ``fix_bug``
task shows exposes it), a fixed rename target (``alt_name``), a front-end label (the wrapper
``show_<label>``), argument lists (``cases``: source text; expected values are computed by running
the reference at generation time) and, for most, a ``ParamSpec`` (a keyword parameter to add, with
its default, the new body and cases that pass it). So a task's reference edit is fixed by its
(family, spec) pair: ``tasks.py`` assigns each pair to one split.

Keys, names, rename targets and labels are unique across ``SPECS`` (checked at load), so any
selection of specs can share a module, a front end and a test file.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from importlib import resources

import yaml


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
        return (
            f"def {name or self.name}({params or self.params}):\n"
            f'    """{self.doc}"""\n{body if body is not None else self.body}'
        )

    def stub(self) -> str:
        return self.source(body="    raise NotImplementedError\n")

    def buggy(self) -> str:
        good, bad = self.bug
        assert self.body.count(good) == 1, self.key
        return self.source(body=self.body.replace(good, bad))

    def with_param(self) -> str:
        assert self.param is not None
        return self.source(body=self.param.body, params=f"{self.params}, {self.param.name}={self.param.default}")


SPECS_FILE = "specs.yaml"
_TUPLE_FIELDS = {"bug": 2, "cases": None}  # lists in the file, tuples in the records (bug: exactly 2)


def _b(text: str) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n") + "\n", "    ")


def _fields(cls: type, entry: object, where: str, prefix: str = "") -> dict:
    """``entry``'s values as ``cls``'s constructor arguments, checked: YAML reads unquoted ``1``,
    ``True`` or ``null`` as other types, and every value of a spec is Python source text."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: {prefix.rstrip('.') or 'the entry'} is not a mapping")
    known = {f.name: f.default is dataclasses.MISSING for f in dataclasses.fields(cls)}  # name -> required
    for name in entry:
        if name not in known:
            raise ValueError(f"{where}: unknown field {prefix + str(name)!r}")
    for name, required in known.items():
        if required and name not in entry:
            raise ValueError(f"{where}: missing field {prefix + name!r}")
    args = {}
    for name, value in entry.items():
        if name == "param":
            args[name] = None if value is None else ParamSpec(**_fields(ParamSpec, value, where, "param."))
        elif name in _TUPLE_FIELDS:
            size = _TUPLE_FIELDS[name]
            strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
            if not strings or (size is not None and len(value) != size):
                shape = f"{size} strings" if size else "strings"
                raise ValueError(f"{where}: field {prefix + name!r} must be a list of {shape}")
            args[name] = tuple(value)
        elif not isinstance(value, str):
            raise ValueError(f"{where}: field {prefix + name!r} must be a string, not {type(value).__name__}")
        else:
            args[name] = _b(value) if name == "body" else value
    return args


def load_specs(text: str) -> tuple[FunctionSpec, ...]:
    """The specs of a ``specs.yaml`` text, in its order, checked field by field and for uniqueness."""
    entries = yaml.safe_load(text)
    if not isinstance(entries, list):
        raise ValueError(f"code_edit {SPECS_FILE}: expected a list of specs")
    specs = []
    for i, entry in enumerate(entries):
        key = entry.get("key") if isinstance(entry, dict) else None
        where = f"code_edit {SPECS_FILE}: " + (f"spec {key!r}" if isinstance(key, str) else f"entry {i}")
        specs.append(FunctionSpec(**_fields(FunctionSpec, entry, where)))
    keys = [s.key for s in specs]
    names = [s.name for s in specs] + [s.alt_name for s in specs]
    labels = [s.label for s in specs]
    for what, values in (("key", keys), ("name or alt_name", names), ("label", labels)):
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise ValueError(f"code_edit {SPECS_FILE}: duplicate {what} {dup}")
    return tuple(specs)


SPECS: tuple[FunctionSpec, ...] = load_specs(resources.files(__package__).joinpath(SPECS_FILE).read_text("utf-8"))
SPEC_BY_KEY = {s.key: s for s in SPECS}
