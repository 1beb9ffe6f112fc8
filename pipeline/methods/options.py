"""Options of a method: the flat union of its parts' option dataclasses, validated once.

Users override options flat (``method.beta=10 method.lam=0.1``): each key belongs to exactly one
of the method's parts. If two parts of one method declare the same name, the key must be given
qualified by the part's slot (``method.advantage.gamma=0.9``); a bare one is refused, naming both.
A preset may pin options (``fixed:``); overriding a pinned option is refused, saying what it is
pinned to.
"""

from __future__ import annotations

import dataclasses
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
                    raise ValueError(
                        f"method={method}: the {key} part has no option {k!r}; its options are {sorted(fields[key])}"
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
        known = sorted({n for names in fields.values() for n in names} - pinned)
        raise ValueError(f"method={method} has no option(s) {sorted(unknown)}; its options are {known}")
    return out


def flat_options(method: str, parts: dict[str, object]) -> Any:
    """One dataclass instance holding every part's options as attributes (``method.opts.beta``)."""
    values: dict[str, Any] = {}
    for part in parts.values():
        for f in dataclasses.fields(part.opts):
            values.setdefault(f.name, getattr(part.opts, f.name))
    cls = dataclasses.make_dataclass(f"{method}_options", [(k, object) for k in values])
    return cls(**values)


__all__ = ["check_types", "flat_options", "require", "split_options"]
