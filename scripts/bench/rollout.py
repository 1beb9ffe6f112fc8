"""Rollout throughput: one rollout worker playing the same groups with 1, 2, 4, ... groups in flight.

    python scripts/bench/rollout.py                       # the default ALFWorld recipe (SmolLM2, G=4)
    python scripts/bench/rollout.py --model tiny --env keyword --group-size 8 --groups 16 \\
        --in-flight 1 2 4 8 16                           # the GPU-shaped workload, on CPU
    [--engine hf vllm vllm_continuous] [--max-turns N] [--max-new-tokens 48] [--temperature 0.7]
    [--precision auto] [--out DIR]

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

from lab.bench import Bench, add_out


def measure(args, engine: str) -> dict:
    """One engine: a worker of a real run, the same groups played at each ``--in-flight``."""
    from actors.rollout import RolloutWorker
    from pipeline.core.config import EnvConfig
    from pipeline.models import resolve_model
    from pipeline.tools.cli import compose

    # vllm_continuous: the vLLM engine's own request queue (actors/continuous_batcher.py)
    over = [
        f"rollout={engine.split('_')[0]}",
        *(["rollout.vllm.continuous=true"] if engine == "vllm_continuous" else []),
    ]
    base = compose([f"model={args.model}", f"env={args.env}", *over])
    rcfg = dataclasses.replace(
        base.rollout, max_new_tokens=args.max_new_tokens, group_size=args.group_size, precision=args.precision
    )
    env_cfg: EnvConfig = base.env
    worker = RolloutWorker(rcfg, env_cfg, str(resolve_model(base.model.name)), chat_template=base.model.chat_template)
    info = worker.hardware()
    out = {"precision": info["precision"], "threads": info["threads"], "runs": {}}

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
        after = worker.batcher.stats.snapshot()
        calls = after["calls"] - before["calls"]
        out["runs"][str(k)] = {
            "seconds": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall,
            "episodes_per_s": len(eps) / wall,
            "turns": sum(len(e.turns) for e in eps),
            "success": sum(e.won for e in eps) / len(eps),
            "generate_calls": calls,
            "sequences_per_call": (after["sequences"] - before["sequences"]) / max(calls, 1),
            "generate_seconds_frac": (after["seconds"] - before["seconds"]) / wall,
        }
        print(f"{engine}, in flight {k}: {tokens / wall:.1f} tokens/s, {wall:.1f} s", file=sys.stderr, flush=True)
    first = out["runs"][str(args.in_flight[0])]["tokens_per_s"]
    out["ratio_to_first"] = {k: r["tokens_per_s"] / first for k, r in out["runs"].items()}
    worker.close()
    return out


def table(report: dict) -> list[dict]:
    engines = report["engines"]
    hf = engines.get("hf")
    rows = []
    for name, res in engines.items():
        for k, r in res["runs"].items():
            row = {
                "engine": name,
                "groups in flight": k,
                "tokens / s": f"{r['tokens_per_s']:.1f}",
                "episodes / s": f"{r['episodes_per_s']:.2f}",
                # continuous: sequences in flight per engine step
                "sequences / generate call": f"{r['sequences_per_call']:.1f}",
                "vs 1 in flight": f"{res['ratio_to_first'][k]:.2f}x",
            }
            batched = engines.get("vllm")
            row["vs hf, same k"] = (
                f"{r['tokens_per_s'] / hf['runs'][k]['tokens_per_s']:.2f}x"
                if hf is not None and k in hf["runs"]
                else ""
            )
            row["vs vllm batcher, same k"] = (
                f"{r['tokens_per_s'] / batched['runs'][k]['tokens_per_s']:.2f}x"
                if name.startswith("vllm") and batched is not None and k in batched["runs"]
                else ""
            )
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--env", default="alfworld")
    ap.add_argument(
        "--engine",
        nargs="+",
        default=["hf"],
        choices=["hf", "vllm", "vllm_continuous"],
        help="vllm*: run with .venv-vllm/bin/python; vllm_continuous = rollout.vllm.continuous=true",
    )
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--max-turns", type=int, default=None, help="cap on turns per episode (default: the env's)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    add_out(ap)
    args = ap.parse_args()
    bench = Bench.start(args.out)  # the code the runs use, read before they start

    from pipeline.core.runtime_env import set_process_env

    set_process_env()
    from pipeline.core.hardware import CpuFeatures

    cpu = CpuFeatures.detect()
    report = {
        "command": bench.command,
        "model": args.model,
        "env": args.env,
        "group_size": args.group_size,
        "groups": args.groups,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "cpu": {"capability": cpu.capability, "native_bf16": cpu.native_bf16},
        "engines": {engine: measure(args, engine) for engine in args.engine},
    }
    print(json.dumps(report, indent=1))
    workload = [f"model={args.model}", f"env={args.env}", f"group_size={args.group_size}", f"groups={args.groups}"]
    bench.store(report, table(report), workload)


if __name__ == "__main__":
    main()
