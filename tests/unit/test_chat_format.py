"""``env.prompt_format=chat``: an episode is one growing conversation, token in, token out.

Real Search-QA episodes (its scripted expert through the real prompt builder, the SmolLM2
tokenizer of the tiny model): each turn's prompt is the last turn's ids, its reply's ids and the
template's markup around the new observation; sampled ids are never tokenised again; the teacher's
privileged prompts keep them; the learner's shared forward carries each token of an episode once.
The rollout worker's chat episodes: tests/integration/test_rollout_worker.py."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.algorithm.shared_prefix import unique_tokens
from pipeline.context.prompts import TeacherPrompts
from pipeline.context.student_prompts import ContextFull, StudentPrompts
from pipeline.core.types import Message
from pipeline.models import load_tokenizer
from pipeline.orchestration.warm_start import expert_rows
from pipeline.tools.cli import compose


def _prompts(tok, prompt_format="chat", max_prompt_tokens=None):
    cfg = compose(["model=tiny", "env=search_qa", f"env.prompt_format={prompt_format}"])
    budget = max_prompt_tokens or cfg.rollout.max_prompt_tokens
    return cfg, StudentPrompts(
        tok, max_prompt_tokens=budget, history_length=cfg.env.history_length, prompt_format=prompt_format
    )


def _episodes(rows):
    out = []
    for r in rows:
        if r.turn_index == 0:
            out.append([])
        out[-1].append(r)
    return out


def _encode(tok, messages):
    ids = tok.apply_chat_template([m.as_dict() for m in messages], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def test_a_chat_episode_is_one_sequence_that_grows_by_turns(tok):
    cfg, prompts = _prompts(tok)
    episodes = [e for e in _episodes(expert_rows(cfg.env, prompts, tasks=4).rows) if len(e) > 1]
    assert episodes  # the expert searches before it answers
    for rows in episodes:
        assert [m.role for m in rows[-1].messages] == ["user"] + ["assistant", "user"] * (len(rows) - 1)
        for prev, row in zip(rows, rows[1:]):
            said = prev.prompt_ids + prev.response_ids
            assert row.prompt_ids[: len(said)] == said  # the last row, continued
            assert row.messages[: len(prev.messages)] == prev.messages
            assert row.messages[len(prev.messages)].content == prev.response_text
        # the expert's replies are the tokeniser's own: the ids are the conversation's encoding
        assert all(r.prompt_ids == _encode(tok, r.messages) for r in rows)
        seqs = [r.prompt_ids + r.response_ids for r in rows]
        assert unique_tokens(seqs) == len(seqs[-1])  # the learner carries each token once
    # the template re-renders the history: the same episodes carry more
    _, template = _prompts(tok, "template")
    cfg_t = compose(["model=tiny", "env=search_qa"])
    plain = [e for e in _episodes(expert_rows(cfg_t.env, template, tasks=4).rows) if len(e) > 1]
    assert sum(unique_tokens([r.prompt_ids + r.response_ids for r in e]) for e in plain) > sum(
        len(e[-1].prompt_ids) + len(e[-1].response_ids) for e in episodes
    )


def _first_turn(tok, prompts):
    cfg = compose(["model=tiny", "env=search_qa"])
    return next(e for e in _episodes(expert_rows(cfg.env, prompts, tasks=4).rows) if len(e) > 1)[0]


def test_sampled_ids_are_kept_and_the_teachers_prompts_keep_them_too(tok):
    _, prompts = _prompts(tok)
    first = _first_turn(tok, prompts)
    # the reply as a model may sample it: the same text in other pieces than the tokeniser's
    pieces = [i for ch in first.response_text for i in tok(ch, add_special_tokens=False)["input_ids"]]
    sampled = dataclasses.replace(first, response_ids=pieces + prompts.stops[:1])
    assert sampled.response_ids != first.response_ids and tok.decode(pieces) == first.response_text
    messages, ids = prompts.follow(sampled, "<information>Doc 1: somewhere</information>")
    assert ids[: len(first.prompt_ids) + len(pieces) + 1] == first.prompt_ids + sampled.response_ids
    assert ids != _encode(tok, messages)  # not the text's own tokens: the ones sampled
    row = dataclasses.replace(first, prompt_ids=ids, messages=messages, response_ids=[5, 6])
    teacher = TeacherPrompts(tok, max_total_tokens=1 << 20)
    for name, got in (
        ("feedback", teacher.feedback_ids(row, ["The answer is not a city."])),
        ("skills in the system prompt", teacher.skills_ids(row, "- search first", "system")),
        ("skills in the first user message", teacher.skills_ids(row, "- search first", "user")),
    ):
        # the student's ids, whole, with the privileged text inserted at one place
        k = next(k for k in range(len(ids) + 1) if got[:k] == ids[:k] and got[k + len(got) - len(ids) :] == ids[k:])
        inserted = tok.decode(got[k : k + len(got) - len(ids)])
        assert ("not a city" in inserted) if name == "feedback" else ("search first" in inserted), name


def test_a_reply_cut_by_max_new_tokens_is_closed_before_the_next_turn(tok):
    _, prompts = _prompts(tok)
    first = _first_turn(tok, prompts)
    cut = dataclasses.replace(
        first, response_ids=first.response_ids[:3], response_text=tok.decode(first.response_ids[:3])
    )
    _, ids = prompts.follow(cut, "<information>x</information>")
    n = len(first.prompt_ids)
    assert ids[n : n + 4] == first.response_ids[:3] + [prompts.end_of_turn]


def test_a_conversation_past_the_budget_ends_instead_of_being_cut(tok):
    _, prompts = _prompts(tok)
    first = _first_turn(tok, prompts)
    _, short = _prompts(tok, max_prompt_tokens=len(first.prompt_ids) + first.n_response + 3)
    with pytest.raises(ContextFull, match=r"rollout\.max_prompt_tokens="):
        short.follow(first, "<information>" + "word " * 50 + "</information>")


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_way_out(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    # earlier replies dropped from the rendering once a later message follows (as thinking
    # templates drop earlier thoughts): a continued prompt would not be the conversation
    tok.chat_template = (
        "{% for m in messages %}{% if loop.last or m['role'] != 'assistant' %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    prompts = StudentPrompts(tok, max_prompt_tokens=4096, history_length=2, prompt_format="chat")
    user = Message(role="user", content="q")
    first = dataclasses.make_dataclass("Row", ["messages", "prompt_ids", "response_ids", "response_text"])(
        [user], _encode(tok, [user]), tok("a<|im_end|>", add_special_tokens=False)["input_ids"], "a"
    )
    with pytest.raises(ValueError, match="rewrites earlier turns: use env.prompt_format=template"):
        prompts.follow(first, "obs")
