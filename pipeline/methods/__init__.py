"""The method registry: ``method=<name>`` names a preset, ``conf/method/<name>.yaml``.

A preset names one part per slot (``parts:``, see ``pipeline.methods.parts``), its option values
(flat keys, each owned by one of its parts), optionally options it pins (``fixed:``) and the
prefix of its metrics (``prefix:``, default its name). ``build_method`` composes the parts into a
``Method``; a method dict that carries its own ``parts`` needs no preset file (the first phase
of a two-phase method is built that way). Adding a combination is adding a YAML.

An option name that none of the method's parts declares is refused (``UnknownOption``), with the
nearest of its options, else the presets that have it (``option_index``): the typed config keeps
``method`` an open dict, so ``+method.betaa=3`` reaches this check and no earlier one.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import CONF_DIR
from pipeline.methods.method import Method
from pipeline.methods.options import UnknownOption, check_types, did_you_mean, known_options, split_options
from pipeline.methods.parts import DEFAULT_KINDS, PARTS, SLOTS, Setting, load_parts

PRESET_DIR = CONF_DIR / "method"
META_KEYS = ("name", "parts", "fixed", "prefix")


def available_methods() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset's YAML as a dict; values that interpolate the run config (``${env.name}``) are
    left out, so outside Hydra the part's own default applies."""
    from omegaconf import OmegaConf

    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"method={name!r} is unknown; choose one of {available_methods()}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {k: v for k, v in raw.items() if not (isinstance(v, str) and v.startswith("${"))}


def _kinds(raw: dict, name: str) -> dict[str, str]:
    """Slot -> part kind of a method dict (the default kind for a slot it leaves out)."""
    kinds = {**DEFAULT_KINDS, **(raw.get("parts") or {})}
    for slot, kind in kinds.items():
        if slot not in PARTS:
            raise ValueError(f"method={name}: parts.{slot} is not a slot; the slots are {list(SLOTS)}")
        if kind not in PARTS[slot]:
            raise ValueError(f"method={name}: parts.{slot}={kind!r}; choose one of {sorted(PARTS[slot])}")
    return kinds


def option_index() -> dict[str, list[str]]:
    """Option name -> the presets (``conf/method/``) that take it (a pinned option is not taken)."""
    load_parts()
    index: dict[str, list[str]] = {}
    for name in available_methods():
        try:
            raw = load_preset(name)
            owners = {slot: PARTS[slot][kind].Options for slot, kind in _kinds(raw, name).items()}
        except Exception:  # a preset that does not load names no option (it fails on its own when chosen)
            continue
        for option in known_options(owners, dict(raw.get("fixed") or {})):
            index.setdefault(option, []).append(name)
    return index


def _merge(preset: dict, raw: dict) -> dict:
    out = dict(preset)
    for k, v in raw.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_method(raw: dict, *, invalid_action_penalty: float, env_name: str = "", seed: int = 0) -> Method:
    """The method ``raw`` describes: ``raw["name"]`` a preset (``raw``'s other keys override it,
    ``parts`` merged slot by slot), or a dict with its own ``parts``."""
    load_parts()
    from pipeline.methods.parts.context import sync_context_parts

    sync_context_parts()
    raw = dict(raw)
    name = raw.get("name")
    if not name:
        raise ValueError("method must name a method: method=grpo (see conf/method/)")
    if (PRESET_DIR / f"{name}.yaml").exists():
        raw = _merge(load_preset(name), raw)
    elif "parts" not in raw:
        load_preset(name)  # raises: unknown method, naming the presets
    kinds = _kinds(raw, name)
    setting = Setting(method=name, prefix=raw.get("prefix") or name, invalid_action_penalty=invalid_action_penalty)
    options = {k: v for k, v in raw.items() if k not in META_KEYS}
    owners = {slot: PARTS[slot][kind].Options for slot, kind in kinds.items()}
    try:
        split = split_options(name, options, owners, dict(raw.get("fixed") or {}))
    except UnknownOption as e:  # name the presets that have it, or the nearest of theirs
        raise UnknownOption(name, e.unknown, e.known, option_index()) from None
    parts = {}
    for slot, kind in kinds.items():
        cls = PARTS[slot][kind]
        try:
            opts = cls.Options(**split[slot])
        except TypeError as e:
            raise ValueError(f"method={name}: {e}") from None
        check_types(opts, name)  # every part's options, whichever layer declares them
        if hasattr(opts, "validate"):  # the checks beyond the types, where a part has any
            opts.validate(name)
        parts[slot] = cls(opts, setting)
    return Method(name, parts, setting, env_name=env_name, seed=seed)


def describe_method(raw: dict, *, env_name: str = "") -> str:
    """``raw`` (as ``build_method`` takes it) in words: every part, its options (those the preset,
    its pins or overrides set marked) and the formula it applies (``pipeline.methods.describe``)."""
    from pipeline.methods.describe import describe

    method = build_method(raw, invalid_action_penalty=0.0, env_name=env_name)
    merged = _merge(load_preset(method.name), dict(raw)) if (PRESET_DIR / f"{method.name}.yaml").exists() else raw
    given = {k for k in merged if k not in META_KEYS} | set(merged.get("fixed") or {})
    return describe(method, given)


__all__ = [
    "Method",
    "describe_method",
    "UnknownOption",
    "available_methods",
    "build_method",
    "did_you_mean",
    "load_preset",
    "option_index",
]
