"""Floors: the held-out success of degenerate policies that ignore what they should not be able to ignore.

    python scripts/bench/floors.py [--out docs/results/floors] [--only search_qa webshop ...]

A learning table's test success means something only above what a policy that never reads the
task would score on the same tasks: answer priors that the splits cannot remove (a city or a year
that many questions share, a product that satisfies many instructions) show up here. Every floor
is played through the env's own ``reset`` / ``step`` (its parser, its reward, its judge), one
episode per held-out task, on the splits and tasks the learning tables use: each env's recipe
(``conf/experiment/<env>_warm_start.yaml``, composed as ``scripts/train.py`` composes it) gives
the env options, the validation split (``env.val_split``), the split read once at the end
(``trainer.final_val_splits``) and the task count (``trainer.val_tasks``: validation task i is
task seed i, so these are the runs' very tasks). The policies:

- **search_qa, ``most frequent train answer``**: for each question kind of the generator
  (``Question.kind``: ``product_founder``, ``company_hq``, ...; the kind is written in the
  question's template, so a policy that reads only the template knows it), the gold answer that
  most train questions of that kind have (``tasks_for(options, "train")``: the whole train split;
  ties: the alphabetically first normalised answer); it answers that at the first turn,
  ``<answer> X </answer>``, without searching.
- **webshop, ``one train product``**: the single (train target product, option choice) that wins
  the most train goals (every goal of the train split, ``DEFAULT_N_TASKS``, scored with the
  env's own ``reward.get_reward``; ties: the first ASIN, then the first option choice in the
  product's display order), bought whatever the instruction says: search its title, page to it, open it, click
  its options, buy (the env's engine and reward).
- **keyword, ``random train word``**: ``<answer>w</answer>`` with w drawn uniformly from the train
  split's words (seeded per task); **``empty reply``**: the reply "" (no-op).
- **code_edit, ``random tool calls``**: each turn one of the 7 tools uniformly (seeded per task),
  its arguments drawn from what the repository holds: a random file of it; ``search`` a random
  word of the instruction; ``replace_in_file`` a random non-empty line of the file by another
  random line of it; ``create_file`` the file with a random line deleted; ``finish`` with an empty
  change table; until ``finish`` or the turn limit. **``finish at once``** (no-op): ``finish``
  at the first turn with an empty change table (every criterion but the edit itself can pass).
- **alfworld, ``random admissible action``**: each turn a command drawn uniformly from the
  admissible ones (seeded per task), in the recipe's ``<think>/<action>`` protocol, until the
  episode's turn limit; **``look every turn``** (no-op): ``look``, admissible and changing nothing.

Success is the env's ``won``, the number the learning tables report; its interval is the 95%
Wilson interval over the tasks (``lab.results.proportion_interval``). ``--out`` stores the result
folder (``results.json``: per floor the outcome of every task, read by the learning tables, which
print the floors of their env under each table; ``table.md``; ``meta.json``; ``command.txt``).
ALFWorld generates its held-out games into ``$PRIVY_CACHE/alfworld`` on first use (about 1 s each).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable

from lab.bench import Bench, add_out
from lab.results import floor_text

# env -> the learning recipe whose env options, splits and task count its tables use
RECIPES = {
    "search_qa": "search_qa_warm_start",
    "webshop": "webshop_warm_start",
    "keyword": "keyword_warm_start",
    "code_edit": "code_edit_warm_start",
    "alfworld": "alfworld_warm_start",
}
EMPTY_TABLE = "| file | change |\n|---|---|"  # a Markdown change table that lists no change


def recipe(env: str) -> dict:
    """The env options, the splits (validation, then the final ones) and the task count of ``env``'s recipe."""
    from omegaconf import OmegaConf

    from pipeline.tools.cli import compose

    cfg = compose([f"+experiment={RECIPES[env]}"])
    assert cfg.env.name == env, (env, cfg.env.name)
    options = OmegaConf.to_container(cfg.env.options) if OmegaConf.is_config(cfg.env.options) else cfg.env.options
    splits = list(dict.fromkeys([cfg.env.val_split, *cfg.trainer.final_val_splits]))
    return {"recipe": RECIPES[env], "options": dict(options or {}), "splits": splits, "tasks": cfg.trainer.val_tasks}


Respond = Callable[[object, int], str]  # (observation, turn) -> the raw reply
Policy = Callable[[object, int], Respond]  # (the env after reset, task) -> its episode's responder


def play(env, obs, respond: Respond):
    """One episode from its reset observation ``obs`` to its end through the env's own step; the last StepResult."""
    turn = 0
    while True:
        res = env.step(respond(obs, turn))
        if res.done:
            return res
        obs, turn = res.observation, turn + 1


def episodes(name: str, options: dict, split: str, n: int, policy: Policy) -> list[float]:
    """Won (1/0) of tasks 0..n-1 of ``split``, one episode each."""
    from envs import make_env

    won = []
    for task in range(n):
        env = make_env(name, options, split)
        try:
            obs = env.reset(task)
            won.append(float(play(env, obs, policy(env, task)).won))
        finally:
            env.close()
    return won


def act(action: str, why: str = "") -> str:
    """An action in the ``<think>/<action>`` protocol (WebShop, ALFWorld)."""
    return f"<think>{why}</think><action>{action}</action>"


def constant(reply: str) -> Policy:
    """The policy that gives the same reply at every turn of every task."""
    return lambda env, task: lambda obs, turn: reply


# ----- search_qa ------------------------------------------------------------------------------------
def search_qa_answers(options: dict) -> tuple[dict[str, str], int]:
    """Each question kind's most frequent train answer, and the train questions counted."""
    from envs.search_qa.corpus import normalize_answer
    from envs.search_qa.env import SearchQAOptions, tasks_for

    train = tasks_for(SearchQAOptions.from_dict(options), "train")
    by_kind: dict[str, Counter] = {}
    spelled: dict[str, str] = {}
    for q in train:
        key = normalize_answer(q.answers[0])
        by_kind.setdefault(q.kind, Counter())[key] += 1
        spelled.setdefault(key, q.answers[0])
    answers = {kind: spelled[min(c, key=lambda a: (-c[a], a))] for kind, c in sorted(by_kind.items())}
    return answers, len(train)


def search_qa_policies(options: dict) -> tuple[dict[str, Policy], dict]:
    answers, n_train = search_qa_answers(options)

    def policy(env, task):
        answer = answers.get(env.question.kind, "unknown")
        return constant(f"<think>The usual answer to this kind of question.</think>\n<answer> {answer} </answer>")(
            env, task
        )

    return {"most frequent train answer": policy}, {"answers": answers, "train_questions": n_train}


# ----- webshop --------------------------------------------------------------------------------------
def webshop_product(options: dict) -> dict:
    """The (train target, option choice) that wins the most train goals, scored by the env's reward."""
    from envs.webshop.engine import catalog_and_index
    from envs.webshop.env import WebShopOptions, draw_goal
    from envs.webshop.reward import attribute_matches, get_reward, type_reward

    opts = WebShopOptions.from_dict(options)
    catalog, index = catalog_and_index(opts.catalog_seed, opts.n_products)
    n_goals = opts.n_tasks_for("train")
    goals = [draw_goal(catalog, index, "train", i) for i in range(n_goals)]
    best = None
    for asin in sorted(set(catalog.targets["train"])):
        p = catalog.by_asin[asin]
        combos = [dict(zip(p.options, v)) for v in itertools.product(*p.options.values())] or [{}]
        wins = Counter()
        for g in goals:  # the option choice cannot rescue a wrong type, attribute or price: skip those goals early
            if p.price > g.price_upper or type_reward(p, g)[0] != 1.0 or attribute_matches(p, g) != len(g.attributes):
                continue
            for k, chosen in enumerate(combos):
                wins[k] += get_reward(p, g, chosen).won
        k, n = max(wins.items(), key=lambda kv: (kv[1], -kv[0]), default=(0, 0))
        if best is None or n > best["train_wins"]:
            best = {"asin": asin, "title": p.title, "options": combos[k], "train_wins": n, "train_goals": n_goals}
    return best


def webshop_policies(options: dict) -> tuple[dict[str, Policy], dict]:
    from envs.webshop.engine import BUY_NOW, NEXT_PAGE, PER_PAGE

    best = webshop_product(options)
    asin, title = best["asin"].lower(), best["title"]

    def policy(env, task):
        rank = env.index.rank(title, best["asin"])
        if rank is None:
            raise RuntimeError(f"webshop: its own title does not find {asin}")
        plan = [f"search[{title}]", *[f"click[{NEXT_PAGE}]"] * (rank // PER_PAGE), f"click[{asin}]"]
        plan += [f"click[{v}]" for v in best["options"].values()] + [f"click[{BUY_NOW}]"]
        return lambda obs, turn: act(plan[turn], "I always buy the same item.")

    return {"one train product": policy}, best


# ----- keyword --------------------------------------------------------------------------------------
def keyword_policies(options: dict) -> tuple[dict[str, Policy], dict]:
    from envs.keyword import split_words

    words = split_words("train")

    def random_word(env, task):
        word = random.Random(f"floors/keyword/{env.split}/{task}").choice(words)
        return constant(f"<answer>{word}</answer>")(env, task)

    return {"random train word": random_word, "empty reply": constant("")}, {"train_words": len(words)}


# ----- code_edit ------------------------------------------------------------------------------------
def code_edit_random(env, task) -> Respond:
    from envs.code_edit.tools import TOOLS, format_tool_call

    rng = random.Random(f"floors/code_edit/{env.split}/{task}")
    words = env.task_text.split()

    def respond(obs, turn):
        ws = env.workspace
        path = rng.choice(ws.files())
        lines = ws.read(path).splitlines()
        filled = [x for x in lines if x.strip()] or [""]
        tool = rng.choice(sorted(TOOLS))
        if tool == "view_file":
            args = {"path": path}
        elif tool == "search":
            args = {"pattern": rng.choice(words)}
        elif tool == "replace_in_file":
            args = {"path": path, "old": rng.choice(filled), "new": rng.choice(filled)}
        elif tool == "create_file":
            drop = rng.randrange(len(lines)) if lines else 0
            args = {"path": path, "content": "\n".join(lines[:drop] + lines[drop + 1 :]) + "\n"}
        elif tool == "finish":
            args = {"message": EMPTY_TABLE}
        else:  # list_files, run_tests
            args = {}
        return format_tool_call(tool, args)

    return respond


def code_edit_policies(options: dict) -> tuple[dict[str, Policy], dict]:
    from envs.code_edit.tools import format_tool_call

    finish = constant(format_tool_call("finish", {"message": EMPTY_TABLE}))
    return {"random tool calls": code_edit_random, "finish at once": finish}, {}


# ----- alfworld -------------------------------------------------------------------------------------
def alfworld_policies(options: dict) -> tuple[dict[str, Policy], dict]:
    def random_action(env, task):
        rng = random.Random(f"floors/alfworld/{env.split}/{task}")
        return lambda obs, turn: act(rng.choice(obs.admissible_actions))

    return {"random admissible action": random_action, "look every turn": constant(act("look"))}, {}


POLICIES = {
    "search_qa": search_qa_policies,
    "webshop": webshop_policies,
    "keyword": keyword_policies,
    "code_edit": code_edit_policies,
    "alfworld": alfworld_policies,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(ap)
    ap.add_argument("--only", nargs="+", choices=sorted(POLICIES), help="these envs only (default: all)")
    args = ap.parse_args()
    bench = Bench.start(args.out)
    t_all = time.time()
    report = {"command": bench.command, "recipes": {}, "details": {}, "seconds": {}, "floors": []}
    table = []
    for env in args.only or list(POLICIES):
        t0 = time.time()
        r = report["recipes"][env] = recipe(env)
        policies, report["details"][env] = POLICIES[env](r["options"])
        for policy, play_one in policies.items():
            for split in r["splits"]:
                won = episodes(env, r["options"], split, r["tasks"], play_one)
                report["floors"].append({"env": env, "split": split, "policy": policy, "won": won})
                table.append(
                    {
                        "env": env,
                        "split": split,
                        "policy": policy,
                        "success [95% Wilson]": floor_text(won),
                    }
                )
                print(f"floors: {env} {split} {policy}: {table[-1]['success [95% Wilson]']}", file=sys.stderr)
        report["seconds"][env] = round(time.time() - t0, 1)
    report["seconds"]["all"] = round(time.time() - t_all, 1)
    print(json.dumps({k: v for k, v in report.items() if k != "floors"}, indent=1))
    bench.store(report, table)


if __name__ == "__main__":
    main()
