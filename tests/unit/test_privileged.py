"""Privileged prompts: the three skills placements and feedback insertion."""

from __future__ import annotations

import pytest

from pipeline.context.placement import (
    FEEDBACK_HEADER,
    SKILL_HEADER,
    Placement,
    PrivilegedPrompt,
    insert_feedback,
    with_privileged,
)
from pipeline.core.types import Message

SKILLS = "### General principles\n- **Heat**: use the microwave (when: hot goals)"


def chat(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=r, content=c) for r, c in pairs]


def student() -> list[Message]:
    return chat(("system", "You are an agent."), ("user", "Task: put a hot apple in fridge.\nObs: kitchen"))


def fake_template(messages: list[Message]) -> str:
    return "".join(f"<{m.role}>{m.content}</{m.role}>" for m in messages) + "<assistant>"


# ----- placements --------------------------------------------------------------------------------
def test_raw_prefix_leaves_messages_and_returns_the_sdar_prefix():
    msgs = student()
    got = with_privileged(msgs, SKILLS, "raw_prefix")
    assert got.prefix == f"[Privileged Skill Information]\n{SKILLS}\n\n"
    assert [m.as_dict() for m in got.messages] == [m.as_dict() for m in msgs]
    assert got.render(fake_template) == got.prefix + fake_template(msgs)


def test_system_placement_appends_to_an_existing_system_message():
    got = with_privileged(student(), SKILLS, Placement.SYSTEM)
    assert got.prefix == ""
    assert got.messages[0].content == f"You are an agent.\n\n{SKILL_HEADER}\n{SKILLS}"
    assert got.messages[1].content == student()[1].content


def test_system_placement_inserts_a_system_message_when_there_is_none():
    got = with_privileged(chat(("user", "obs")), SKILLS, "system")
    assert [m.role for m in got.messages] == ["system", "user"]
    assert got.messages[0].content == f"{SKILL_HEADER}\n{SKILLS}"


def test_system_placement_extends_the_templates_default_system_prompt_when_there_is_none():
    got = with_privileged(chat(("user", "obs")), SKILLS, "system", default_system="You are SmolLM.")
    assert got.messages[0].content == f"You are SmolLM.\n\n{SKILL_HEADER}\n{SKILLS}"


def test_user_placement_appends_to_the_first_user_message():
    msgs = chat(("system", "s"), ("user", "first obs"), ("assistant", "go to fridge 1"), ("user", "second obs"))
    got = with_privileged(msgs, SKILLS, "user")
    assert got.messages[1].content == f"first obs\n\n[Privileged Skill Information]\n{SKILLS}"
    assert got.messages[3].content == "second obs"
    with pytest.raises(ValueError, match="user message"):
        with_privileged(chat(("system", "s")), SKILLS, "user")


def test_user_front_placement_puts_the_skills_before_the_first_user_message():
    # METHODS.md's RetireOPD form: "[Privileged Skill Information]\n{skills}\n\n{obs}"
    msgs = chat(("system", "s"), ("user", "first obs"), ("assistant", "go to fridge 1"), ("user", "second obs"))
    got = with_privileged(msgs, SKILLS, "user_front")
    assert got.messages[1].content == f"[Privileged Skill Information]\n{SKILLS}\n\nfirst obs"
    assert got.messages[3].content == "second obs" and got.prefix == ""
    with pytest.raises(ValueError, match="user message"):
        with_privileged(chat(("system", "s")), SKILLS, "user_front")


def test_placements_never_mutate_the_student_messages_and_empty_text_is_a_no_op():
    msgs = student()
    before = [m.as_dict() for m in msgs]
    for placement in Placement:
        with_privileged(msgs, SKILLS, placement)
        assert with_privileged(msgs, "", placement) == PrivilegedPrompt(messages=msgs)
    assert [m.as_dict() for m in msgs] == before
    with pytest.raises(ValueError, match="raw_prefix"):
        with_privileged(msgs, SKILLS, "prefix")


# ----- feedback ----------------------------------------------------------------------------------
def test_feedback_lands_immediately_before_the_response_in_the_last_user_message():
    msgs = chat(("system", "s"), ("user", "task"), ("assistant", "a1"), ("user", "obs 2"))
    got = insert_feedback(msgs, ["Use one <answer> block.", "", "Be brief."])
    assert got[:3] == msgs[:3]
    assert got[-1].content == f"obs 2\n\n{FEEDBACK_HEADER}\nUse one <answer> block.\nBe brief."
    rendered = fake_template(got)
    assert rendered.endswith("Be brief.</user><assistant>")  # nothing between feedback and response
    assert msgs[-1].content == "obs 2"
    assert insert_feedback(msgs, []) == msgs
    with pytest.raises(ValueError, match="ends with assistant"):
        insert_feedback(msgs[:3], ["x"])


def test_feedback_after_a_tool_result_is_a_user_turn_right_before_the_response():
    msgs = chat(("system", "tools"), ("user", "task"), ("assistant", "<tool_call>{}</tool_call>"), ("tool", "1 failed"))
    got = insert_feedback(msgs, ["Run the tests before you finish."])
    assert got[:4] == msgs[:4]
    assert got[4].role == "user" and got[4].content == f"{FEEDBACK_HEADER}\nRun the tests before you finish."
    assert fake_template(got).endswith("Run the tests before you finish.</user><assistant>")
