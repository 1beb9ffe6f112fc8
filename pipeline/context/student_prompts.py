"""The student's prompts: what the rollout worker samples from, and what a warm start clones on.

One builder serves both, so an expert row of the warm start (``pipeline/warm_start``) is exactly
the prompt RL will sample from at that state: same chat template, same history window, same
budget (``rollout.max_prompt_tokens``, oldest history dropped first, the task never).

``env.prompt_format`` says how a turn's prompt follows the last one:
- ``template`` (the papers'): each turn re-renders one user message holding the task and the last
  ``env.history_length`` (observation, action) pairs (verl-agent's template), so an episode's
  history is in several rows, each time at other positions.
- ``chat``: the conversation grows by turns. The first prompt is the template without history;
  each later one is the previous prompt's ids, the reply's ids as sampled, and the template's
  markup around the new observation as a user message (token in, token out: nothing sampled is
  tokenised again). A turn's row then continues the last one, and the learner's shared forward
  (``pipeline/algorithm/shared_prefix``) carries each token of an episode once. A conversation
  longer than ``rollout.max_prompt_tokens`` ends its episode (``ContextFull``; nothing is cut).
"""

from __future__ import annotations

from pipeline.context.placement import PrivilegedPrompt
from pipeline.context.prompts import default_system_prompt
from pipeline.core.chat_templates import stop_token_ids
from pipeline.core.schema import PROMPT_FORMATS
from pipeline.core.types import Message


class PromptTooLong(ValueError):
    pass


class ContextFull(ValueError):
    """The conversation (``env.prompt_format=chat``) no longer fits ``rollout.max_prompt_tokens``."""


class StudentPrompts:
    def __init__(self, tokenizer, *, max_prompt_tokens: int, history_length: int, prompt_format: str = "template"):
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"env.prompt_format={prompt_format!r}: choose one of {list(PROMPT_FORMATS)}")
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.history_length = history_length
        self.chat = prompt_format == "chat"
        self.default_system = default_system_prompt(tokenizer)  # where a system placement goes
        self.stops = stop_token_ids(tokenizer)
        self.end_of_turn = self._end_of_turn() if self.chat else None

    def encode(self, prompt: PrivilegedPrompt) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            [m.as_dict() for m in prompt.messages], add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        prefix = list(self.tokenizer(prompt.prefix, add_special_tokens=False)["input_ids"]) if prompt.prefix else []
        return prefix + list(out)

    def build(self, env, history: list[tuple[str, str]], obs, turn: int = 0, view=None, last=None):
        """Messages and ids of the next prompt (with the view's privileged context, if any),
        dropping the oldest history until it fits; returns (messages, ids, truncated, context ids).
        ``last``: the episode's previous row (its ``TurnRecord``), which a chat prompt continues;
        the view's context is then already in it (placed at the first turn)."""
        if self.chat and last is not None:
            return (*self.follow(last, env.chat_observation(obs)), False, [])
        if self.chat:
            history = []  # a conversation starts with the task alone
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

    def follow(self, last, observation: str) -> tuple[list[Message], list[int]]:
        """The chat prompt after ``last``: its prompt and reply ids, the reply closed with the
        template's end-of-turn token where it does not end with it (the engine stopped it at
        ``rollout.max_new_tokens``, or the model ended with EOS alone), then the markup and ids of
        the observation as the next user message."""
        said = Message(role="assistant", content=last.response_text)
        messages = [*last.messages, said, Message(role="user", content=observation)]
        reply = list(last.response_ids)
        if not reply or reply[-1] != self.end_of_turn:  # cut by max_new_tokens, or ended by EOS alone
            reply.append(self.end_of_turn)
        ids = [*last.prompt_ids, *reply, *self._next_turn(last.messages, said, observation)]
        if len(ids) > self.max_prompt_tokens:
            raise ContextFull(
                f"the conversation is {len(ids)} tokens > rollout.max_prompt_tokens={self.max_prompt_tokens}"
            )
        return messages, ids

    def _end_of_turn(self) -> int:
        """The stop token the chat template closes an assistant message with."""
        tok = self.tokenizer
        closed = tok.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], tokenize=False
        )
        tail = closed[closed.rfind("y") :]
        found = [(tail.find(tok.convert_ids_to_tokens(i)), i) for i in self.stops]
        found = [(at, i) for at, i in found if at >= 0]
        if not found:
            raise ValueError(
                "env.prompt_format=chat: the chat template closes an assistant message with none of the "
                f"stop tokens {self.stops}; use env.prompt_format=template"
            )
        return min(found)[1]

    def _next_turn(self, messages: list[Message], said: Message, observation: str) -> list[int]:
        """The ids the chat template puts between a reply's end-of-turn token and the next reply:
        what it renders after that token, the user message, the generation prompt."""
        tok, convo = self.tokenizer, [m.as_dict() for m in messages] + [said.as_dict()]
        closed = tok.apply_chat_template(convo, tokenize=False)
        after = tok.apply_chat_template(
            convo + [{"role": "user", "content": observation}], add_generation_prompt=True, tokenize=False
        )
        stop = tok.convert_ids_to_tokens(self.end_of_turn)
        end = closed.rfind(stop)
        if not after.startswith(closed) or end < 0:
            raise ValueError(
                "env.prompt_format=chat needs a chat template that appends each turn; this one "
                "rewrites earlier turns: use env.prompt_format=template"
            )
        return list(tok(closed[end + len(stop) :] + after[len(closed) :], add_special_tokens=False)["input_ids"])

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
