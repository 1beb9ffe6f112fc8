"""Token ids of privileged teacher prompts (pipeline/context/prompts.py)."""

from __future__ import annotations

import copy

import pytest

from pipeline.context.prompts import TeacherPrompts
from pipeline.core.types import Message, TurnRecord
from pipeline.models import load_tokenizer


def turn(messages: list[Message], tok) -> TurnRecord:
    ids = tok.apply_chat_template(
        [m.as_dict() for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return TurnRecord(
        prompt_ids=list(ids),
        response_ids=[5, 6],
        behaviour_logprobs=[-1.0, -1.0],
        policy_version=0,
        turn_index=0,
        messages=messages,
    )


@pytest.fixture(scope="module")
def tok(tiny_bytes_model_dir):
    return load_tokenizer(tiny_bytes_model_dir)


def test_teacher_prompts_keep_no_state_from_one_step_to_the_next(tok):
    prompts = TeacherPrompts(tok, max_total_tokens=4096)
    row = turn([Message(role="user", content="Reply with the word river.")], tok)
    before = copy.deepcopy({k: v for k, v in vars(prompts).items() if k != "tok"})
    for _ in range(50):  # estimator=full builds these on the driver every step, no scorer pops them
        prompts.feedback_ids(row, ["Put the word in an answer block."])
        prompts.skills_ids(row, "- be brief", "raw_prefix")
    assert {k: v for k, v in vars(prompts).items() if k != "tok"} == before


# ----- the teacher prompt is the student prompt plus the privileged text, token by token -------------
SKILLS = "### General principles\n- **Heat**: use the microwave first."
FEEDBACK = ["Run the tests before you finish.", "Keep the reply short."]


def _insertion(student: list[int], teacher: list[int]) -> list[int]:
    """The tokens inserted into ``student`` to make ``teacher``; fails unless it is one insertion."""
    p = 0
    while p < min(len(student), len(teacher)) and student[p] == teacher[p]:
        p += 1
    q = 0
    while q < len(student) - p and student[-1 - q] == teacher[-1 - q]:
        q += 1
    assert p + q == len(student), "the teacher prompt changes the student's tokens, not only adds to them"
    return teacher[p : len(teacher) - q]


CONVERSATIONS = {
    "user only": [Message(role="user", content="\nYou are in a kitchen. Your task is to: heat a mug.\n")],
    "with system": [
        Message(role="system", content="You are an agent."),
        Message(role="user", content="Task: heat a mug.\nObs: kitchen"),
    ],
    "tool turns": [
        Message(role="system", content="Tools: view_file, finish"),
        Message(role="user", content="Fix the bug in app.py."),
        Message(role="assistant", content='<tool_call>{"name": "view_file"}</tool_call>'),
        Message(role="tool", content="def f(x):\n    return x + 1\n"),
    ],
}


@pytest.fixture(scope="module", params=["smollm2", "qwen2"])
def template_tok(request, tiny_model_dir):
    """SmolLM2's own tokenizer and template, and the same vocabulary with a Qwen2.5-style template."""
    return load_tokenizer(tiny_model_dir, None if request.param == "smollm2" else "qwen2")


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("placement", ["raw_prefix", "system", "user", "user_front"])
def test_skills_teacher_prompt_is_the_student_prompt_plus_the_skills_only(template_tok, conversation, placement):
    prompts = TeacherPrompts(template_tok, max_total_tokens=8192)
    assert prompts.default_system  # both templates add a default system prompt when there is none
    row = turn(CONVERSATIONS[conversation], template_tok)
    teacher = prompts.skills_ids(row, SKILLS, placement)
    added = template_tok.decode(_insertion(row.prompt_ids, teacher))
    assert SKILLS in added
    assert added.replace(SKILLS, "").replace("[Privileged Skill Information]", "").strip() == ""


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_feedback_teacher_prompt_is_the_student_prompt_plus_the_feedback_only(template_tok, conversation):
    prompts = TeacherPrompts(template_tok, max_total_tokens=8192)
    row = turn(CONVERSATIONS[conversation], template_tok)
    added = template_tok.decode(_insertion(row.prompt_ids, prompts.feedback_ids(row, FEEDBACK)))
    assert all(f in added for f in FEEDBACK) and "[Feedback on your previous attempt]" in added
    assert prompts.plain_ids(row) == row.prompt_ids


def test_system_placement_keeps_the_templates_default_system_prompt(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    prompts = TeacherPrompts(tok, max_total_tokens=8192)
    assert prompts.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    row = turn(CONVERSATIONS["user only"], tok)
    text = tok.decode(prompts.skills_ids(row, SKILLS, "system"))
    assert text.count(prompts.default_system) == 1 and text.index(prompts.default_system) < text.index(SKILLS)
