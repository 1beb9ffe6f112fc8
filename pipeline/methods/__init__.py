"""The method registry: ``method=<name>`` names a preset, ``conf/method/<name>.yaml``.

A preset names one part per slot (``parts:``, see ``pipeline.methods.parts``), its option values
(flat keys, each owned by one of its parts), optionally options it pins (``fixed:``) and the
prefix of its metrics (``prefix:``, default its name). ``build_method`` composes the parts into a
``Method``; a method dict that carries its own ``parts`` needs no preset file (the first phase
of a two-phase method is built that way). Adding a combination is adding a YAML.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import CONF_DIR
from pipeline.methods.method import Method
from pipeline.methods.options import check_types, split_options
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
    kinds = {**DEFAULT_KINDS, **(raw.get("parts") or {})}
    for slot, kind in kinds.items():
        if slot not in PARTS:
            raise ValueError(f"method={name}: parts.{slot} is not a slot; the slots are {list(SLOTS)}")
        if kind not in PARTS[slot]:
            raise ValueError(f"method={name}: parts.{slot}={kind!r}; choose one of {sorted(PARTS[slot])}")
    setting = Setting(method=name, prefix=raw.get("prefix") or name, invalid_action_penalty=invalid_action_penalty)
    options = {k: v for k, v in raw.items() if k not in META_KEYS}
    owners = {slot: PARTS[slot][kind].Options for slot, kind in kinds.items()}
    split = split_options(name, options, owners, dict(raw.get("fixed") or {}))
    parts = {}
    for slot, kind in kinds.items():
        cls = PARTS[slot][kind]
        try:
            opts = cls.Options(**split[slot])
        except TypeError as e:
            raise ValueError(f"method={name}: {e}") from None
        check_types(opts, name)  # every part's options, whichever layer declares them
        opts.validate(name)
        parts[slot] = cls(opts, setting)
    return Method(name, parts, setting, env_name=env_name, seed=seed)


__all__ = ["Method", "available_methods", "build_method", "load_preset"]
