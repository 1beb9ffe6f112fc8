"""Options of a method: the flat union of its parts' option dataclasses, validated once.

Users override options flat (``method.beta=10 method.lam=0.1``): each key belongs to exactly one
of the method's parts. If two parts of one method declare the same name, the key must be given
qualified by the part's slot (``method.advantage.gamma=0.9``); a bare one is refused, naming both.
A preset may pin options (``fixed:``); overriding a pinned option is refused, saying what it is
pinned to. A name no part declares is refused with the nearest valid names (``UnknownOption``):
the method dict is open in the typed config (``dict[str, Any]``, so that adding a method never
touches the schema), so this check is the only one an option's name goes through.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any


def require(cond: bool, msg: str) -> None:
    """Options validation: raise ValueError with the message when ``cond`` is false."""
    if not cond:
        raise ValueError(msg)


def _accepts(hint, value) -> bool:
    if hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, hint)


def check_types(opts, method: str) -> None:
    """Every option has the type its field declares (Hydra hands over YAML scalars as parsed)."""
    hints = typing.get_type_hints(type(opts))
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if not _accepts(hints[f.name], value):
            raise ValueError(
                f"method={method}: method.{f.name}={value!r} should be of type {hints[f.name]}".replace("typing.", "")
                .replace("<class '", "")
                .replace("'>", "")
            )


def did_you_mean(name: str, choices, n: int = 3) -> list[str]:
    """The names in ``choices`` nearest to ``name`` (difflib's ratio >= 0.6), best first."""
    return difflib.get_close_matches(name, sorted(set(choices)), n=n, cutoff=0.6)


class UnknownOption(ValueError):
    """Option names that no part of the method declares: a typo, or an option of another method.

    ``elsewhere`` maps option names to the methods (presets) whose parts declare them (the registry
    fills it in, ``pipeline.methods.option_index``); the message names, for each unknown name, the
    nearest of this method's options, else the methods that have it, else the nearest of theirs."""

    def __init__(
        self, method: str, unknown: list[str], known: list[str], elsewhere: dict[str, list[str]] | None = None
    ):
        self.method, self.unknown, self.known = method, sorted(unknown), sorted(known)
        self.elsewhere = dict(elsewhere or {})
        super().__init__(self._message())

    def _hint(self, key: str) -> str:
        near = did_you_mean(key, self.known)
        if near:
            return f"did you mean method.{near[0]}?"
        if self.elsewhere.get(key):
            return f"methods with {key}: {', '.join(self.elsewhere[key])}"
        other = did_you_mean(key, self.elsewhere)
        if other:
            return f"did you mean {other[0]}? (an option of {', '.join(self.elsewhere[other[0]])})"
        return ""

    def _message(self) -> str:
        hints = {k: h for k in self.unknown if (h := self._hint(k))}
        text = f"method={self.method} has no option(s) {self.unknown}"
        if len(self.unknown) == 1 and hints:
            text += f": {hints[self.unknown[0]]}"
        elif hints:
            text += ": " + "; ".join(f"{k}: {h}" for k, h in hints.items())
        return text + f"; its options are {self.known}"


def split_options(
    method: str, raw: dict[str, Any], owners: dict[str, type], fixed: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """``raw`` option keys -> {slot: {field: value}} for the slots in ``owners`` (slot -> Options)."""
    fields = {slot: {f.name for f in dataclasses.fields(cls)} for slot, cls in owners.items()}
    out: dict[str, dict[str, Any]] = {slot: {} for slot in owners}
    pinned = set(fixed)
    unknown: list[str] = []

    def place(slot: str, key: str, value: Any) -> None:
        if key in pinned:
            raise ValueError(
                f"method={method} has no option(s) [{key!r}] ({method} fixes {key}={fixed[key]!r}; "
                "use a method whose parts leave it free)"
            )
        out[slot][key] = value

    for key, value in {**fixed, **raw}.items():
        if key in owners and isinstance(value, dict):  # qualified: method.<slot>.<key>
            for k, v in value.items():
                if k not in fields[key]:
                    near = did_you_mean(k, fields[key])
                    raise ValueError(
                        f"method={method}: the {key} part has no option {k!r}"
                        + (f": did you mean method.{key}.{near[0]}?" if near else "")
                        + f"; its options are {sorted(fields[key])}"
                    )
                place(key, k, v)
            continue
        slots = [s for s, names in fields.items() if key in names]
        if not slots:
            unknown.append(key)
        elif len(slots) > 1:
            raise ValueError(
                f"method={method}: method.{key} is an option of the {' and the '.join(slots)} parts; "
                f"name one: method.{slots[0]}.{key}=..."
            )
        elif key in fixed and raw.get(key, fixed[key]) != fixed[key]:
            place(slots[0], key, raw[key])  # raises: pinned
        else:
            out[slots[0]][key] = value
    if unknown:
        raise UnknownOption(method, unknown, known_options(owners, fixed))
    return out


def known_options(owners: dict[str, type], fixed: dict[str, Any]) -> list[str]:
    """The option names a method with these parts (slot -> Options) takes: its parts' fields, less
    those its preset pins."""
    return sorted({f.name for cls in owners.values() for f in dataclasses.fields(cls)} - set(fixed))


def flat_options(method: str, parts: dict[str, object]) -> Any:
    """One dataclass instance holding every part's options as attributes (``method.opts.beta``)."""
    values: dict[str, Any] = {}
    for part in parts.values():
        for f in dataclasses.fields(part.opts):
            values.setdefault(f.name, getattr(part.opts, f.name))
    cls = dataclasses.make_dataclass(f"{method}_options", [(k, object) for k in values])
    return cls(**values)


__all__ = ["UnknownOption", "check_types", "did_you_mean", "flat_options", "known_options", "require", "split_options"]
