"""Model output that is no action at all is an invalid action in every env, never a crash: empty,
ten times the token budget, undecodable bytes (replacement characters, lone surrogates), only
special tokens, tags without content, nested and unclosed tags."""

from __future__ import annotations

import pytest

from envs import make_env
from pipeline.models import load_tokenizer, resolve_model

OPTIONS = {
    "alfworld": {"max_receptacles": 6, "max_objects": 6, "n_tasks": 4, "max_turns": 50},
    "keyword": {},
    "webshop": {"max_turns": 50},
    "search_qa": {"max_turns": 50},
    "code_edit": {"max_turns": 50},
}


@pytest.fixture(scope="module")
def nasty():
    tok = load_tokenizer(resolve_model("smollm2_135m"))
    specials = "".join(tok.all_special_tokens) * 3
    long = "<think>" + "go to shelf 1 " * 2000 + "</think><action>" + "x" * 5000 + "</action>"
    return {
        "empty": "",
        "whitespace": " \n\t ",
        "special tokens": specials,
        "ten times the budget": long,
        "replacement chars": "\ufffd" * 50 + "<action>\ufffd</action>",
        "lone surrogates": "<think>\udcff\udc80</think><action>go to \ud800</action>",
        "nul bytes": "<action>\x00\x00</action>",
        "empty tags": "<think></think><action></action>",
        "nested": "<action><action>look</action></action>",
        "unclosed": "<think>hmm<action>look",
        "tool call garbage": '<tool_call>{"name": ' + "[" * 500 + "</tool_call>",
        "search garbage": "<search></search><answer>",
    }


@pytest.mark.parametrize("env_name", sorted(OPTIONS))
def test_garbage_is_an_invalid_action_and_the_episode_goes_on(env_name, nasty, tmp_path):
    options = dict(OPTIONS[env_name])
    if env_name == "alfworld":
        options["cache_dir"] = str(tmp_path)
    env = make_env(env_name, options, "train")
    try:
        obs = env.reset(0)
        for what, text in nasty.items():
            res = env.step(text)
            assert not res.action_valid or env_name == "keyword", (what, res)
            assert isinstance(res.observation.text, str), what
            if res.done:  # keyword and other one-turn endings: a fresh episode for the next input
                env.close()
                env = make_env(env_name, options, "train")
                obs = env.reset(0)
        assert obs is not None
    finally:
        env.close()
