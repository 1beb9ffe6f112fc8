"""Named chat templates for tokenizers that have none (base models) or whose template is unwanted.

``model.chat_template`` names one of ``TEMPLATES`` or a Jinja file. Each template renders the
roles the envs use (``system``, ``user``, ``assistant``, ``tool``) and, with
``add_generation_prompt``, ends exactly where the assistant's reply starts, as the rollout and
the teacher prompts require. None injects a default system prompt except ``qwen2``, which
reproduces Qwen2.5's (its models were tuned with it).

- ``chatml``: ``<|im_start|>role\\n...<|im_end|>\\n``; a tool message is its own ``tool`` turn.
- ``qwen2``: ChatML with Qwen2.5's default system prompt; consecutive tool messages share one
  user turn as ``<tool_response>...</tool_response>`` blocks (Qwen's tool format).
- ``llama3``: ``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>`` after the BOS
  token; the tool role is Llama 3's ``ipython``.
- ``gemma``: ``<start_of_turn>user|model\\n...<end_of_turn>\\n`` after the BOS token; Gemma has no
  system role, so a system message is prepended to the first user turn (as Gemma's own template
  does), and tool messages are user turns.

A base model's vocabulary may lack a template's markers (then they are plain text and the model
must learn them); ``stop_token_ids`` adds a template's end-of-turn marker to the stop ids only
where it is a single token of the vocabulary.
"""

from __future__ import annotations

from pathlib import Path

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_QWEN2 = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

_GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set first_prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

TEMPLATES: dict[str, str] = {"chatml": _CHATML, "qwen2": _QWEN2, "llama3": _LLAMA3, "gemma": _GEMMA}

# End-of-turn markers of the templates above (and of the models that use them natively).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")


def resolve_chat_template(value: str) -> str:
    """The Jinja source of a named template or of a template file."""
    if value in TEMPLATES:
        return TEMPLATES[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"model.chat_template={value!r}: name one of {sorted(TEMPLATES)} or a Jinja file")
    return path.read_text()


def stop_token_ids(tokenizer) -> list[int]:
    """EOS ids plus the chat template's end-of-turn marker where it is one token of the vocab."""
    ids: set[int] = set()
    eos = tokenizer.eos_token_id
    if eos is not None:
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    for marker in END_OF_TURN:
        if marker in template and marker in vocab:
            ids.add(int(vocab[marker]))
    return sorted(int(i) for i in ids)


__all__ = ["END_OF_TURN", "TEMPLATES", "resolve_chat_template", "stop_token_ids"]
