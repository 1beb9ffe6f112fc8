"""Rollout engine benchmark: HF transformers vs vLLM on the same prompts, weights and settings.

    .venv-vllm/bin/python scripts/bench/engines.py [--model smollm2_135m] [--precision auto|fp32|bf16]
                                                   [--batch 8 32] [--new-tokens 64] [--reps 3]

Prints one JSON object: per engine and batch size, generated tokens/s (median over ``--reps``
timed calls after one warm-up call), the seconds of one in-place weight reload, and the ratio
vllm/hf per batch size. Runs only where vLLM is installed (.venv-vllm on CPU: ``make setup-vllm``).
Timings on a shared 2-core machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
    args = ap.parse_args()

    from actors.engines.hf import HFEngine
    from actors.engines.vllm import VLLMEngine

    path = resolve_model(args.model)
    from pipeline.core.hardware import choose_precision

    dtype = choose_precision(args.precision).dtype
    result: dict = {"model": args.model, "dtype": dtype, "new_tokens": args.new_tokens}
    engines = {
        "hf": lambda: HFEngine.from_pretrained(path, dtype=dtype),
        "vllm": lambda: VLLMEngine(path, dtype=dtype, max_model_len=1024, kv_cache_gb=2),
    }
    for name, build in engines.items():
        t0 = time.perf_counter()
        engine = build()
        row = {"init_s": round(time.perf_counter() - t0, 2)}
        for b in args.batch:
            row[f"tok_per_s_b{b}"] = round(
                _throughput(engine, _prompts(engine.tokenizer, b), args.new_tokens, args.reps), 1
            )
        from pipeline.models import load_model

        sd = load_model(path, "float32").state_dict()
        row["reload_s"] = round(_reload_seconds(engine, sd), 3)
        result[name] = row
        del engine
    result["vllm_over_hf"] = {
        f"b{b}": round(result["vllm"][f"tok_per_s_b{b}"] / result["hf"][f"tok_per_s_b{b}"], 2) for b in args.batch
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
