"""The three compute parts of a run on one device: rollout generation, teacher scoring, a learner step.

    python scripts/bench/gpu.py [--device cuda] [--layers 30] [--batch 16 64 256] [--out DIR]

The model has SmolLM2-135M-Instruct's architecture (hidden 576, 30 layers, 9 heads / 3 KV heads,
vocab 49,152, tied embeddings) with random weights and a byte tokenizer: speed does not depend on
the weights, and the GPU machines reach no hub and cannot carry the 98 MB GGUF. Prompts are random
ids (``--prompt-len``), so no row stops early on EOS.

Prints one JSON object (and writes ``gpu_bench.json`` to ``--out``):
- ``generate``: HFEngine (the rollout worker's engine) at ``rollout.precision=auto``, per batch
  size the generated tokens/s and the completions/s (sequences sampled per second; each is up to
  ``--new-tokens`` long), medians of ``--reps`` timed calls after a warm-up;
- ``score``: TeacherScorerWorker at precision auto, scored response tokens/s over
  ``--score-rows`` rows;
- ``learn``: one LearnerWorker (DeepSpeed ZeRO-``--zero``, NCCL on a GPU / gloo on a CPU, world size
  1, precision auto = bf16 with fp32 master weights where native) over ``--learn-rows`` rows, the
  median step's seconds (the first step is not counted), its rates: ``tokens_per_s`` (prompt +
  response tokens, what the forward and backward process), ``response_tokens_per_s`` (the response
  tokens only, those a rollout engine samples) and ``rows_per_s``; peak device memory, and the
  seconds of ``state_dict_for_sync`` (the object-store route's copy of the weights to host memory);
- ``ratios``, the learner against the engine at the largest ``--batch`` (``vs_generate_batch``),
  from the rounded rates above (above 1: the engine starves the learner):
  ``learner_rows_per_sampled_completion`` = learner rows/s / engine completions/s (a row is a
  prompt plus one sampled completion: how many completions the learner trains on per completion
  sampled); ``learner_response_tokens_per_generated_token`` = learner response tokens/s / engine
  generated tokens/s. The two agree when every completion runs ``--new-tokens`` tokens (random
  prompts: an early EOS is rare). The learner's prompt + response ``tokens_per_s`` is not compared
  with generated tokens: it would overstate the learner by (prompt + response) / response, 3x at
  the defaults.
Run it alone on the machine; on a shared 2-core CPU the numbers vary by up to 4x (NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab.bench import add_out
from lab.random_model import SMOLLM2_VOCAB, build_random_smollm2, one_rank_learner, random_train_batch


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_generate(path: Path, device: str, batches: list[int], prompt_len: int, new_tokens: int, reps: int) -> dict:
    import torch

    from actors.engines.hf import HFEngine
    from pipeline.core.hardware import choose_precision

    precision = choose_precision("auto", device).dtype
    engine = HFEngine.from_pretrained(path, dtype=precision, device=device)
    out = {
        "precision": precision,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "tokens_per_s": {},
        "completions_per_s": {},
    }
    for b in batches:
        prompts = _prompts(b, prompt_len, SMOLLM2_VOCAB, seed=b)
        engine.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=0)  # warm-up
        rates, calls = [], []
        for r in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            gens = engine.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=r + 1)
            _sync(device)
            sec = time.perf_counter() - t0
            rates.append(sum(g.n_tokens for g in gens) / sec)
            calls.append(b / sec)
        out["tokens_per_s"][str(b)] = round(statistics.median(rates), 1)
        out["completions_per_s"][str(b)] = round(statistics.median(calls), 2)
    del engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def bench_score(path: Path, device: str, rows: int, prompt_len: int, response_len: int, reps: int) -> dict:
    from actors.scorer import TeacherScorerWorker
    from pipeline.core.types import TeacherNeeds

    scorer = TeacherScorerWorker(str(path), temperature=1.0, micro_batch_tokens=16384, precision="auto", device=device)
    vocab = SMOLLM2_VOCAB
    items = list(zip(_prompts(rows, prompt_len, vocab, 1), _prompts(rows, response_len, vocab, 2)))
    needs = TeacherNeeds()  # the log-prob of each sampled token: what every teacher method needs
    scorer.score(items, [], needs)  # warm-up
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        scorer.score(items, [], needs)
        _sync(device)
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    return {
        "precision": scorer.precision.dtype,
        "rows": rows,
        "seconds": round(sec, 4),
        "response_tokens_per_s": round(rows * response_len / sec, 1),
    }


def bench_learn(
    path: Path,
    device: str,
    rows: int,
    prompt_len: int,
    response_len: int,
    steps: int,
    zero: int,
    micro_batch_tokens: int,
) -> dict:
    import torch

    from pipeline.core.config import LearnerConfig

    cfg = LearnerConfig(zero_stage=zero, precision="auto", lr=1e-6, micro_batch_tokens=micro_batch_tokens)
    worker, setup = one_rank_learner(path, cfg, total_steps=steps + 1)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for k in range(steps + 1):
        batch = random_train_batch(rows, prompt_len, response_len, SMOLLM2_VOCAB, seed=k)
        _sync(device)
        t0 = time.perf_counter()
        metrics = worker.train_step([batch])
        _sync(device)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    worker.state_dict_for_sync()
    sync_s = time.perf_counter() - t0
    sec = statistics.median(times[1:])
    out = {
        "precision": worker.precision.dtype,
        "zero_stage": zero,
        "rows": rows,
        "tokens_per_step": rows * (prompt_len + response_len),
        "micro_batch_tokens": micro_batch_tokens,
        "setup_s": round(setup["learner/setup_seconds"], 2),
        "first_step_s": round(times[0], 3),
        "step_s": round(sec, 3),
        "tokens_per_s": round(rows * (prompt_len + response_len) / sec, 1),
        "response_tokens_per_s": round(rows * response_len / sec, 1),
        "rows_per_s": round(rows / sec, 2),
        "loss_finite": bool(torch.isfinite(torch.tensor(metrics["learner/loss"][0]))),
        "state_dict_for_sync_s": round(sync_s, 3),
    }
    if device.startswith("cuda"):
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    torch.distributed.destroy_process_group()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2-135M has 30")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64, 256], help="generation batch sizes")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--score-rows", type=int, default=64)
    ap.add_argument("--learn-rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed learner steps (after one untimed)")
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    add_out(ap, help="a folder for gpu_bench.json")
    args = ap.parse_args()
    # DeepSpeed reads its accelerator when first imported: before anything imports it.
    os.environ["DS_ACCELERATOR"] = args.device
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu.py: --device cuda, but torch sees no CUDA device")
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "layers": args.layers,
    }
    with tempfile.TemporaryDirectory(prefix="privy_gpu_bench_") as tmp:
        path = Path(tmp) / "model"
        build_random_smollm2(path, layers=args.layers)
        result["generate"] = bench_generate(path, args.device, args.batch, args.prompt_len, args.new_tokens, args.reps)
        result["score"] = bench_score(path, args.device, args.score_rows, args.prompt_len, args.new_tokens, args.reps)
        result["learn"] = bench_learn(
            path,
            args.device,
            args.learn_rows,
            args.prompt_len,
            args.new_tokens,
            args.steps,
            args.zero,
            args.micro_batch_tokens,
        )
    gen, learn, top = result["generate"], result["learn"], str(max(args.batch))
    result["ratios"] = {
        "vs_generate_batch": int(top),
        "learner_rows_per_sampled_completion": round(learn["rows_per_s"] / gen["completions_per_s"][top], 2),
        "learner_response_tokens_per_generated_token": round(
            learn["response_tokens_per_s"] / gen["tokens_per_s"][top], 2
        ),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_bench.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
