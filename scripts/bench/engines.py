"""Rollout engine benchmark: HF transformers vs vLLM on the same prompts, weights and settings.

    .venv-vllm/bin/python scripts/bench/engines.py [--model smollm2_135m] [--precision auto|fp32|bf16]
                                                   [--batch 8 32] [--new-tokens 64] [--reps 3]

Prints one JSON object: per engine and batch size, generated tokens/s (median over ``--reps``
timed calls after one warm-up call); scored response tokens/s of ``score`` (the teacher's
forward on the engine, ``scorer.placement=engine``, at temperature 1) on the same sampled rows
for both engines, and the log-prob gap between the two; the seconds of one in-place weight
reload; and the ratios vllm/hf. ``--out DIR`` stores a result folder.
Runs only where vLLM is installed (.venv-vllm on CPU: ``make setup-vllm``).
Timings on a shared 2-core machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from lab.bench import Bench, add_out
from pipeline.models import resolve_model


def _prompts(tok, n: int) -> list[list[int]]:
    tasks = [
        "Put a clean mug on the coffee table.",
        "Find two apples and put them in the fridge.",
        "Heat a potato and put it on the counter.",
        "Look at the book under the desk lamp.",
    ]
    out = []
    for i in range(n):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": tasks[i % len(tasks)]}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if not isinstance(ids, list) else ids))
    return out


def _throughput(engine, prompts, new_tokens: int, reps: int) -> float:
    engine.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=0)  # warm-up
    rates = []
    for r in range(reps):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=r + 1)
        rates.append(sum(g.n_tokens for g in gens) / (time.perf_counter() - t0))
    return statistics.median(rates)


def _scoring(engine, items, reps: int) -> tuple[float, list[list[float]]]:
    """Scored response tokens/s of ``engine.score`` (the teacher's forward on the engine,
    ``scorer.placement=engine``) at temperature 1, and the log-probs of the last call."""
    engine.score(items, temperature=1.0, micro_batch_tokens=None)  # warm-up
    rates, lps = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        lps = engine.score(items, temperature=1.0, micro_batch_tokens=None)
        rates.append(sum(len(r) for _, r in items) / (time.perf_counter() - t0))
    return statistics.median(rates), lps


def _reload_seconds(engine, state_dict) -> float:
    t0 = time.perf_counter()
    engine.load_state_dict(state_dict, version=engine.version + 1)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--precision", default="auto", help="auto = bf16 where the CPU runs it natively, else fp32")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    add_out(ap)
    args = ap.parse_args()
    bench = Bench.start(args.out)  # the code measured, read before it runs

    from actors.engines.hf import HFEngine
    from actors.engines.vllm import VLLMEngine
    from pipeline.core.hardware import choose_precision
    from pipeline.models import load_model

    path = resolve_model(args.model)
    dtype = choose_precision(args.precision).dtype
    result: dict = {"command": bench.command, "model": args.model, "dtype": dtype, "new_tokens": args.new_tokens}
    engines = {
        "hf": lambda: HFEngine.from_pretrained(path, dtype=dtype),
        "vllm": lambda: VLLMEngine(path, dtype=dtype, max_model_len=1024, kv_cache_gb=2),
    }
    scored: dict[str, list[list[float]]] = {}
    items: list = []
    for name, build in engines.items():
        t0 = time.perf_counter()
        engine = build()
        row = {"init_s": round(time.perf_counter() - t0, 2)}
        for b in args.batch:
            row[f"tok_per_s_b{b}"] = round(
                _throughput(engine, _prompts(engine.tokenizer, b), args.new_tokens, args.reps), 1
            )
        if not items:  # the same (prompt, response) pairs for both engines: sampled by the first
            b = max(args.batch)
            prompts = _prompts(engine.tokenizer, b)
            gens = engine.generate(prompts, max_new_tokens=args.new_tokens, temperature=1.0, seed=99)
            items = [(p, g.token_ids) for p, g in zip(prompts, gens)]
        rate, scored[name] = _scoring(engine, items, args.reps)
        row[f"score_tok_per_s_b{len(items)}"] = round(rate, 1)
        sd = load_model(path, "float32").state_dict()
        row["reload_s"] = round(_reload_seconds(engine, sd), 3)
        result[name] = row
        del engine
    result["vllm_over_hf"] = {
        f"b{b}": round(result["vllm"][f"tok_per_s_b{b}"] / result["hf"][f"tok_per_s_b{b}"], 2) for b in args.batch
    }
    key = f"score_tok_per_s_b{len(items)}"
    result["vllm_over_hf"]["score"] = round(result["vllm"][key] / result["hf"][key], 2)
    gaps = [abs(a - b) for x, y in zip(scored["hf"], scored["vllm"]) for a, b in zip(x, y)]
    result["score_gap_hf_vllm"] = {"mean": statistics.fmean(gaps), "max": max(gaps), "tokens": len(gaps)}
    print(json.dumps(result, indent=1))
    big = f"tok_per_s_b{max(args.batch)}"
    rows = [
        {
            "engine": name,
            "precision": dtype,
            **{f"generate tokens/s, batch {b}": result[name][f"tok_per_s_b{b}"] for b in args.batch},
            f"score tokens/s, {len(items)} rows": result[name][key],
            "weight reload s": result[name]["reload_s"],
            "start s": result[name]["init_s"],
            "vs hf, largest batch": f"{result[name][big] / result['hf'][big]:.2f}x",
            "vs hf, score": f"{result[name][key] / result['hf'][key]:.2f}x",
        }
        for name in engines
    ]
    workload = [f"model={args.model}", f"new_tokens={args.new_tokens}", f"batch={args.batch}", f"reps={args.reps}"]
    bench.store(result, rows, workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
