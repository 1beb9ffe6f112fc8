"""Named chat templates render every role the envs use, and a base model without a template is
refused at launch, before Ray starts, with one line saying how to set one."""

import json
import shutil

import pytest

from pipeline.core.chat_templates import TEMPLATES, resolve_chat_template, stop_token_ids
from pipeline.core.config import ConfigError
from pipeline.models import has_chat_template, load_tokenizer
from pipeline.tools.cli import compose

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
    {"role": "tool", "content": "1 failed"},
    {"role": "tool", "content": "done"},
]

EXPECTED = {
    "chatml": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFix the bug.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n<|im_start|>tool\n1 failed<|im_end|>\n"
        "<|im_start|>tool\ndone<|im_end|>\n<|im_start|>assistant\n"
    ),
    "qwen2": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFix the bug.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
        "1 failed\n</tool_response>\n<tool_response>\ndone\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ),
    "llama3": (
        "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nFix the bug.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "<tool_call>{}</tool_call><|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n1 failed<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\ndone<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n"
    ),
    "gemma": (
        "<s><start_of_turn>user\nBe brief.\n\nFix the bug.<end_of_turn>\n<start_of_turn>model\n"
        "<tool_call>{}</tool_call><end_of_turn>\n<start_of_turn>user\n1 failed<end_of_turn>\n"
        "<start_of_turn>user\ndone<end_of_turn>\n<start_of_turn>model\n"
    ),
}


def _render(name: str, messages, add_generation_prompt=True) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    out, _ = render_jinja_template(
        conversations=[messages],
        chat_template=TEMPLATES[name],
        add_generation_prompt=add_generation_prompt,
        bos_token="<s>",
    )
    return out[0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_named_template_renders_every_role_and_ends_where_the_reply_starts(name):
    assert _render(name, CONVERSATION) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_prompt_is_a_prefix_of_the_next_turns_prompt(name):
    # Multi-turn rows: the prompt of turn t plus its reply starts the prompt of turn t+1.
    first = _render(name, CONVERSATION[:2])
    later = _render(name, CONVERSATION[:2] + [CONVERSATION[2]], add_generation_prompt=False)
    assert later.startswith(first)


def test_only_qwen2_adds_a_default_system_prompt():
    user_only = [{"role": "user", "content": "hi"}]
    assert "You are Qwen" in _render("qwen2", user_only)
    for name in ("chatml", "llama3", "gemma"):
        assert _render(name, user_only).count("hi") == 1 and "You are" not in _render(name, user_only)


def test_a_template_file_is_read_and_an_unknown_name_is_refused(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="chatml"):
        resolve_chat_template("nope")
    with pytest.raises(ConfigError, match=r"model\.chat_template"):
        compose(["model.chat_template=nope"])


def _base_model_copy(src, dst):
    """A copy of a model directory whose tokenizer has no chat template (a base model)."""
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    return dst


def test_a_base_model_without_template_is_refused_before_ray_starts(tiny_bytes_model_dir, tmp_path):
    import ray

    from pipeline.orchestration.run import run_training

    base = _base_model_copy(tiny_bytes_model_dir, tmp_path / "base")
    assert not has_chat_template(load_tokenizer(base))
    cfg = compose(["model=hf_path", f"model.path={base}", "env=keyword", "trainer.total_steps=1"])
    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match=r"model\.chat_template.*chatml\|llama3\|qwen2\|gemma") as info:
        run_training(cfg, tmp_path / "run")
    assert "\n" not in str(info.value)
    assert ray.is_initialized() == was_up  # failed before Ray was started


def test_model_chat_template_gives_a_base_model_one_with_its_stop_token(tiny_bytes_model_dir, tmp_path):
    from pipeline.orchestration.launch import check_model

    base = _base_model_copy(tiny_bytes_model_dir, tmp_path / "base")
    cfg = compose(["model=hf_path", f"model.path={base}", "model.chat_template=chatml", "env=keyword"])
    tok = check_model(cfg, str(base))
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert ids == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") in stop_token_ids(tok)
