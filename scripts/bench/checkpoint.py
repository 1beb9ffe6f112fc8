"""What a stop's grace must cover: the learner's checkpoint, in seconds and bytes, by model size.

    python scripts/bench/checkpoint.py [--sizes 135m 360m] [--out DIR]

``trainer.stop_grace_s`` (SIGTERM, ``ray job stop``, a preemption) must leave room for a
checkpoint of the last completed step: the DeepSpeed state (weights, fp32 master weights, AdamW's
two moments) and the HF model. This builds a random model of SmolLM2-135M's or SmolLM2-360M's
shape (the seconds do not depend on the values), takes one learner step on 2 rows of 64 tokens
(AdamW's moments exist from the first step on), then times ``LearnerWorker.save_checkpoint`` twice
into a fresh directory and measures what it wrote. One size per subprocess (DeepSpeed's process
group is made once per process). Prints one JSON object; ``--out`` stores a result folder.
Run it alone: the save is disk and memory bound, and another load slows it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# SmolLM2's shapes (vocab 49,152, tied embeddings, head_dim 64) at two sizes.
SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, layers=30),
    "360m": dict(hidden_size=960, intermediate_size=2560, num_attention_heads=15, num_key_value_heads=5, layers=32),
}


def build(out: Path, size: str) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.models.tiny import byte_tokenizer

    shape = dict(SHAPES[size])
    tok = byte_tokenizer()
    config = LlamaConfig(
        num_hidden_layers=shape.pop("layers"),
        vocab_size=49152,
        head_dim=64,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
        **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def measure(size: str) -> dict:
    from actors.learner import LearnerWorker
    from actors.learner_setup import init_process_group_env
    from pipeline.core.config import LearnerConfig
    from pipeline.distributed.rendezvous import host_store
    from scripts.bench.gpu import _train_batch

    with tempfile.TemporaryDirectory(prefix="privy-bench-ckpt-") as d:
        params = build(Path(d) / "model", size)
        init_process_group_env(0, 1, "127.0.0.1", host_store(300))
        worker = LearnerWorker(LearnerConfig(lr=1e-6), str(Path(d) / "model"), temperature=1.0, total_steps=2)
        worker.setup()
        worker.train_step([_train_batch(2, 48, 16, 49152, seed=0)])
        saves = []
        for k in range(2):
            t0 = time.perf_counter()
            worker.save_checkpoint(str(Path(d) / f"ckpt{k}"))
            saves.append(time.perf_counter() - t0)
        nbytes = sum(f.stat().st_size for f in (Path(d) / "ckpt1").rglob("*") if f.is_file())
        return {
            "size": size,
            "parameters": params,
            "precision": worker.precision.dtype,
            "zero_stage": worker.cfg.zero_stage,
            "save_s": [round(s, 2) for s in saves],
            "checkpoint_bytes": nbytes,
            "bytes_per_parameter": round(nbytes / params, 1),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["135m", "360m"], choices=sorted(SHAPES))
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this size here
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    command = shlex.join([sys.executable, *sys.argv])
    from pipeline.tools.results import git_commit

    git = git_commit(ROOT)
    rows = []
    for size in args.sizes:
        print(f"checkpoint: {size} ...", file=sys.stderr, flush=True)
        res = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    report = {"command": command, "sizes": rows}
    print(json.dumps(report, indent=1))
    if args.out:
        from pipeline.tools.results import write_benchmark

        table = [
            {
                "model shape": f"SmolLM2-{r['size'].upper()}",
                "parameters": f"{r['parameters'] / 1e6:.0f}M",
                "learner precision": r["precision"],
                "save s (first, second)": ", ".join(f"{s:.1f}" for s in r["save_s"]),
                "checkpoint GB": f"{r['checkpoint_bytes'] / 1e9:.2f}",
                "bytes / parameter": f"{r['bytes_per_parameter']:.1f}",
            }
            for r in rows
        ]
        write_benchmark(Path(args.out), ROOT, report, table, git)
        print(f"wrote {args.out}/results.json, table.md, meta.json, command.txt", file=sys.stderr)


if __name__ == "__main__":
    main()
