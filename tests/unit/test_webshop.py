"""The offline WebShop: reward formula, page graph, protocol, determinism, prompt, skill bank, adapter guard."""

import itertools
import random

import pytest

from envs import make_env
from envs.webshop.catalog import (
    PRODUCT_TYPES,
    SPLITS,
    TASK_TYPES,
    Goal,
    Product,
    build_catalog,
    generate_goal,
    normalize_color,
    price_upper_for,
)
from envs.webshop.engine import SEP, SearchIndex, WebShopEngine, tokenize
from envs.webshop.reward import fuzzy_match, get_reward
from pipeline.context.skill_bank import load_bank


def act(action: str, think: str = "ok") -> str:
    return f"<think>{think}</think><action>{action}</action>"


def env_for(seed=0, split="train", **opts):
    env = make_env("webshop", opts, split=split)
    env.reset(seed)
    return env


# ----- reward formula on constructed cases ---------------------------------------------------------
def shirt(**over) -> Product:
    fields = dict(
        asin="B0TEST0001",
        title="Northway Cotton Crew Neck Men's T-Shirt",
        price=18.99,
        category="fashion",
        product_category="Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
        query="men's t-shirts",
        attributes=("cotton", "crew neck", "machine wash"),
        options={"color": ("black", "navy blue", "heather grey"), "size": ("medium", "large", "x-large")},
        description="The Northway men's t-shirt brings together cotton, crew neck and machine wash.",
        bullets=("Cotton: soft.", "Crew Neck for everyday comfort."),
    )
    fields.update(over)
    return Product(**fields)


GOAL = Goal(
    asin="B0TEST0001",
    instruction="i need a men's t-shirt that is cotton and crew neck with color: "
    "navy blue, and size: large, and price lower than 30.00 dollars",
    attributes=("cotton", "crew neck"),
    options={"color": "navy blue", "size": "large"},
    price_upper=30.0,
    query="men's t-shirts",
    product_category="Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
    name="Northway Cotton Crew Neck Men's T-Shirt",
    category="fashion",
)


def test_right_item_with_its_options_scores_one():
    r = get_reward(shirt(), GOAL, {"color": "navy blue", "size": "large"})
    assert r.total == 1.0 and r.won and r.r_type == 1.0


def test_right_item_without_the_two_options_scores_three_fifths():
    r = get_reward(shirt(), GOAL, {})
    assert r.total == pytest.approx((2 + 0 + 1) / (2 + 2 + 1)) == pytest.approx(0.6)
    assert (r.n_att, r.n_opt, r.price_ok) == (2, 0, True) and not r.won


def test_price_over_the_limit_loses_the_price_term():
    r = get_reward(shirt(price=34.5), GOAL, {"color": "navy blue", "size": "large"})
    assert r.total == pytest.approx(4 / 5) and not r.price_ok


def test_wrong_size_misses_and_sizes_match_exactly():
    r = get_reward(shirt(), GOAL, {"color": "navy blue", "size": "x-large"})
    assert r.n_opt == 1 and r.total == pytest.approx(4 / 5)


def test_colours_are_normalised_like_webshop():
    assert normalize_color("royal blue") == normalize_color("navy blue") == "blue"
    r = get_reward(
        shirt(options={"color": ("royal blue",), "size": ("large",)}), GOAL, {"color": "royal blue", "size": "large"}
    )
    assert r.n_opt == 2


def test_wrong_type_with_no_shared_title_word_scores_zero():
    lamp = shirt(
        title="Hearthly Dimmable LED Desk Lamp",
        query="led desk lamp",
        product_category="Home & Kitchen › Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps",
    )
    r = get_reward(lamp, GOAL, {"color": "navy blue", "size": "large"})
    assert r.title_score == 0.0 and r.r_type == 0.0 and r.total == 0.0


def test_unmatched_type_with_some_title_overlap_halves_the_reward():
    # Other query, one shared category level, title overlap 1/6 (in (0.1, 0.2]): r_type = 0.5.
    other = shirt(
        title="Cotton Tote Bag", query="tote bag", product_category="Clothing, Shoes & Jewelry › Women › Handbags"
    )
    r = get_reward(other, GOAL, {"color": "navy blue", "size": "large"})
    assert r.title_score == pytest.approx(1 / 6) and r.r_type == 0.5 and r.total == pytest.approx(0.5)


def test_attributes_also_match_through_product_text_and_fuzzy_attributes():
    p = shirt(attributes=("100% cotton",), description="A crew neck tee.", bullets=())
    assert get_reward(p, GOAL, {}).n_att == 2  # "cotton" fuzzy-matches "100% cotton"; "crew neck" is in the text
    assert fuzzy_match("cotton", "organic cotton") and not fuzzy_match("long lasting", "long sleeve")


def test_price_limit_follows_webshops_rule():
    rng = random.Random(0)
    uppers = {price_upper_for(23.5, rng) for _ in range(200)}
    assert uppers == {40.0, 50.0, 60.0}  # larger of two distinct draws from 30, 40, 50, 60
    assert price_upper_for(985.0, rng) is None


# ----- episodes ------------------------------------------------------------------------------------
def play(env, actions):
    results = [env.step(act(a)) for a in actions]
    return results[-1]


@pytest.mark.parametrize("split", SPLITS)
def test_scripted_expert_wins_every_task(split):
    for seed in range(40):
        env = env_for(seed, split)
        r = play(env, env.expert_actions())
        assert r.done and r.won and r.reward == 10.0 and r.info["task_score"] == 1.0, (seed, env.task_text)
        assert [c.criterion for c in r.criteria] == ["attributes", "options", "price", "type"]
        assert all(c.passed and c.failing_turn is None for c in r.criteria)


def test_random_clicker_rarely_wins():
    wins = bought = 0
    for seed in range(150):
        rng, env = random.Random(seed), env_for(seed)
        obs, r = env._obs, None
        while r is None or not r.done:
            choice = rng.choice(obs.admissible_actions)
            r = env.step(act(f"search[{env.task_text}]" if choice.startswith("search[") else choice))
            obs = r.observation
        wins += r.won
        bought += "purchased" in r.info
    assert bought > 30 and wins <= 8  # about 1.5% over 500 seeds


def test_buying_without_options_fails_only_the_options_criterion_at_the_buy_turn():
    env = env_for(0)
    assert env.goal.options, "seed 0 should have a goal with options"
    plan = [a for a in env.expert_actions() if a.removeprefix("click[").rstrip("]") not in env.goal.options.values()]
    r = play(env, plan)
    assert r.done and not r.won and r.reward == 0.0 and 0 < r.info["task_score"] < 1
    verdicts = {c.criterion: c for c in r.criteria}
    assert not verdicts["options"].passed and verdicts["options"].failing_turn == len(plan) - 1
    assert all(verdicts[c].passed for c in ("attributes", "price", "type"))
    assert "option" in verdicts["options"].feedback


def test_score_mode_pays_success_reward_times_r():
    env = env_for(0, reward_mode="score", success_reward=1.0)
    plan = [a for a in env.expert_actions() if a.removeprefix("click[").rstrip("]") not in env.goal.options.values()]
    r = play(env, plan)
    assert r.reward == pytest.approx(r.info["task_score"]) and not r.won


def test_episode_ends_after_max_turns_with_every_criterion_failed():
    env = env_for(1, max_turns=3)
    results = [env.step(act("click[nothing]")) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and all(not c.passed and c.failing_turn == 2 for c in results[-1].criteria)
    with pytest.raises(RuntimeError, match="single-use"):
        env.step(act("search[x]"))


@pytest.mark.parametrize(
    "response",
    [
        act("click[nonexistent]"),
        act("click[buy now]"),  # not on the search page
        act("search"),
        act("jump[over]"),
        act("click[]"),
        "search[shampoo]",  # no tags
        "<action>search[shampoo]</action>",  # no think block
        "<think>a</think><action>search[a]</action><action>search[b]</action>",
        "\x00garbage" * 50,
        "",
    ],
)
def test_malformed_or_unavailable_actions_are_invalid_no_ops(response):
    env = env_for(2)
    before_obs, before_state = env._obs, repr(env.engine.state)
    r = env.step(response)
    assert not r.action_valid and r.reward == 0.0 and not r.done and r.info["invalid_reason"]
    assert r.observation.text == before_obs.text and repr(env.engine.state) == before_state


def test_search_without_a_search_bar_and_stale_clicks_are_invalid():
    env = env_for(3)
    env.step(act("search[anything at all]"))
    page = env._obs.text
    for response in (act("search[other words]"), act("click[description]"), act("click[b0zzzzzzzz]")):
        r = env.step(response)
        assert not r.action_valid and r.observation.text == page


def test_cjk_responses_are_invalid_by_default_and_allowed_on_request():
    assert not env_for(0).step(act("search[shampoo]", think="我想")).action_valid
    assert env_for(0, reject_cjk=False).step(act("search[shampoo]", think="我想")).action_valid


# ----- pages ---------------------------------------------------------------------------------------
def test_every_page_starts_with_the_instruction_and_uses_sep():
    env = env_for(4)
    instruction = env.task_text
    pages = [env._obs.text]
    plan = env.expert_actions()
    for a in [
        plan[0],
        plan[-len(env.goal.options) - 2],
        "click[features]",
        "click[< prev]",
        "click[description]",
        "click[< prev]",
        "click[reviews]",
    ]:
        r = env.step(act(a))
        assert r.action_valid, (a, r.info)
        pages.append(r.observation.text)
    for page in pages:
        assert page.startswith(f"Instruction:{SEP}{instruction}{SEP}")
    assert pages[0].endswith(f"{SEP}Search")
    assert "Page 1 (Total results: " in pages[1] and "Back to Search" in pages[1]
    assert pages[2].endswith(f"Description{SEP}Features{SEP}Reviews{SEP}Buy Now")
    assert "out of 5 stars" in pages[-1]


def test_available_actions_follow_the_page():
    env = env_for(5)
    assert env.get_available_actions() == {"has_search_bar": True, "clickables": []}
    assert env._obs.admissible_actions == ["search[<your query>]"]
    env.step(act("search[dependable quality]"))
    avail = env.get_available_actions()
    assert not avail["has_search_bar"] and avail["clickables"][:2] == ["back to search", "next >"]
    assert len(avail["clickables"]) == 12 and all(c.startswith("b0") for c in avail["clickables"][2:])
    env.step(act("click[next >]"))
    assert env.get_available_actions()["clickables"][:3] == ["back to search", "< prev", "next >"]
    env.step(act(f"click[{env.get_available_actions()['clickables'][3]}]"))
    item = env.get_available_actions()["clickables"]
    assert item[:2] == ["back to search", "< prev"] and item[-4:] == ["description", "features", "reviews", "buy now"]
    env.step(act("click[back to search]"))
    assert env.get_available_actions()["has_search_bar"]


def test_options_survive_sub_pages_but_not_leaving_the_item():
    env = env_for(0)
    plan = env.expert_actions()
    for a in plan[:-1]:
        env.step(act(a))
    chosen = dict(env.engine.state.options)
    assert chosen == env.goal.options
    env.step(act("click[description]"))
    env.step(act("click[< prev]"))
    assert env.engine.state.options == chosen
    env.step(act("click[< prev]"))
    env.step(act(plan[-len(env.goal.options) - 2]))
    assert env.engine.state.options == {}


def test_search_keeps_top_50_with_ten_per_page():
    catalog = build_catalog(0, 400)
    index = SearchIndex(catalog)
    results = index.search("wireless")
    assert 10 < len(results) <= 50 and index.search("qqqq zzzz") == [] and index.search("a the") == []
    engine = WebShopEngine(catalog, index, "find me something")
    assert engine.execute("search[zzzz]") == (True, "")
    assert engine.get_available_actions()["clickables"] == ["back to search"]
    assert "Page 1 (Total results: 0)" in engine.observation()
    assert tokenize("Running Shoes, batteries and glasses") == ["running", "shoe", "battery", "glass"]


# ----- generation ----------------------------------------------------------------------------------
def test_generation_is_deterministic_by_seed():
    fresh = build_catalog.__wrapped__
    assert fresh(3, 120) == fresh(3, 120)
    assert fresh(3, 120).products != fresh(4, 120).products
    a, b = env_for(17), env_for(17)
    assert (a.task_text, a.goal.asin, a.task_id) == (b.task_text, b.goal.asin, b.task_id)
    assert env_for(17, catalog_seed=1).task_text != a.task_text
    assert len({env_for(s).task_text for s in range(30)}) > 25


def test_split_targets_are_disjoint_and_cover_every_category():
    catalog = build_catalog(0, 400)
    pools = {s: set(catalog.targets[s]) for s in SPLITS}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not pools[a] & pools[b], (a, b)
    assert sum(map(len, pools.values())) == 400
    for s in SPLITS:
        assert {catalog.by_asin[a].category for a in pools[s]} == set(TASK_TYPES)
        assert all(generate_goal(catalog, s, i).asin in pools[s] for i in range(30))


def test_catalog_text_never_contains_its_option_values_and_options_do_not_collide():
    catalog = build_catalog(0, 400)
    for p in catalog.products:
        assert p.product_category.split(" › ")[0] and len(p.product_category.split(" › ")) >= 3
        for values in p.options.values():
            assert len(values) >= 2 and all(normalize_color(v) not in p.reward_text() for v in values)
    for ptype in PRODUCT_TYPES:
        for a, b in itertools.combinations(ptype.attributes, 2):
            assert not fuzzy_match(a, b), (ptype.key, a, b)
        for name, values in ptype.options:
            if name == "size":
                continue
            for a, b in itertools.combinations(values, 2):
                na, nb = normalize_color(a), normalize_color(b)
                assert (name == "color" and na == nb) or not fuzzy_match(na, nb), (ptype.key, a, b)


def test_task_type_is_the_top_level_category():
    types = {env_for(s).task_type for s in range(60)}
    assert types == set(TASK_TYPES)


# ----- options, prompt, bank, adapter ----------------------------------------------------------
@pytest.mark.parametrize(
    "options, match",
    [
        ({"nope": 1}, "unknown webshop option"),
        ({"n_products": 10}, "n_products"),
        ({"max_turns": 0}, "max_turns"),
        ({"reward_mode": "dense"}, "reward_mode"),
        ({"success_reward": 0}, "success_reward"),
        ({"n_tasks": 0}, "n_tasks"),
        ({"reject_cjk": "yes"}, "reject_cjk"),
    ],
)
def test_bad_options_are_clear_errors(options, match):
    with pytest.raises(ValueError, match=match):
        make_env("webshop", options, split="train")


def test_unknown_split_is_a_clear_error():
    with pytest.raises(ValueError, match="valid"):
        make_env("webshop", {}, split="valid_seen")


def test_prompt_follows_verl_agents_webshop_template():
    env = env_for(6)
    first = env.build_messages([], env._obs, history_length=2)[0].content
    assert f"Your task is to: {env.task_text}.\n" in first and "Your current observation is: 'Search'." in first
    assert "[\n'search[<your query>]',\n]" in first and "<think> </think>" in first
    obs0 = env._obs
    r = env.step(act(env.expert_actions()[0]))
    later = env.build_messages([(obs0.text, r.action)], r.observation, history_length=2)[0].content
    assert "Prior to this step, you have already taken 1 step(s)." in later
    assert f"[Observation 1: ''Search'', Action 1: '{r.action}']" in later
    assert "'click[back to search]',\n'click[next >]'," in later and "You are now at step 2" in later


def test_skill_bank_covers_the_env_task_types_and_classifies_instructions():
    bank = load_bank("webshop")
    bank.check_task_types(TASK_TYPES)
    catalog = build_catalog(0, 400)
    for s in SPLITS:
        for i in range(60):
            goal = generate_goal(catalog, s, i)
            assert bank.classify(goal.instruction) == goal.category, goal.instruction


def test_real_webshop_adapter_explains_how_to_install_it():
    from envs.webshop.adapter import WebShopRealEnv  # registers "webshop_real"

    install = r"(?s)academic research only.*git clone https://github.com/princeton-nlp/WebShop"
    with pytest.raises(RuntimeError, match=install):
        make_env("webshop_real", {}, split="test")
    with pytest.raises(RuntimeError, match="web_agent_site"):
        WebShopRealEnv.validate_options({"webshop_path": "/nonexistent/WebShop"})
    with pytest.raises(ValueError, match="unknown webshop_real option"):
        make_env("webshop_real", {"nope": 1}, split="test")


def play_expert(env, hinted=False):
    results = []
    while (response := env.hinted_expert_response() if hinted else env.expert_response()) is not None:
        results.append(env.step(response))
    return results


@pytest.mark.parametrize("hinted", [False, True], ids=["shopper", "hinted_shopper"])
def test_both_experts_win_in_the_strict_protocol_and_stop_after_the_purchase(hinted):
    for seed in range(30):
        env = env_for(seed, "valid")
        results = play_expert(env, hinted)
        assert results[-1].done and results[-1].won, (seed, env.task_text)
        assert all(r.action_valid for r in results) and len(results) <= 7
        bought = results[-1].info["purchased"]
        if hinted:
            assert bought == env.goal.asin  # the hint names the target
    assert env.expert_response() is None and env.hinted_expert_response() is None


def test_the_shopper_buys_any_item_that_satisfies_the_instruction_not_only_the_target():
    bought_other = 0
    for seed in range(20):
        env = env_for(seed)
        results = play_expert(env)
        product = env.catalog.by_asin[results[-1].info["purchased"]]
        assert get_reward(product, env.goal, env.goal.options).won
        bought_other += product.asin != env.goal.asin
    assert bought_other > 0


def test_the_shopper_takes_over_after_a_wrong_item_and_a_sub_page():
    from envs.webshop.expert import satisfies

    env = env_for(0)
    env.step(env.expert_response())  # the search
    wrong = next(a for a in env.engine.shown() if not satisfies(env.catalog.by_asin[a], env.goal))
    assert env.step(act(f"click[{wrong.lower()}]")).action_valid
    assert env.step(act("click[features]")).action_valid
    results = play_expert(env)
    assert [r.action for r in results[:2]] == ["click[< prev]", "click[< prev]"]  # back to the item, the results
    assert results[-1].won


def test_the_privileged_hint_names_the_target_and_its_options():
    env = env_for(0)
    hint = env.privileged_hint()
    assert env.goal.asin.lower() in hint and env.goal.query in hint
    assert all(f"{k}: {v}" in hint for k, v in env.goal.options.items())
