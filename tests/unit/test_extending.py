"""The worked examples of docs/extending.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from method_groups import PENALTY, episode, group, turn

from pipeline.core.types import CriterionResult

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def block(marker: str) -> str:
    for _lang, body in re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), re.DOTALL):
        if body.startswith(f"# extending: {marker}\n"):
            return body
    raise AssertionError(f"docs/extending.md has no block marked {marker!r}")


def failed_groups():
    crit = [CriterionResult(criterion="format", passed=False, failing_turn=1, feedback="Use one answer block.")]
    return [
        group(
            "a",
            [
                episode([turn(0, [-1.0, -1.0], lpt=[-0.5, -0.7]), turn(1, [-0.4], lpt=[-0.2])], criteria=crit),
                episode(
                    [turn(0, [-0.3], lpt=[-0.1])], won=True, criteria=[CriterionResult(criterion="format", passed=True)]
                ),
            ],
        )
    ]


def test_the_yaml_method_builds_and_distils_failed_turns_with_the_gate():
    from pipeline.methods import build_method

    raw = yaml.safe_load(block("method-yaml"))
    method = build_method(raw, invalid_action_penalty=PENALTY)
    spec = method.teacher_spec()
    assert (spec.follows_policy, spec.context, spec.rows) == (True, "feedback", "failed_turns")
    credit = method.credit(failed_groups(), 0)
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef, term.gate_beta) == ("gf", "sampled_surrogate", 0.05, 5.0)
    assert credit.distill.distill_mask == [[0, 0], [1], [0]]  # only the failing turn
    with pytest.raises(ValueError, match="has no option"):
        build_method({**raw, "skill_mode": "ucb"}, invalid_action_penalty=PENALTY)


def test_the_new_schedule_part_fades_the_coefficient():
    from pipeline.methods import build_method

    namespace: dict = {}
    exec(block("new-part"), namespace)  # registers schedule=linear_fade
    raw = {**yaml.safe_load(block("method-yaml")), "fade_steps": 4}
    raw["parts"] = {**raw["parts"], "schedule": "linear_fade"}
    method = build_method(raw, invalid_action_penalty=PENALTY)
    coefs = []
    for step in range(5):
        terms = method.credit(failed_groups(), step).aux_terms
        coefs.append(terms[0].coef if terms else 0.0)
    assert coefs == pytest.approx([0.05, 0.0375, 0.025, 0.0125, 0.0])
    assert not method.teacher_active(4)


def test_the_new_env_plays_an_episode_and_never_raises_on_bad_text():
    from envs import make_env

    exec(block("new-env"), {})
    env = make_env("count_to", {}, "train")
    obs = env.reset(3)
    assert "Reply with the number" in obs.text
    assert env.step("\x00 not a number").won is False
    env = make_env("count_to", {}, "train")
    env.reset(3)
    assert env.step(f"It is {env.n}.").won is True


def test_the_new_context_kind_gives_teacher_prompts_and_a_student_view(tiny_bytes_model_dir):
    from pipeline.context.prompts import TeacherPrompts
    from pipeline.methods import build_method
    from pipeline.models import load_tokenizer

    exec(block("new-context"), {})
    raw = {
        "name": "sdar_task_type",
        "parts": {"teacher": "self", "context": "task_type", "signal": "aux"},
        "estimator": "sampled_surrogate",
        "weight": "gate",
    }
    method = build_method(raw, invalid_action_penalty=PENALTY)
    tok = load_tokenizer(tiny_bytes_model_dir)
    groups = failed_groups()
    ep, row = groups[0].episodes[0], groups[0].episodes[0].turns[0]
    ep.task_type = "counting"
    row.prompt_ids = list(
        tok.apply_chat_template(
            [m.as_dict() for m in row.messages], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    ids = method.teacher_spec().provider.teacher_prompt(TeacherPrompts(tok, 4096), ep, row)
    assert "This is a counting task." in tok.decode(ids)
    assert method.privileged_view() is not None
