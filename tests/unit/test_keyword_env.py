"""The keyword env: rubric, determinism, malformed replies."""

import pytest

from envs import make_env


def env_for(seed=3, **opts):
    env = make_env("keyword", opts, split="train")
    env.reset(seed)
    return env


def test_perfect_reply_passes_every_criterion_and_wins():
    env = env_for()
    word = env._word
    r = env.step(f"<answer>{word}</answer>")
    assert r.won and r.reward == 1.0 and r.done
    assert all(c.passed for c in r.criteria)


def test_partial_credit_is_the_fraction_of_criteria_passed():
    env = env_for()
    r = env.step(f"Here is my long answer about many things: <answer>{env._word}</answer>")
    assert not r.won and r.reward == pytest.approx(2 / 3)
    failed = [c for c in r.criteria if not c.passed]
    assert [c.criterion for c in failed] == ["brevity"]
    assert failed[0].failing_turn == 0 and "short" in failed[0].feedback


@pytest.mark.parametrize("reply", ["", "<answer>", "<answer>a</answer><answer>b</answer>", "\x00" * 5000])
def test_malformed_replies_score_without_raising(reply):
    r = env_for().step(reply)
    assert 0.0 <= r.reward < 1.0 and r.done


def test_same_seed_same_task():
    a, b = env_for(11), env_for(11)
    assert a.task_text == b.task_text
    assert len({env_for(s)._word for s in range(40)}) == 40  # seeds spread over the word list
    # the split test (as sets, thousands of tasks) is tests/unit/test_split_keyword.py


def test_unknown_option_is_a_clear_error():
    with pytest.raises(ValueError, match="nope"):
        make_env("keyword", {"nope": 1}, split="train")


def test_the_expert_wins_every_task_and_the_format_can_be_hidden():
    env = make_env("keyword", {"hint_format": False}, split="train")
    for seed in range(20):
        obs = env.reset(seed)
        assert "<answer>" not in obs.text  # only a clone of the expert knows the block
        assert env.step(env.expert_response()).won


def test_the_privileged_hint_is_the_graded_answer_block():
    env = make_env("keyword", {"hint_format": False}, split="train")
    assert env.privileged_hint() is None  # before reset
    env.reset(5)
    hint = env.privileged_hint()
    block = hint.split(": ", 1)[1]
    assert block == env.expert_response() and env.step(block).won
