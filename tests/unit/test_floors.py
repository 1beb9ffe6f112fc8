"""Floors (scripts/bench/floors.py): degenerate policies played through the envs' own step and
reward, stored for the recipes' splits and tasks, and printed under every learning table with a
note when a headline is at or below them (scripts/lab/results.py)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from envs import make_env
from lab import results

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("floors_bench", ROOT / "scripts" / "bench" / "floors.py")
floors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floors)


def played(name: str, options: dict, split: str, task: int, policy):
    """The last step of one episode of ``policy`` through the env, and the turns it took."""
    env = make_env(name, options, split)
    try:
        obs = env.reset(task)
        respond, turns = policy(env, task), []

        def counted(o, t):
            turns.append(t)
            return respond(o, t)

        return floors.play(env, obs, counted), len(turns)
    finally:
        env.close()


def expert(env, task):
    """The env's scripted expert, to show that the same harness counts a win when there is one."""
    return lambda obs, turn: env.expert_response()


def test_search_qa_floor_answers_its_kinds_most_frequent_train_answer_at_once():
    answers, n_train = floors.search_qa_answers({})
    from envs.search_qa.corpus import normalize_answer
    from envs.search_qa.env import SearchQAOptions, tasks_for

    train = tasks_for(SearchQAOptions.from_dict({}), "train")
    assert n_train == len(train) > 1000
    for kind, answer in answers.items():  # the answer is the mode of its kind's train answers
        counts = Counter(normalize_answer(q.answers[0]) for q in train if q.kind == kind)
        assert counts[normalize_answer(answer)] == max(counts.values()), kind  # founders are unique: 1
    policies, _ = floors.search_qa_policies({})
    for task in range(4):
        last, turns = played("search_qa", {}, "test", task, policies["most frequent train answer"])
        assert turns == 1 and last.info["n_searches"] == 0  # answered at the first turn, no search
        assert normalize_answer(last.info["answer"]) == normalize_answer(answers[last.info["kind"]])
        assert expert_wins("search_qa", {}, "test", task)


def expert_wins(name, options, split, task) -> bool:
    return played(name, options, split, task, expert)[0].won


def test_webshop_floor_buys_its_one_product_whatever_the_instruction_and_the_env_scores_it():
    from envs.webshop.reward import get_reward

    options = {"n_tasks": 300}  # a smaller train split than the recipe's 5000 goals: the same rule, faster
    policies, best = floors.webshop_policies(options)
    assert best["train_goals"] == 300 and best["train_wins"] >= 1
    for task in range(3):
        env = make_env("webshop", options, "valid")
        obs = env.reset(task)
        last = floors.play(env, obs, policies["one train product"](env, task))
        product = env.catalog.by_asin[best["asin"]]
        assert last.info["purchased"] == best["asin"]  # the same item, bought with the same options
        assert last.info["task_score"] == get_reward(product, env.goal, best["options"]).total
        assert last.won == (last.info["task_score"] == 1.0)
    assert expert_wins("webshop", options, "valid", 0)


def test_keyword_floors_never_name_a_held_out_word():
    policies, details = floors.keyword_policies({})
    assert details["train_words"] == 729
    assert floors.episodes("keyword", {}, "test", 16, policies["random train word"]) == [0.0] * 16
    assert floors.episodes("keyword", {}, "test", 4, policies["empty reply"]) == [0.0] * 4
    assert floors.episodes("keyword", {}, "test", 4, expert) == [1.0] * 4


def test_code_edit_floors_call_the_tools_and_finishing_at_once_fails_only_the_tests():
    policies, _ = floors.code_edit_policies({})
    tools = []
    for task in range(3):
        env = make_env("code_edit", {}, "valid")
        obs = env.reset(task)
        respond = policies["random tool calls"](env, task)
        last = floors.play(env, obs, lambda o, t, r=respond: tools.append(r(o, t)) or tools[-1])
        assert last.done
        env.close()
    assert len({t.split('"name": "')[1].split('"')[0] for t in tools}) >= 3  # several tools, not one
    last, turns = played("code_edit", {}, "valid", 0, policies["finish at once"])
    verdicts = {c.criterion: c.passed for c in last.criteria}
    assert turns == 1 and not last.won and not verdicts.pop("tests_pass")
    assert verdicts.get("final_table") and verdicts.get("stays_in_repo") and verdicts.get("no_test_edits")
    assert expert_wins("code_edit", {}, "valid", 0)


def test_alfworld_floors_act_in_the_protocol_until_the_turn_limit():
    options = floors.recipe("alfworld")["options"]
    policies, _ = floors.alfworld_policies(options)
    for name in ("random admissible action", "look every turn"):
        env = make_env("alfworld", options, "valid_unseen")
        obs = env.reset(0)
        last = floors.play(env, obs, policies[name](env, 0))
        assert last.action_valid and last.info["turn"] == env.max_turns  # every action admissible, to the limit
        env.close()


POLICIES = {  # per env: its floors (a prior the splits cannot remove, or a random and a no-op policy)
    "search_qa": {"most frequent train answer"},
    "webshop": {"one train product"},
    "keyword": {"random train word", "empty reply"},
    "code_edit": {"random tool calls", "finish at once"},
    "alfworld": {"random admissible action", "look every turn"},
}


def test_the_stored_floors_cover_every_env_at_its_recipes_splits_and_tasks():
    stored = json.loads((ROOT / "docs" / "results" / "floors" / "results.json").read_text())
    by_env: dict[str, set] = {}
    for f in stored["floors"]:
        by_env.setdefault(f["env"], set()).add((f["split"], f["policy"], len(f["won"])))
    assert set(floors.POLICIES) == set(POLICIES)
    for env, policies in POLICIES.items():
        r = floors.recipe(env)  # the splits and task count the learning tables of this env use
        assert r["splits"][0] in ("valid", "valid_seen") and len(r["splits"]) == 2, r
        assert by_env[env] == {(s, p, r["tasks"]) for s in r["splits"] for p in policies}, env


# ----- the floors under a learning table ----------------------------------------------------------------
def run(name: str, test_won: list[int], env: str = "keyword") -> results.Run:
    files = {
        "metrics.jsonl": json.dumps({"step": 1, "final/test/success": sum(test_won) / len(test_won)}) + "\n",
        "summary.json": json.dumps({"steps": 1, "seconds": 60.0}),
        "config.yaml": f"env:\n  name: {env}\ntrainer:\n  val_tasks: {len(test_won)}\n",
        "outcomes/final_test_step0001_greedy.jsonl": "".join(
            json.dumps({"task": i, "won": bool(w)}) + "\n" for i, w in enumerate(test_won)
        ),
    }
    return results._parse_run(name, files)


FLOORS = [
    {"env": "keyword", "split": "test", "policy": "prior", "won": [1, 1, 0, 0, 0, 0, 0, 0]},  # 2/4 on the first 4
    {"env": "keyword", "split": "test", "policy": "no-op", "won": [0] * 8},
    {"env": "other", "split": "test", "policy": "elsewhere", "won": [1] * 8},
    {"env": "keyword", "split": "valid", "policy": "prior", "won": [1] * 8},
]


def test_a_learning_table_ends_with_its_envs_floors_on_the_same_tasks_and_says_which_headline_is_at_or_below():
    runs = [run("start_s0", [1, 0, 0, 0]), run("grpo_s0", [1, 1, 1, 1]), run("grpo_s1", [1, 1, 1, 1])]
    tables = results.learning_tables(runs, floors=FLOORS)
    rows = {r["method"]: r for r in tables["table"]}
    assert list(rows)[-2:] == ["floor: prior", "floor: no-op"]  # this env and split only, in stored order
    assert rows["floor: prior"]["test success"] == results.floor_text([1, 1, 0, 0])  # cut to the runs' 4 tasks
    assert rows["floor: prior"]["test success"].endswith("(2/4 tasks)") and rows["floor: prior"]["runs"] == ""
    assert [r["method"] for r in tables["summary"]][-2:] == ["floor: prior", "floor: no-op"]
    [note, again] = tables[results.NOTES]
    assert (note["table"], again["table"]) == ("table", "summary") and note["note"] == again["note"]
    assert "Floors on the same 4 test tasks" in note["note"]
    assert "**At or below the floor** (prior" in note["note"] and "start 0.250" in note["note"]
    assert "grpo" not in note["note"].split("At or below")[1]  # 1.0 is above the floor's interval
    rendered = results.render_table("summary", tables)
    assert rendered == results.render_md(tables["summary"]) + f"\n{note['note']}\n"
    above = results.learning_tables(runs[1:], floors=FLOORS)[results.NOTES][0]["note"]
    assert "Every headline is above the floors' intervals" in above
    assert results.learning_tables([run("grpo_s0", [1, 0, 0, 0], env="none")], floors=FLOORS)[results.NOTES] == []


def test_the_floor_interval_is_wilsons_over_tasks():
    z = 1.959963984540054  # the 95% normal quantile; Wilson's interval in closed form below
    iv = results.proportion_interval([0.0] * 64)
    assert (iv.mean, iv.low, iv.n) == (0.0, 0.0, 64) and iv.high == pytest.approx(z**2 / (64 + z**2))
    iv = results.proportion_interval([1.0, 0.0] * 16)
    half = z * (0.25 / 32 + z**2 / (4 * 32**2)) ** 0.5 / (1 + z**2 / 32)
    assert iv.mean == 0.5 and (iv.low, iv.high) == pytest.approx((0.5 - half, 0.5 + half))
