"""The student's prompts: what the rollout worker samples from, and what a warm start clones on.

One builder serves both, so an expert row of the warm start (``pipeline/warm_start``) is exactly
the prompt RL will sample from at that state: same chat template, same history window, same
budget (``rollout.max_prompt_tokens``, oldest history dropped first, the task never).
"""

from __future__ import annotations

from pipeline.context.placement import PrivilegedPrompt
from pipeline.context.prompts import default_system_prompt
from pipeline.core.chat_templates import stop_token_ids
from pipeline.core.types import Message


class PromptTooLong(ValueError):
    pass


class StudentPrompts:
    def __init__(self, tokenizer, *, max_prompt_tokens: int, history_length: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.history_length = history_length
        self.default_system = default_system_prompt(tokenizer)  # where a system placement goes

    def encode(self, prompt: PrivilegedPrompt) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            [m.as_dict() for m in prompt.messages], add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        prefix = list(self.tokenizer(prompt.prefix, add_special_tokens=False)["input_ids"]) if prompt.prefix else []
        return prefix + list(out)

    def build(self, env, history: list[tuple[str, str]], obs, turn: int = 0, view=None):
        """Messages and ids of the next prompt (with the view's privileged context, if any),
        dropping the oldest history until it fits; returns (messages, ids, truncated, context ids)."""
        full = min(self.history_length, len(history))
        for h in range(full, -1, -1):
            prompt, offered = PrivilegedPrompt(messages=env.build_messages(history, obs, h)), []
            if view is not None:
                prompt, offered = view.apply(prompt.messages, env, turn, self.default_system)
            ids = self.encode(prompt)
            if len(ids) <= self.max_prompt_tokens:
                return prompt.messages, ids, h < full, offered
        raise PromptTooLong(
            f"the prompt without history is {len(ids)} tokens > rollout.max_prompt_tokens="
            f"{self.max_prompt_tokens}; raise rollout.max_prompt_tokens"
        )

    def response_ids(self, messages: list[Message], text: str) -> list[int]:
        """The ids a model emits for ``text`` as its reply to ``messages``, ending with the chat
        template's end-of-turn token: what the engine returns when the model stops by itself.

        Rendered through the template (the reply's tokens depend on it: Qwen3 wraps thinking,
        Gemma ends turns with its own marker), then cut after the first stop token."""
        tok = self.tokenizer
        convo = [m.as_dict() for m in messages]
        prompt = tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        whole = tok.apply_chat_template(convo + [{"role": "assistant", "content": text}], tokenize=False)
        stops = stop_token_ids(tok)
        if whole.startswith(prompt):
            ids = list(tok(whole[len(prompt) :], add_special_tokens=False)["input_ids"])
            for n, i in enumerate(ids):
                if i in stops:
                    return ids[: n + 1]
        # A template that rewrites earlier turns once a reply follows: the reply's own tokens
        # and the first stop token.
        return list(tok(text, add_special_tokens=False)["input_ids"]) + stops[:1]
