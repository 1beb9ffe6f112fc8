"""Skill banks: schema validation, the four retrieval modes, rendering, the shipped banks."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.context.skill_bank import (
    Mistake,
    RetrievalMode,
    Skill,
    SkillBank,
    SkillBankError,
    SkillRetriever,
    available_banks,
    load_bank,
    render,
)

ALFWORLD_TYPES = [
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
]


def _skill(sid: str) -> dict:
    return {"skill_id": sid, "title": f"T{sid}", "principle": f"P{sid}", "when_to_apply": f"W{sid}"}


def _mistake(mid: str) -> dict:
    return {"mistake_id": mid, "description": f"D{mid}", "why_it_happens": f"Y{mid}", "how_to_avoid": f"H{mid}"}


def small_bank_dict() -> dict:
    return {
        "general_skills": [_skill(f"g{i}") for i in range(4)],
        "task_specific_skills": {"heat": [_skill("h0"), _skill("h1")], "plain": [_skill("p0")]},
        "common_mistakes": [_mistake(f"m{i}") for i in range(3)],
        "metadata": {
            "task_keywords": {"heat": ["hot", "heat"]},
            "default_task_type": "plain",
            "task_marker": "Your task is to:",
        },
    }


@pytest.fixture
def bank() -> SkillBank:
    return SkillBank.from_dict(small_bank_dict())


# ----- schema ------------------------------------------------------------------------------------
def test_missing_top_level_key_is_named():
    data = small_bank_dict()
    del data["common_mistakes"]
    with pytest.raises(SkillBankError, match="common_mistakes"):
        SkillBank.from_dict(data)


def test_missing_skill_field_names_the_field_and_the_entry():
    data = small_bank_dict()
    del data["task_specific_skills"]["heat"][1]["principle"]
    with pytest.raises(SkillBankError, match=r"task_specific_skills\['heat'\]\[1\].*principle"):
        SkillBank.from_dict(data)


def test_missing_mistake_field_and_empty_strings_are_rejected():
    data = small_bank_dict()
    del data["common_mistakes"][0]["how_to_avoid"]
    with pytest.raises(SkillBankError, match="how_to_avoid"):
        SkillBank.from_dict(data)
    data = small_bank_dict()
    data["general_skills"][0]["title"] = "  "
    with pytest.raises(SkillBankError, match="non-empty"):
        SkillBank.from_dict(data)


def test_duplicate_ids_are_rejected_across_sections():
    data = small_bank_dict()
    data["task_specific_skills"]["plain"].append(_skill("g1"))
    with pytest.raises(SkillBankError, match=r"duplicate skill_id.*g1"):
        SkillBank.from_dict(data)
    data = small_bank_dict()
    data["common_mistakes"].append(_mistake("m0"))
    with pytest.raises(SkillBankError, match=r"duplicate mistake_id.*m0"):
        SkillBank.from_dict(data)


def test_unknown_task_types_are_rejected_in_rules_arguments_and_env_checks(bank):
    data = small_bank_dict()
    data["metadata"]["task_keywords"]["freeze"] = ["cold"]
    with pytest.raises(SkillBankError, match="unknown task type 'freeze'"):
        SkillBank.from_dict(data)
    data = small_bank_dict()
    data["metadata"]["default_task_type"] = "nope"
    with pytest.raises(SkillBankError, match="unknown task type 'nope'"):
        SkillBank.from_dict(data)
    with pytest.raises(SkillBankError, match="unknown task type 'cool'"):
        SkillRetriever(bank, "keyword").retrieve("anything", task_type="cool")
    with pytest.raises(SkillBankError, match=r"not produced by the env: \['plain'\]"):
        bank.check_task_types(["heat"])


def test_bad_mode_and_bad_bank_name_explain_the_choices(bank, tmp_path):
    with pytest.raises(ValueError, match="full"):
        SkillRetriever(bank, "embedding")
    with pytest.raises(FileNotFoundError, match="alfworld"):
        load_bank("no_such_bank")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SkillBankError, match="not valid JSON"):
        load_bank(bad)


def test_a_bank_loads_from_a_path(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(small_bank_dict()))
    assert load_bank(path).task_types == ("heat", "plain")
    assert load_bank(str(path)).skill("h1").task_type == "heat"


# ----- keyword mapping ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "goal, task_type",
    [
        ("put a hot apple in fridge", "pick_heat_then_place_in_recep"),
        ("heat some egg and put it in garbagecan", "pick_heat_then_place_in_recep"),
        ("put a cool mug in microwave", "pick_cool_then_place_in_recep"),
        ("cool some bread and put it in countertop", "pick_cool_then_place_in_recep"),
        ("put a clean lettuce in diningtable", "pick_clean_then_place_in_recep"),
        ("clean some fork and put it in drawer", "pick_clean_then_place_in_recep"),
        ("look at bowl under the desklamp", "look_at_obj_in_light"),
        ("examine the alarmclock with the desklamp", "look_at_obj_in_light"),
        ("put two cellphone in sofa", "pick_two_obj_and_place"),
        ("find two pillow and put them in armchair", "pick_two_obj_and_place"),
        ("put some potato on diningtable", "pick_and_place_simple"),
        ("put a spraybottle in toilet", "pick_and_place_simple"),
    ],
)
def test_alfworld_goals_map_to_their_task_type(goal, task_type):
    bank = load_bank("alfworld")
    assert bank.classify(goal) == task_type
    # In the full initial observation the room list (with its desklamp) must not decide the type.
    obs = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
        "you, you see a desk 1, a desklamp 1, a fridge 1 and a microwave 1.\n\nYour task is to: " + goal + "."
    )
    assert bank.classify(obs) == task_type


def test_keyword_mode_returns_type_skills_top_k_general_and_first_mistakes(bank):
    got = SkillRetriever(bank, "keyword", top_k=2, n_mistakes=2).retrieve("Your task is to: put a hot egg in bin")
    assert got.task_type == "heat"
    assert got.skill_ids == ("g0", "g1", "h0", "h1")
    assert got.mistake_ids == ("m0", "m1")


def test_keyword_mode_falls_back_to_default_and_explicit_type_overrides(bank):
    retriever = SkillRetriever(bank, "keyword", top_k=1, n_mistakes=0)
    assert retriever.retrieve("put a mug on shelf").skill_ids == ("g0", "p0")
    assert retriever.retrieve("put a hot mug on shelf", task_type="plain").skill_ids == ("g0", "p0")


def test_full_mode_returns_everything(bank):
    got = SkillRetriever(bank, "full", top_k=1, n_mistakes=1).retrieve("x")
    assert got.skill_ids == ("g0", "g1", "g2", "g3", "h0", "h1", "p0")
    assert got.mistake_ids == ("m0", "m1", "m2")


# ----- random ------------------------------------------------------------------------------------
def test_random_mode_is_seeded_same_seed_same_skills_different_seeds_differ(bank):
    retriever = SkillRetriever(bank, "random", top_k=3, seed=11)
    first = retriever.retrieve("put a hot egg in bin", seed=5)
    assert len(first.skill_ids) == 3
    assert SkillRetriever(bank, "random", top_k=3, seed=11).retrieve("other text", seed=5).skill_ids == first.skill_ids
    draws = {retriever.retrieve("put a hot egg in bin", seed=s).skill_ids for s in range(20)}
    assert len(draws) > 5
    other = SkillRetriever(bank, "random", top_k=3, seed=12)
    assert [other.retrieve("x", seed=s).skill_ids for s in range(20)] != [
        retriever.retrieve("x", seed=s).skill_ids for s in range(20)
    ]


# ----- UCB ---------------------------------------------------------------------------------------
def test_ucb_offers_unvisited_skills_first(bank):
    # heat pool = g0..g3 + h0, h1 (6 skills); top_k 2 -> three rounds cover the pool once.
    retriever = SkillRetriever(bank, "ucb", top_k=2, n_mistakes=0)
    seen = []
    for _ in range(3):
        got = retriever.retrieve("", task_type="heat")
        assert not set(got.skill_ids) & set(seen)
        seen += got.skill_ids
        retriever.update(got.task_type, got.skill_ids, reward=0.0)
    assert sorted(seen) == ["g0", "g1", "g2", "g3", "h0", "h1"]


def test_ucb_exploits_the_skill_with_higher_reward(bank):
    retriever = SkillRetriever(bank, "ucb", top_k=1, n_mistakes=0, ucb_c=0.5)
    for _ in range(6):  # one visit each
        got = retriever.retrieve("", task_type="heat")
        retriever.update("heat", got.skill_ids, reward=10.0 if got.skill_ids == ("h1",) else 0.0)
    picks = []
    for _ in range(10):
        got = retriever.retrieve("", task_type="heat")
        picks.append(got.skill_ids[0])
        retriever.update("heat", got.skill_ids, reward=10.0 if got.skill_ids == ("h1",) else 0.0)
    assert picks.count("h1") >= 8
    scores = retriever.ucb_scores("heat")
    assert max(scores, key=scores.get) == "h1"


def test_ucb_statistics_are_per_task_type(bank):
    retriever = SkillRetriever(bank, "ucb", top_k=1)
    assert retriever.retrieve("", task_type="heat").skill_ids == ("h0",)  # the type's own skills first
    retriever.update("heat", ["h0"], reward=1.0)
    assert retriever.retrieve("", task_type="heat").skill_ids == ("h1",)
    assert retriever.retrieve("", task_type="plain").skill_ids == ("p0",)


def test_ucb_update_rejects_unknown_ids_and_types(bank):
    retriever = SkillRetriever(bank, "ucb")
    with pytest.raises(KeyError, match="zz"):
        retriever.update("heat", ["zz"], reward=1.0)
    with pytest.raises(SkillBankError):
        retriever.update("freeze", ["g0"], reward=1.0)


def test_ucb_state_dict_round_trips_through_json(bank):
    retriever = SkillRetriever(bank, "ucb", top_k=2, ucb_c=0.3)
    for r in (1.0, 0.0, 3.0):
        got = retriever.retrieve("", task_type="heat")
        retriever.update(got.task_type, got.skill_ids, r)
    state = json.loads(json.dumps(retriever.state_dict()))
    restored = SkillRetriever(bank, "ucb", top_k=2, ucb_c=0.3)
    restored.load_state_dict(state)
    assert restored.state_dict() == retriever.state_dict()
    assert restored.ucb_scores("heat") == retriever.ucb_scores("heat")
    assert restored.retrieve("", task_type="heat") == retriever.retrieve("", task_type="heat")
    before = copy.deepcopy(state)
    restored.update("heat", ["g0"], 1.0)
    assert state == before  # loading copied the state


# ----- render ------------------------------------------------------------------------------------
def test_render_is_deterministic_markdown_with_sections(bank):
    skills = [bank.skill("h0"), bank.skill("g0"), bank.skill("p0")]
    text = render(skills, bank.mistakes[:1])
    assert text == render(list(skills), list(bank.mistakes[:1]))
    assert text == (
        "### General principles\n- **Tg0**: Pg0 (when: Wg0)\n\n"
        "### Skills for heat\n- **Th0**: Ph0 (when: Wh0)\n\n"
        "### Skills for plain\n- **Tp0**: Pp0 (when: Wp0)\n\n"
        "### Common mistakes\n- **Dm0**: Hm0"
    )
    assert render([], []) == ""
    assert render([Skill("a", "A", "p", "w")], [Mistake("m", "d", "y", "h")]).startswith("### General principles")


def test_retrieved_text_is_the_render_of_the_retrieved_ids(bank):
    got = SkillRetriever(bank, "keyword", top_k=1, n_mistakes=1).retrieve("put a hot egg in bin")
    assert got.text == render([bank.skill(s) for s in got.skill_ids], bank.mistakes[:1])


# ----- shipped banks -----------------------------------------------------------------------------
def test_shipped_banks_load_and_validate():
    assert {"alfworld", "keyword"} <= set(available_banks())
    alf = load_bank("alfworld")
    alf.check_task_types(ALFWORLD_TYPES)
    assert 8 <= len(alf.general) <= 12 and 7 <= len(alf.mistakes) <= 11
    assert all(5 <= len(alf.skills_of(t)) <= 6 for t in ALFWORLD_TYPES)
    kw = load_bank("keyword")
    kw.check_task_types(["keyword"])
    assert kw.classify('Reply with the word "river" and nothing else.') == "keyword"
    for mode in RetrievalMode:
        for b in (alf, kw):
            assert SkillRetriever(b, mode).retrieve("Your task is to: put a hot apple in fridge.", seed=1).text


def test_alfworld_bank_names_the_right_appliances():
    bank = load_bank("alfworld")
    text = lambda t: " ".join(s.principle for s in bank.skills_of(t))  # noqa: E731
    assert "heat {obj} with microwave 1" in text("pick_heat_then_place_in_recep")
    assert "cool {obj} with fridge 1" in text("pick_cool_then_place_in_recep")
    assert "clean {obj} with sinkbasin 1" in text("pick_clean_then_place_in_recep")
    assert "use desklamp 1" in text("look_at_obj_in_light")
