"""A method in words: its parts, their options and the formula each part applies.

``scripts/train.py --describe method=sdar [overrides]`` prints it, so that reading a method no
longer means opening a preset and the modules of its six or eight parts. The formula of a part is
the bullet its module's docstring gives its kind (``- ``kind``: ...``), or the module's first
paragraph for a module of one part; options set by the preset, a pin or an override are marked.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import textwrap

from pipeline.methods.method import Method
from pipeline.methods.parts import SLOTS


def formula(part) -> str:
    """The text the part's module gives its kind."""
    doc = sys.modules[type(part).__module__].__doc__ or ""
    if part.slot == "context" and part.kind != "none":  # a provider's part: the provider's module says it
        from pipeline.context.providers import PROVIDERS

        doc = sys.modules[PROVIDERS[part.kind].__module__].__doc__ or doc
    bullet = re.search(rf"^- ``{re.escape(part.kind)}``[^:]*: (.*?)(?=^- ``|^\S|\Z)", doc, re.M | re.S)
    text = bullet.group(1) if bullet else doc.split("\n\n")[0]
    return " ".join(text.split())


def describe(method: Method, given: dict) -> str:
    """``given``: the options the preset, its pins or the command line set (marked ``*``)."""
    lines = [f"method={method.name} (metrics under {method.setting.prefix}/)"]
    for slot in SLOTS:
        part = method.parts[slot]
        lines.append(f"\n{slot}: {part.kind}")
        lines += textwrap.wrap(formula(part), 96, initial_indent="    ", subsequent_indent="    ")
        if dataclasses.is_dataclass(part.opts):
            for f in dataclasses.fields(part.opts):
                mark = "*" if f.name in given else " "
                lines.append(f"  {mark} {f.name} = {getattr(part.opts, f.name)!r}")
    lines.append("\n(* set by the preset or the command line; the rest are the parts' defaults)")
    return "\n".join(lines)
