"""Privileged teacher prompts: skills placement and feedback insertion (pure, no model).

Skills placements (``Placement``), given a turn row's student ``messages`` and the skills text:

* ``raw_prefix``: SDAR's released form. The raw text ``"[Privileged Skill Information]\\n{skills}\\n\\n"``
  goes *before* the chat-templated prompt, so the messages stay as they are and the caller
  prepends ``PrivilegedPrompt.prefix`` to the rendered prompt (``PrivilegedPrompt.render``).
* ``system``: the block ``"[Privileged Skill Information]\\n{skills}"`` is appended (after a blank
  line) to the system message: the prompt's own, or, when it has none, the one the chat template
  would insert by default (``default_system``: SmolLM2's and Qwen's templates add their default
  system prompt only when the conversation has none, so a bare new system message would also
  drop that prompt); only a template without a default gets a system message of its own.
* ``user``: the same block appended (after a blank line) to the first user message: a pure
  insertion into the student's token ids (the message's end is followed by the template's
  end-of-turn token, a token boundary), so the teacher sees the student's prompt plus the
  privileged text and nothing else.
* ``user_front``: the block and a blank line *before* the first user message's text, SkillRL's /
  RetireOPD's ``"[Privileged Skill Information]\n{skills}\n\n{obs}"`` (METHODS.md), the default of
  the students that carry skills themselves (``skill_grpo``, RetireOPD's teacher). A student's
  own prompt must read as the prompts it was cloned on: the Search-QA clone given the skills at
  the *end* of its message (``user``), right before its reply, answered at once without
  searching (valid success 0 of 64; docs/results/skill_placement), and searched as usual with
  them in front or as a raw prefix.

Targeted guidance: ``insert_feedback`` appends ``"[Feedback on your previous attempt]"`` and the
failed criteria's feedback strings (one per line, in the given order) to the end of the last user
message, i.e. immediately before the assistant's response in the rendered prompt; when the prompt
ends with a tool result (``role="tool"``, code_edit's ``tool_role=tool``) they form a user turn of
their own after it.

SDAR's code truncates the teacher prompt from the left, which can silently cut the skills. Here
the privileged text is added to the student's prompt as it was sampled (already fitted to
``rollout.max_prompt_tokens`` by dropping old history) and never cut. These functions never mutate
their input messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.core.types import Message, Placement

SKILL_HEADER = "[Privileged Skill Information]"
FEEDBACK_HEADER = "[Feedback on your previous attempt]"


@dataclass(frozen=True, slots=True)
class PrivilegedPrompt:
    """The teacher's prompt: chat messages plus raw text to place before their chat-templated form."""

    messages: list[Message]
    prefix: str = ""  # non-empty only for ``raw_prefix``

    def render(self, apply_chat_template: Callable[[list[Message]], str]) -> str:
        return self.prefix + apply_chat_template(self.messages)


def _copy(messages: Sequence[Message]) -> list[Message]:
    return [Message(role=m.role, content=m.content) for m in messages]


def raw_prefix(privileged: str) -> str:
    return f"{SKILL_HEADER}\n{privileged}\n\n"


def in_system(messages: Sequence[Message], privileged: str, default_system: str | None = None) -> list[Message]:
    out, block = _copy(messages), f"{SKILL_HEADER}\n{privileged}"
    if out and out[0].role == "system":
        out[0].content = f"{out[0].content}\n\n{block}" if out[0].content else block
    elif default_system:
        out.insert(0, Message(role="system", content=f"{default_system}\n\n{block}"))
    else:
        out.insert(0, Message(role="system", content=block))
    return out


def in_first_user(messages: Sequence[Message], privileged: str, *, front: bool = False) -> list[Message]:
    out, block = _copy(messages), f"{SKILL_HEADER}\n{privileged}"
    for m in out:
        if m.role == "user":
            m.content = f"{block}\n\n{m.content}" if front else f"{m.content}\n\n{block}"
            return out
    raise ValueError("placements 'user' and 'user_front' need a user message in the prompt; the messages have none")


def with_privileged(
    messages: Sequence[Message], privileged: str, placement: str, default_system: str | None = None
) -> PrivilegedPrompt:
    """The teacher prompt for one turn row. Empty ``privileged`` text leaves the prompt unchanged.
    ``default_system``: the chat template's default system prompt, if it has one
    (``pipeline.context.prompts.default_system_prompt``)."""
    if placement not in set(Placement):
        raise ValueError(f"skills placement {placement!r}: choose one of {[p.value for p in Placement]}")
    placement = Placement(placement)
    if not privileged:
        return PrivilegedPrompt(messages=_copy(messages))
    if placement is Placement.RAW_PREFIX:
        return PrivilegedPrompt(messages=_copy(messages), prefix=raw_prefix(privileged))
    if placement is Placement.SYSTEM:
        return PrivilegedPrompt(messages=in_system(messages, privileged, default_system))
    return PrivilegedPrompt(messages=in_first_user(messages, privileged, front=placement is Placement.USER_FRONT))


def insert_feedback(
    messages: Sequence[Message], feedback: Sequence[str], header: str = FEEDBACK_HEADER
) -> list[Message]:
    """Put the feedback right before the assistant's response: at the end of the last message when
    it is the user's, or, after a tool result (``role="tool"``), as a user turn of its own (a
    judge's remark is not part of the tool's output)."""
    lines = [f.strip() for f in feedback if f.strip()]
    out = _copy(messages)
    if not lines:
        return out
    block = f"{header}\n" + "\n".join(lines)
    last = out[-1].role if out else "nothing"
    if last == "user":
        out[-1].content = f"{out[-1].content}\n\n{block}"
    elif last == "tool":
        out.append(Message(role="user", content=block))
    else:
        raise ValueError(
            f"feedback goes right before the response, after a user or tool message, but the prompt ends with {last}"
        )
    return out
