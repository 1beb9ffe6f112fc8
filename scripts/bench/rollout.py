"""Rollout throughput: one rollout worker playing the same groups with 1, 2, 4, ... groups in flight.

    python scripts/bench/rollout.py                       # the default ALFWorld recipe (SmolLM2, G=4)
    python scripts/bench/rollout.py --model tiny --env keyword --group-size 8 --groups 16 \\
        --in-flight 1 2 4 8 16                           # the GPU-shaped workload, on CPU
    [--max-turns N] [--max-new-tokens 48] [--temperature 0.7] [--precision auto] [--out rollout.json]

The worker is the plain ``RolloutWorker`` (no Ray, no learner: rollout alone), with the engine and
env of a real run; ``--in-flight k`` plays ``--groups`` groups (task seeds 0..groups-1, the same at
every k) with at most k at once, as the controller's admission would let start. Reported per k:
generated tokens per wall second, episodes per second, mean sequences per ``generate`` call, and
the ratio to k=1. At k=1 the worker plays one group at a time, as it did before the turn batcher
(its turns still overlap that group's env steps).
Timings on a shared 2-core machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--env", default="alfworld")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="vllm: run with .venv-vllm/bin/python")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--max-turns", type=int, default=None, help="cap on turns per episode (default: the env's)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from pipeline.core.runtime_env import set_process_env

    set_process_env()
    from actors.rollout import RolloutWorker
    from pipeline.core.config import EnvConfig
    from pipeline.core.hardware import CpuFeatures
    from pipeline.models import resolve_model
    from pipeline.tools.cli import compose

    base = compose([f"model={args.model}", f"env={args.env}", f"rollout={args.engine}"])
    rcfg = dataclasses.replace(
        base.rollout, max_new_tokens=args.max_new_tokens, group_size=args.group_size, precision=args.precision
    )
    env_cfg: EnvConfig = base.env
    model_dir = resolve_model(base.model.name)
    worker = RolloutWorker(rcfg, env_cfg, str(model_dir), chat_template=base.model.chat_template)
    info = worker.hardware()
    cpu = CpuFeatures.detect()
    out = {
        "model": args.model,
        "env": args.env,
        "engine": args.engine,
        "group_size": args.group_size,
        "groups": args.groups,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "precision": info["precision"],
        "threads": info["threads"],
        "cpu": {"capability": cpu.capability, "native_bf16": cpu.native_bf16},
        "runs": {},
    }

    def play(seed: int):
        return worker.run_group(
            task_seed=seed,
            split=env_cfg.train_split,
            group_size=args.group_size,
            temperature=args.temperature,
            sample_seed=1000 + seed,
            max_turns=args.max_turns,
        )

    play(10_000)  # warm-up (first generate, env caches)
    for k in args.in_flight:
        before = worker.batcher.stats.snapshot()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(k) as pool:
            groups = list(pool.map(play, range(args.groups)))
        wall = time.perf_counter() - t0
        tokens = sum(g.n_generated_tokens for g in groups)
        eps = [e for g in groups for e in g.episodes]
        run = {
            "seconds": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall,
            "episodes_per_s": len(eps) / wall,
            "turns": sum(len(e.turns) for e in eps),
            "success": sum(e.won for e in eps) / len(eps),
        }
        after = worker.batcher.stats.snapshot()
        calls = after["calls"] - before["calls"]
        run["generate_calls"] = calls
        run["sequences_per_call"] = (after["sequences"] - before["sequences"]) / max(calls, 1)
        run["generate_seconds_frac"] = (after["seconds"] - before["seconds"]) / wall
        out["runs"][str(k)] = run
        print(f"in flight {k}: {run['tokens_per_s']:.1f} tokens/s, {run['seconds']:.1f} s", file=sys.stderr, flush=True)
    first = out["runs"][str(args.in_flight[0])]["tokens_per_s"]
    out["ratio_to_first"] = {k: r["tokens_per_s"] / first for k, r in out["runs"].items()}
    worker.close()
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
