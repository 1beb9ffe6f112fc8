"""The checks of ``env.options`` every env makes: known names, and the types YAML may get wrong."""

from __future__ import annotations

from dataclasses import fields


def known_options(options: dict | None, opts_cls, env_name: str, *, tuples: tuple[str, ...] = ()) -> dict:
    """A copy of ``env.options``; raise ValueError naming unknown keys and the valid ones.

    ``tuples``: options that take a list, where one bare value stands for a list of one (a YAML
    ``task_types: pick_and_place_simple``); they come back as tuples (the options are frozen)."""
    options = dict(options or {})
    known = sorted(f.name for f in fields(opts_cls))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown {env_name} option(s) {unknown}; known options: {known}")
    for key in tuples:
        if key in options:
            value = options[key]
            options[key] = (value,) if isinstance(value, (str, int)) else tuple(value)
    return options


def check_ints(env_name: str, opts, names: tuple[str, ...]) -> None:
    """Raise ValueError unless each named option is an int (YAML's true/false are not)."""
    for name in names:
        value = getattr(opts, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{env_name} option {name} must be an int, got {value!r}")


def check_bools(env_name: str, opts, names: tuple[str, ...]) -> None:
    """Raise ValueError unless each named option is true or false."""
    for name in names:
        value = getattr(opts, name)
        if not isinstance(value, bool):
            raise ValueError(f"{env_name} option {name} must be true or false, got {value!r}")
