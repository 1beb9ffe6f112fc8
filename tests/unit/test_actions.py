"""The shared <think>/<action> parser."""

from __future__ import annotations

import pytest

from envs.actions import normalize_action, parse_think_action, thinking_prefix_chars


def test_well_formed_response_yields_normalised_action_and_thinking():
    p = parse_think_action("<think> The mug is in\nthe fridge. </think>\n<action>  Open   Fridge 1\n</action>")
    assert p.valid_format and p.reason == ""
    assert p.action == "open fridge 1"
    assert p.thinking == "The mug is in\nthe fridge."


def test_text_around_the_blocks_is_tolerated():
    p = parse_think_action("Sure!\n<think>x</think> then <action>look</action> done")
    assert p.valid_format and p.action == "look"


def test_tags_match_case_insensitively():
    p = parse_think_action("<THINK>x</Think><Action>Go To Desk 1</ACTION>")
    assert p.valid_format and p.action == "go to desk 1"


@pytest.mark.parametrize(
    "text",
    [
        "go to desk 1",  # no tags at all
        "<think>x</think>",  # no action block
        "<action>look</action>",  # no think block
        "<think>x<action>look</action>",  # think never closed
        "<think>x</think><action>look",  # action never closed
        "<think>x</think>look</action>",  # closing without opening
    ],
)
def test_missing_tags_make_the_format_invalid(text):
    p = parse_think_action(text)
    assert not p.valid_format and p.reason


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><think>b</think><action>look</action>",
        "<think>a</think><action>look</action><action>inventory</action>",
        "<think>a <think>b</think></think><action>look</action>",
    ],
)
def test_duplicated_or_nested_tags_make_the_format_invalid(text):
    assert not parse_think_action(text).valid_format


def test_duplicated_action_leaves_no_action():
    assert parse_think_action("<think>a</think><action>look</action><action>help</action>").action == ""


@pytest.mark.parametrize("text", ["<think>x</think><action></action>", "<think>x</think><action> \n\t</action>"])
def test_empty_action_is_invalid(text):
    p = parse_think_action(text)
    assert not p.valid_format and p.action == "" and "empty" in p.reason


def test_action_before_think_is_invalid():
    p = parse_think_action("<action>look</action><think>x</think>")
    assert not p.valid_format and p.action == "look"


def test_missing_think_keeps_the_action_for_logging():
    p = parse_think_action("<action>look</action>")
    assert not p.valid_format and p.action == "look"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00\x01<<>>",
        "<think",
        "</think></action><action><think>",
        "a" * 100_000,
        "<thinking>x</thinking><action>look</action>",
    ],
)
def test_garbage_never_raises_and_is_invalid(text):
    assert not parse_think_action(text).valid_format


def test_non_string_input_is_invalid():
    assert not parse_think_action(None).valid_format  # type: ignore[arg-type]


def test_unicode_is_kept_and_lowercased():
    p = parse_think_action("<think>café → fridge ☕</think><action>Take Café 1 from Ümlaut 2</action>")
    assert p.valid_format and p.action == "take café 1 from ümlaut 2"
    assert p.thinking == "café → fridge ☕"


def test_cjk_is_rejected_only_when_asked():
    text = "<think>杯子在冰箱里</think><action>open fridge 1</action>"
    assert parse_think_action(text).valid_format
    p = parse_think_action(text, forbid_cjk=True)
    assert not p.valid_format and p.action == "open fridge 1"


def test_normalize_action_collapses_whitespace():
    assert normalize_action("  Go\tTO \n desk 1 ") == "go to desk 1"


def test_thinking_prefix_covers_the_closing_tag():
    text = "<think>abc</think><action>look</action>"
    n = thinking_prefix_chars(text)
    assert text[:n] == "<think>abc</think>"
    assert thinking_prefix_chars("no thinking <action>look</action>") == 0
    assert thinking_prefix_chars("opened in the prompt</think><action>x</action>") == len(
        "opened in the prompt</think>"
    )
