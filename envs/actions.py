"""Parse the verl-agent response format ``<think>...</think><action>...</action>``.

Shared by every env that uses this format. A response is well formed when it holds exactly one
``<think>`` block followed by exactly one non-empty ``<action>`` block; text outside the blocks
(a leading newline, trailing chatter) is tolerated, as in verl-agent. Tags match
case-insensitively.

The action is normalised the way verl-agent's ALFWorld projection does it (strip, lower-case),
and in addition runs of whitespace collapse to one space, so ``"Go  to\\ndesk 1"`` becomes
``"go to desk 1"``; ALFWorld's admissible commands never hold double spaces, so this only
rescues formatting noise. verl-agent also rejects any response containing CJK characters
(Qwen models drift into Chinese); that check is opt-in here (``forbid_cjk=True``).

Deviations from verl-agent's projection, which takes the *first* ``<action>`` and ``</action>``
it finds: duplicated tags, an action block before the think block, and an empty action all make
the format invalid here.

Example::

    >>> p = parse_think_action("<think>the mug is in the fridge</think><action>Open Fridge 1</action>")
    >>> p.action, p.thinking, p.valid_format
    ('open fridge 1', 'the mug is in the fridge', True)
    >>> parse_think_action("open fridge 1").valid_format
    False
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG = re.compile(r"<(/?)(think|action)>", re.IGNORECASE)
_CJK = re.compile(r"[\u4e00-\u9fff]")
_WS = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class ParsedAction:
    action: str  # normalised action; "" when no single action block could be found
    thinking: str  # the stripped text inside <think>...</think>; "" if absent
    valid_format: bool
    reason: str = ""  # why the format is invalid ("" when valid)


def normalize_action(text: str) -> str:
    """Lower-case, strip, and collapse whitespace runs to single spaces."""
    return _WS.sub(" ", text).strip().lower()


def _blocks(text: str) -> tuple[dict[str, list[tuple[int, int]]], str]:
    """Map tag name -> [(content_start, content_end)] of well-nested blocks, or an error."""
    spans: dict[str, list[tuple[int, int]]] = {"think": [], "action": []}
    open_tag: tuple[str, int] | None = None
    for m in _TAG.finditer(text):
        closing, name = m.group(1) == "/", m.group(2).lower()
        if not closing:
            if open_tag is not None:
                return spans, f"<{name}> opened inside <{open_tag[0]}>"
            open_tag = (name, m.end())
        else:
            if open_tag is None or open_tag[0] != name:
                return spans, f"</{name}> without a matching <{name}>"
            spans[name].append((open_tag[1], m.start()))
            open_tag = None
    if open_tag is not None:
        return spans, f"<{open_tag[0]}> is never closed"
    return spans, ""


def parse_think_action(text: str, *, forbid_cjk: bool = False) -> ParsedAction:
    """Split a raw model response into (action, thinking, valid_format); never raises."""
    if not isinstance(text, str):
        return ParsedAction("", "", False, "response is not a string")
    spans, error = _blocks(text)
    thinks, actions = spans["think"], spans["action"]
    action = normalize_action(text[slice(*actions[0])]) if len(actions) == 1 and not error else ""
    thinking = text[slice(*thinks[0])].strip() if len(thinks) == 1 and not error else ""
    if not error:
        if len(thinks) != 1 or len(actions) != 1:
            error = f"expected one <think> and one <action> block, got {len(thinks)} and {len(actions)}"
        elif thinks[0][0] > actions[0][0]:
            error = "<action> comes before <think>"
        elif not action:
            error = "empty <action>"
        elif forbid_cjk and _CJK.search(text):
            error = "response contains CJK characters"
    return ParsedAction(action, thinking, not error, error)


def thinking_prefix_chars(text: str) -> int:
    """Characters of ``text`` up to and including the first ``</think>`` (0 if none).

    Response tokens whose character span ends at or before this offset are thinking tokens
    (``TurnRecord.thinking_len``). A ``</think>`` with no ``<think>`` before it still counts:
    chat templates such as Qwen3's open the think block in the prompt.
    """
    if not isinstance(text, str):
        return 0
    m = re.search(r"</think>", text, re.IGNORECASE)
    return m.end() if m else 0
