"""The envs' numbers that the docs quote, recomputed from today's code: splits, experts, prompts, timings.

    python scripts/bench/env_stats.py [--out docs/results/env_stats] [--only webshop search_qa ...]

Everything runs through the envs' own generators and APIs (``envs/``), the warm start's own row
builder (``pipeline.orchestration.warm_start.expert_rows`` with the rollout's ``StudentPrompts``)
and SmolLM2's tokenizer from the model cache (``$PRIVY_CACHE``); nothing is reimplemented.

- ``alfworld``: goal keys that a ``valid_seen`` task shares with a ``train`` task (ALFWorld's
  split sizes on whole floor plans, and the CPU defaults of ``conf/env/alfworld.yaml``); seconds
  to generate and verify the first two ``train`` games of each task type on whole floor plans
  (into a temporary cache).
- ``code_edit``: the splits over 2,400 tasks per split (pairs, instructions, seconds to generate);
  the warm start's expert rows and prompt tokens; the prompts and rewards of the docs' example
  task (train seed 5) and of a member answering ``garbage``; SmolLM2 tokens of the system
  message; sandbox wall times with namespaces (``auto``) and without (``none``).
- ``search_qa``: world sizes, splits and task lists; multi-hop questions whose own text retrieves
  the final hop's document in the top 3; in fresh processes, the first build's seconds (generated
  world, its index, the wiki corpus) and the wiki query time.
- ``webshop``: the requirement split of the default tasks (shared requirements and instructions,
  distinct requirements, draws per task); held-out tasks a train target can win; the scripted
  expert and a random clicker over seeds 0-499; the warm start's shopper (wins, items that are
  not the target, rows, prompt and response tokens).
- ``models``: the bytes of the converted checkpoints in the model cache.

Prints the report (JSON); ``--out`` stores a result folder (``lab.bench.Bench.store``:
results.json, table.md/json, meta.json, command.txt). Timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.bench import ROOT, Bench, add_out

SANDBOX_RUNS = 20  # per isolation mode
SEARCH_PROCESSES = 3  # fresh processes timing the first builds
WIKI_QUERIES = 1000
CODE_EDIT_SPLIT_TASKS = 2400  # per split, as tests/unit/test_split_code_edit.py
CODE_EDIT_EXAMPLE_SEED = 5  # docs/envs_code_edit.md "An episode that ran"
WEBSHOP_SEEDS = 500  # seeds 0-499 per split for the experts and the random clicker
ALFWORLD_GAMES_PER_TYPE = 2


# ----- helpers ---------------------------------------------------------------------------------------
def _compose(overrides: list[str]):
    from pipeline.tools.cli import compose

    return compose(overrides)


def _student_prompts(cfg):
    """The rollout's prompt builder for ``cfg``'s model, history and budget."""
    from pipeline.context.student_prompts import StudentPrompts
    from pipeline.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(cfg.model.path or cfg.model.name, cfg.model.cache_dir), cfg.model.chat_template)
    return StudentPrompts(tok, max_prompt_tokens=cfg.rollout.max_prompt_tokens, history_length=cfg.env.history_length)


def _median(values) -> float:
    return float(statistics.median(values))


def _warm_start_rows(experiment: str) -> dict:
    """The warm start's expert rows of ``+experiment=<experiment>`` (no cloning): what they hold."""
    from pipeline.orchestration.warm_start import expert_rows

    cfg = _compose([f"+experiment={experiment}"])
    prompts = _student_prompts(cfg)
    ex = expert_rows(cfg.env, prompts, cfg.warm_start.tasks, hint_placement=cfg.warm_start.hint_placement)
    prompt_tokens = [len(r.prompt_ids) for r in ex.rows]
    return {
        "experiment": experiment,
        "model": cfg.model.name,
        "history_length": cfg.env.history_length,
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
        "tasks": cfg.warm_start.tasks,
        "episodes": ex.episodes,
        "won": ex.won,
        "rows": len(ex.rows),
        "prompt_tokens_median": _median(prompt_tokens),
        "prompt_tokens_max": max(prompt_tokens),
        "response_tokens_max": max(len(r.response_ids) for r in ex.rows),
        "truncated_prompts": sum(r.truncated_prompt for r in ex.rows),
    }


def _seconds(values: list[float]) -> dict:
    return {
        "n": len(values),
        "min": round(min(values), 2),
        "median": round(_median(values), 2),
        "max": round(max(values), 2),
    }


def _ms(values: list[float]) -> dict:
    return {
        "n": len(values),
        "min": round(1000 * min(values), 1),
        "median": round(1000 * _median(values), 1),
        "max": round(1000 * max(values), 1),
    }


# ----- alfworld --------------------------------------------------------------------------------------
def alfworld_stats() -> dict:
    from envs.alfworld.env import AlfworldOptions, task_for_seed
    from envs.alfworld.generator import TASK_TYPES, get_game, problem_for
    from envs.alfworld.scenes import goal_key

    cpu = _compose([]).env
    assert cpu.name == "alfworld", cpu.name
    cases = {
        "alfworld_sizes_whole_floor_plans": AlfworldOptions(),
        "cpu_defaults": AlfworldOptions.from_dict(dict(cpu.options)),
    }
    split = {}
    for name, opts in cases.items():
        keys = {
            s: [
                goal_key(problem_for(opts.limits, s, *task_for_seed(opts, s, seed)))
                for seed in range(opts.n_tasks_for(s))
            ]
            for s in ("train", "valid_seen", "valid_unseen")
        }
        train = set(keys["train"])
        split[name] = {
            "tasks": {s: len(k) for s, k in keys.items()},
            "valid_seen_tasks_sharing_a_train_goal_key": sum(k in train for k in keys["valid_seen"]),
            "valid_unseen_tasks_sharing_a_train_goal_key": sum(k in train for k in keys["valid_unseen"]),
        }
    games = []
    with tempfile.TemporaryDirectory(prefix="privy-env-stats-alfworld-") as cache:
        for task_type in TASK_TYPES:
            for index in range(ALFWORLD_GAMES_PER_TYPE):
                t0 = time.perf_counter()
                record = get_game(AlfworldOptions().limits, "train", task_type, index, cache)
                games.append(
                    {
                        "task_type": task_type,
                        "index": index,
                        "floorplan": record.floorplan,
                        "seconds": round(time.perf_counter() - t0, 2),
                    }
                )
    return {
        "split": split,
        "generation_whole_floor_plans": {
            "games": games,
            "seconds": _seconds([g["seconds"] for g in games]),
        },
    }


# ----- code_edit -------------------------------------------------------------------------------------
def code_edit_stats() -> dict:
    from envs import make_env
    from envs.code_edit import sandbox, tools
    from envs.code_edit.tasks import SPLITS, generate_task
    from pipeline.context.expert import expert_episode

    # splits, as tests/unit/test_split_code_edit.py generates them
    t0 = time.perf_counter()
    pairs, instructions = {}, {}
    for s in SPLITS:
        tasks = [generate_task(seed, s) for seed in range(CODE_EDIT_SPLIT_TASKS)]
        pairs[s] = {(t.family, t.task_id.rsplit("-", 1)[1]) for t in tasks}
        instructions[s] = {t.instruction for t in tasks}
    gen_s = time.perf_counter() - t0
    split = {
        "tasks_per_split": CODE_EDIT_SPLIT_TASKS,
        "generate_seconds": round(gen_s, 2),
        "pairs": {s: len(p) for s, p in pairs.items()},
        "held_out_pairs_in_train": {s: len(pairs[s] & pairs["train"]) for s in ("valid", "test")},
        "held_out_instructions_in_train": {s: len(instructions[s] & instructions["train"]) for s in ("valid", "test")},
    }

    warm = _warm_start_rows("code_edit_warm_start")

    # the docs' example task: the expert's prompts, and a member answering "garbage"
    cfg = _compose(["+experiment=code_edit_warm_start"])
    prompts = _student_prompts(cfg)
    env = make_env("code_edit", dict(cfg.env.options), "train")
    try:
        rows, won = expert_episode(env, prompts, CODE_EDIT_EXAMPLE_SEED)
        task = env.task
        example = {
            "seed": CODE_EDIT_EXAMPLE_SEED,
            "task_id": task.task_id,
            "family": task.family,
            "target": task.target_function,
            "history_length": cfg.env.history_length,
            "expert_turns": len(rows),
            "expert_won": won,
            "expert_reward": rows[-1].step_reward,
            "expert_prompt_tokens": [len(r.prompt_ids) for r in rows],
        }
    finally:
        env.close()
    env = make_env("code_edit", {**dict(cfg.env.options), "max_turns": 6}, "train")
    try:
        env.reset(CODE_EDIT_EXAMPLE_SEED)
        results = [env.step("garbage") for _ in range(6)]
        last = results[-1]
        example["garbage_max_turns"] = 6
        example["garbage_invalid_turns"] = sum(not r.action_valid for r in results)
        example["garbage_reward"] = last.reward
        example["garbage_failed_criteria"] = {c.criterion: c.failing_turn for c in last.criteria if not c.passed}
    finally:
        env.close()
    system_tokens = len(prompts.tokenizer(tools.system_prompt(), add_special_tokens=False)["input_ids"])

    # sandbox wall time, with namespaces (auto) and without, alternating
    task = generate_task(CODE_EDIT_EXAMPLE_SEED, "train")
    walls = {"auto": [], "none": []}
    isolation = {}
    with tempfile.TemporaryDirectory(prefix="privy-env-stats-repo-") as d:
        for path, text in task.files.items():
            (Path(d) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(d) / path).write_text(text)
        sandbox.run_tests(d, task.test_files)  # the first run probes what isolation is available
        for _ in range(SANDBOX_RUNS):
            for mode in walls:
                t0 = time.perf_counter()
                res = sandbox.run_tests(d, task.test_files, isolation=mode)
                walls[mode].append(time.perf_counter() - t0)
                assert res.completed, res.output_tail
                iso = res.isolation
                isolation[mode] = {
                    "network": iso.network,
                    "filesystem": iso.filesystem,
                    "pid_namespace": iso.pid_namespace,
                }
    try:
        util_linux = subprocess.run(["unshare", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        util_linux = ""
    return {
        "split": split,
        "warm_start": warm,
        "example": example,
        "system_prompt_tokens": system_tokens,
        "sandbox": {
            "runs_per_mode": SANDBOX_RUNS,
            "task": task.task_id,
            "wall_ms": {mode: _ms(v) for mode, v in walls.items()},
            "isolation": isolation,
            "root": os.geteuid() == 0,
            "kernel": platform.release(),
            "util_linux": util_linux,
        },
    }


# ----- search_qa -------------------------------------------------------------------------------------
def search_first_builds() -> dict:
    """In a fresh process: the first build of each corpus and index, and the wiki query time."""
    t0 = time.perf_counter()
    import bm25s  # noqa: F401

    out = {"import_bm25s_s": time.perf_counter() - t0}
    from envs.search_qa.corpus import generated_corpus, wiki_available, wiki_corpus

    t0 = time.perf_counter()
    corpus = generated_corpus()
    out["generated_world_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    corpus.bm25()
    out["generated_index_s"] = time.perf_counter() - t0
    if wiki_available():
        t0 = time.perf_counter()
        wiki = wiki_corpus()
        out["wiki_first_build_s"] = time.perf_counter() - t0
        bm25 = wiki.bm25()
        queries = [q.queries[0] for q in wiki.questions[:WIKI_QUERIES]]
        times = []
        for q in queries:
            t0 = time.perf_counter()
            bm25.retrieve([q], topk=3)
            times.append(time.perf_counter() - t0)
        out["wiki_query_ms_median"] = 1000 * _median(times)
    return out


def search_qa_stats() -> dict:
    from collections import Counter

    from envs.search_qa.corpus import SPLITS, generated_corpus, wiki_available, wiki_corpus
    from envs.search_qa.env import SearchQAOptions, tasks_for

    corpus = generated_corpus()
    multi = [q for q in corpus.questions if q.hops > 1]
    hits = corpus.bm25().retrieve([q.question for q in multi], topk=3)
    found = sum(q.support[-1] in [h["document"]["id"] for h in hs] for q, hs in zip(multi, hits))
    opts = SearchQAOptions.from_dict(dict(_compose(["env=search_qa"]).env.options))
    generated = {
        "documents": len(corpus.docs),
        "questions": len(corpus.questions),
        "questions_by_hops": {str(h): n for h, n in sorted(Counter(q.hops for q in corpus.questions).items())},
        "questions_by_split": {s: sum(q.split == s for q in corpus.questions) for s in SPLITS},
        "default_task_lists": {s: len(tasks_for(opts, s)) for s in SPLITS},
        "multi_hop_questions": len(multi),
        "multi_hop_final_doc_in_top3_from_the_question": found,
    }
    out = {"generated": generated}
    if wiki_available():
        wiki = wiki_corpus()
        out["wiki"] = {
            "documents": len(wiki.docs),
            "questions": len(wiki.questions),
            "questions_by_split": {s: sum(q.split == s for q in wiki.questions) for s in SPLITS},
        }
    runs = []
    for _ in range(SEARCH_PROCESSES):
        res = subprocess.run(
            [sys.executable, __file__, "--search-first-builds"], capture_output=True, text=True, check=True, cwd=ROOT
        )
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    out["first_builds"] = {
        "processes": SEARCH_PROCESSES,
        **{key: [round(r[key], 4) for r in runs] for key in runs[0]},
    }
    return out


# ----- webshop ---------------------------------------------------------------------------------------
def _draws(catalog, index, split: str, task_index: int) -> int:
    """How many draws ``env.draw_goal`` takes for the task (its loop, counted)."""
    from envs.webshop.catalog import generate_goal, requirement_split
    from envs.webshop.env import GOAL_ATTEMPTS, draw_goal

    for attempt in range(GOAL_ATTEMPTS):
        goal = generate_goal(catalog, split, task_index, attempt)
        if requirement_split(goal) == split and index.rank(goal.instruction, goal.asin) is not None:
            assert goal == draw_goal(catalog, index, split, task_index)
            return attempt + 1
    raise RuntimeError(f"webshop {split} task {task_index}: no goal in {GOAL_ATTEMPTS} draws")


def webshop_split(n_tasks: dict[str, int], catalog_seed: int = 0, n_products: int = 400) -> dict:
    """The goals of the first ``n_tasks[split]`` tasks of each split, as sets (``env.draw_goal``)."""
    from envs.webshop.catalog import SPLITS, requirement
    from envs.webshop.engine import catalog_and_index
    from envs.webshop.env import draw_goal

    catalog, index = catalog_and_index(catalog_seed, n_products)
    goals = {s: [draw_goal(catalog, index, s, i) for i in range(n_tasks[s])] for s in SPLITS}
    needs = {s: {requirement(g) for g in goals[s]} for s in SPLITS}
    texts = {s: {g.instruction for g in goals[s]} for s in SPLITS}
    targets = {s: {g.asin for g in goals[s]} for s in SPLITS}
    held_out = [s for s in SPLITS if s != "train"]
    return {
        "catalog": catalog.key,
        "tasks": dict(n_tasks),
        "distinct_targets": {s: len(v) for s, v in targets.items()},
        "distinct_requirements": {s: len(v) for s, v in needs.items()},
        "distinct_instructions": {s: len(v) for s, v in texts.items()},
        "held_out_tasks_with_a_train_requirement": {
            s: sum(requirement(g) in needs["train"] for g in goals[s]) for s in held_out
        },
        "held_out_tasks_with_a_train_instruction": {
            s: sum(g.instruction in texts["train"] for g in goals[s]) for s in held_out
        },
        "held_out_targets_in_train": {s: len(targets[s] & targets["train"]) for s in held_out},
    }


def webshop_stats() -> dict:
    from envs import make_env
    from envs.webshop.catalog import SPLITS
    from envs.webshop.engine import catalog_and_index
    from envs.webshop.env import DEFAULT_N_TASKS, draw_goal
    from envs.webshop.expert import satisfies

    catalog, index = catalog_and_index(0, 400)
    split = webshop_split(DEFAULT_N_TASKS)
    draws = {s: [_draws(catalog, index, s, i) for i in range(DEFAULT_N_TASKS[s])] for s in SPLITS}
    split["draws_per_task"] = {
        s: {"mean": round(statistics.fmean(d), 2), "max": max(d), "tasks": len(d)} for s, d in draws.items()
    }
    train_pool = [catalog.by_asin[a] for a in catalog.targets["train"]]
    split["held_out_tasks_a_train_target_wins"] = {
        s: sum(
            any(satisfies(p, goal) for p in train_pool)
            for goal in (draw_goal(catalog, index, s, i) for i in range(DEFAULT_N_TASKS[s]))
        )
        for s in SPLITS
        if s != "train"
    }

    def act(action: str) -> str:
        return f"<think>ok</think><action>{action}</action>"

    scripted = {}
    for s in SPLITS:
        won = 0
        for seed in range(WEBSHOP_SEEDS):
            env = make_env("webshop", {}, s)
            env.reset(seed)
            for a in env.expert_actions():
                r = env.step(act(a))
            won += r.won
        scripted[s] = won
    bought = won = 0
    for seed in range(WEBSHOP_SEEDS):  # tests/unit/test_webshop.py's random clicker, on train
        rng, env = random.Random(seed), make_env("webshop", {}, "train")
        obs, r = env.reset(seed), None
        while r is None or not r.done:
            choice = rng.choice(obs.admissible_actions)
            r = env.step(act(f"search[{env.task_text}]" if choice.startswith("search[") else choice))
            obs = r.observation
        won += r.won
        bought += "purchased" in r.info
    shopper = {}
    for s in SPLITS:
        wins = other = 0
        turns = []
        for seed in range(WEBSHOP_SEEDS):
            env = make_env("webshop", {}, s)
            env.reset(seed)
            results = []
            while (text := env.expert_response()) is not None:
                results.append(env.step(text))
            wins += results[-1].won
            other += results[-1].info.get("purchased") != env.goal.asin
            turns.append(len(results))
        shopper[s] = {"tasks": WEBSHOP_SEEDS, "won": wins, "bought_not_the_target": other, "max_turns": max(turns)}
    return {
        "split": split,
        "scripted_expert_won": {"seeds": WEBSHOP_SEEDS, **scripted},
        "random_clicker": {"split": "train", "episodes": WEBSHOP_SEEDS, "bought": bought, "won": won},
        "shopper": shopper,
        "warm_start": _warm_start_rows("webshop_warm_start"),
    }


# ----- models ----------------------------------------------------------------------------------------
def models_stats() -> dict:
    from pipeline.models.cache import cache_root

    out = {}
    for name in ("smollm2-135m-instruct", "gemma3-270m"):
        d = cache_root(None) / "models" / name
        if (d / "model.safetensors").is_file():
            out[name] = {"model_safetensors_bytes": (d / "model.safetensors").stat().st_size}
    return out


SECTIONS = {
    "alfworld": alfworld_stats,
    "code_edit": code_edit_stats,
    "search_qa": search_qa_stats,
    "webshop": webshop_stats,
    "models": models_stats,
}


# ----- the table -------------------------------------------------------------------------------------
def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def table_rows(report: dict) -> list[dict]:
    """One row per leaf of each section: ``section``, the dotted ``key`` inside it, the ``value``
    (a list of scalars joined by commas; a list of records is left to results.json)."""
    rows = []

    def walk(section: str, prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(section, f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
            return
        else:
            rows.append({"section": section, "key": prefix, "value": _cell(node)})

    for section in SECTIONS:
        if section in report:
            walk(section, "", report[section])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out(ap, help="store a result folder here (every section)")
    ap.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="these sections only (no --out)")
    ap.add_argument("--search-first-builds", action="store_true", help=argparse.SUPPRESS)  # internal
    args = ap.parse_args()
    if args.search_first_builds:
        print(json.dumps(search_first_builds()))
        return
    if args.out and args.only:
        ap.error("--out stores every section: leave --only out")
    bench = Bench.start(args.out)
    report: dict = {"command": bench.command}
    t_all = time.perf_counter()
    for name in args.only or list(SECTIONS):
        t0 = time.perf_counter()
        print(f"env_stats: {name} ...", file=sys.stderr, flush=True)
        report[name] = SECTIONS[name]()
        print(f"env_stats: {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    print(json.dumps(report, indent=1))
    bench.store(report, table_rows(report))


if __name__ == "__main__":
    main()
