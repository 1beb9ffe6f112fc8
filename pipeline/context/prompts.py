"""Token ids of privileged prompts, built from a turn row's own chat messages.

The teacher sees exactly the student's prompt of that turn plus the privileged context (skills at
the method's placement, or the failed criteria's feedback just before the response); the response
ids are appended unchanged, so the teacher scores the very tokens that were sampled.

Truncation: the student's prompt was already fitted to ``rollout.max_prompt_tokens`` by dropping
the oldest history (counted in ``rollout/prompt_truncated_frac``). The privileged text is added on
top and never cut; a privileged prompt longer than ``max_total_tokens`` (the model's context)
raises with what to change rather than silently truncating the skills (SDAR's released code
left-truncates and can cut them).
"""

from __future__ import annotations

from pipeline.context.placement import insert_feedback, with_privileged
from pipeline.core.types import Message, TurnRecord


class PromptTooLongError(ValueError):
    pass


def _render(tok, messages: list[Message]) -> str:
    return tok.apply_chat_template([m.as_dict() for m in messages], add_generation_prompt=True, tokenize=False)


def _diff(a: str, b: str) -> tuple[int, int]:
    """Lengths of the common prefix and of the common suffix (not overlapping it) of a and b."""
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    q = 0
    while q < n - p and a[-1 - q] == b[-1 - q]:
        q += 1
    return p, q


def default_system_prompt(tok) -> str | None:
    """The system prompt the chat template inserts when a conversation has none (SmolLM2's, Qwen's),
    or None: found by rendering a user message alone and after a marker system message."""
    marker = "\x1fsystem-marker\x1f"
    alone = _render(tok, [Message(role="user", content="x")])
    marked = _render(tok, [Message(role="system", content=marker), Message(role="user", content="x")])
    p, q = _diff(alone, marked)
    if marked[p : len(marked) - q] != marker:
        return None  # the marker brought template markup with it: no default system block
    return alone[p : len(alone) - q] or None


class TeacherPrompts:
    """Token ids of privileged prompts: the row's own prompt ids with the privileged text inserted.

    The teacher's prompt is rendered from the row's messages with the privileged text at its
    placement (``pipeline.context.placement``) and compared with the student's rendered prompt. Where
    the difference is a pure insertion at a token boundary of the student's ids (every placement
    here puts it right before a template token, or in front of the whole prompt), the teacher ids
    are ``student_ids[:k] + ids(inserted text) + student_ids[k:]``: exactly the prompt that was
    sampled plus the privileged text, token by token. Otherwise (a template without a system
    block of its own, say) the teacher prompt is tokenised whole.
    """

    def __init__(self, tokenizer, max_total_tokens: int):
        self.tok = tokenizer
        self.max_total_tokens = max_total_tokens
        self.default_system = default_system_prompt(tokenizer)

    def _check(self, ids: list[int], row: TurnRecord) -> list[int]:
        if len(ids) + row.n_response > self.max_total_tokens:
            raise PromptTooLongError(
                f"privileged prompt of {len(ids)} tokens + {row.n_response} response tokens exceeds "
                f"{self.max_total_tokens}: lower rollout.max_prompt_tokens or method.skill_top_k"
            )
        return ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _insert(self, row: TurnRecord, teacher_text: str) -> list[int]:
        student_text = _render(self.tok, row.messages)
        p, q = _diff(student_text, teacher_text)
        enc = self.tok(student_text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets, own = list(enc["input_ids"]), enc["offset_mapping"], list(row.prompt_ids)
        starts = [s for s, _ in offsets]
        if p + q == len(student_text) and (p == len(student_text) or p in starts):
            k = starts.index(p) if p < len(student_text) else len(ids)
            if all(e <= p for _, e in offsets[:k]):
                inserted = self._encode(teacher_text[p : len(teacher_text) - q])
                # The student's ids agree with the text's own before the insertion (a template
                # prompt, the first messages of a chat one) or after it (the last message of a
                # chat prompt, whose earlier replies are ids as sampled): they go in unchanged.
                if own[:k] == ids[:k]:
                    return self._check(own[:k] + inserted + own[k:], row)
                after = len(ids) - k
                if len(own) >= after and own[len(own) - after :] == ids[k:]:
                    return self._check(own[: len(own) - after] + inserted + own[len(own) - after :], row)
        return self._check(self._encode(teacher_text), row)

    def plain_ids(self, row: TurnRecord) -> list[int]:
        return self._check(list(row.prompt_ids), row)

    def skills_ids(self, row: TurnRecord, skills_text: str, placement: str) -> list[int]:
        prompt = with_privileged(row.messages, skills_text, placement, self.default_system)
        if prompt.prefix and prompt.messages == row.messages:  # raw_prefix: in front of everything
            return self._check(self._encode(prompt.prefix) + list(row.prompt_ids), row)
        return self._insert(row, prompt.render(lambda m: _render(self.tok, m)))

    def feedback_ids(self, row: TurnRecord, feedback: list[str]) -> list[int]:
        if not feedback:
            return self.plain_ids(row)
        return self._insert(row, _render(self.tok, insert_feedback(row.messages, feedback)))
