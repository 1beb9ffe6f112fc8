"""Pre-generate the ALFWorld games a run will use, so rollouts never wait for the planner.

    python -m envs.alfworld --split train valid_seen valid_unseen --workers 2 \\
        --option max_receptacles=8 --option max_objects=8

Options are the env's own (``--option key=value``, values parsed as YAML scalars); the games
written are exactly those ``reset(seed)`` asks for with seeds ``0 .. n_tasks-1``. A real-size
game takes 1-3 s on one core (a few heat/cool/two-object kitchens up to about 25 s); the small
scenes of the tests about 0.7 s.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import yaml

from envs.alfworld.env import AlfworldOptions, check_split, task_for_seed
from envs.alfworld.generator import SPLITS, get_game


def _one(args: tuple[AlfworldOptions, str, int]) -> str:
    options, split, seed = args
    task_type, index = task_for_seed(options, split, seed)
    return get_game(options.limits, split, task_type, index, options.cache_dir).path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m envs.alfworld", description=__doc__.split("\n")[0])
    parser.add_argument("--split", nargs="+", default=list(SPLITS), choices=SPLITS)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="an alfworld env option")
    parser.add_argument("--limit", type=int, default=0, help="at most this many tasks per split (0 = n_tasks)")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    raw = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--option expects KEY=VALUE, got {item!r}")
        raw[key] = yaml.safe_load(value)
    options = AlfworldOptions.from_dict(raw)
    jobs = []
    for split in args.split:
        check_split(split, options)
        n = options.n_tasks_for(split)
        if n == 0 and args.limit <= 0:
            parser.error("n_tasks=0 (every seed its own task) needs --limit")
        n = min(n, args.limit) if n and args.limit > 0 else (n or args.limit)
        jobs += [(options, split, seed) for seed in range(n)]
    start = time.time()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for done, _ in enumerate(pool.map(_one, jobs, chunksize=4), start=1):
            if done % 50 == 0 or done == len(jobs):
                print(f"{done}/{len(jobs)} games ready ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
