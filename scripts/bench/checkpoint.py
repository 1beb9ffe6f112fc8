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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.bench import Bench, add_out
from lab.random_model import SMOLLM2_SIZES, SMOLLM2_VOCAB, build_random_smollm2, one_rank_learner, random_train_batch


def measure(size: str) -> dict:
    from pipeline.core.config import LearnerConfig

    with tempfile.TemporaryDirectory(prefix="privy-bench-ckpt-") as d:
        params = build_random_smollm2(Path(d) / "model", size)
        worker, _ = one_rank_learner(Path(d) / "model", LearnerConfig(lr=1e-6), total_steps=2)
        worker.train_step([random_train_batch(2, 48, 16, SMOLLM2_VOCAB, seed=0)])
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
    ap.add_argument("--sizes", nargs="+", default=["135m", "360m"], choices=sorted(SMOLLM2_SIZES))
    add_out(ap)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this size here
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    bench = Bench.start(args.out)
    rows = []
    for size in args.sizes:
        print(f"checkpoint: {size} ...", file=sys.stderr, flush=True)
        res = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    report = {"command": bench.command, "sizes": rows}
    print(json.dumps(report, indent=1))
    bench.store(
        report,
        [
            {
                "model shape": f"SmolLM2-{r['size'].upper()}",
                "parameters": f"{r['parameters'] / 1e6:.0f}M",
                "learner precision": r["precision"],
                "save s (first, second)": ", ".join(f"{s:.1f}" for s in r["save_s"]),
                "checkpoint GB": f"{r['checkpoint_bytes'] / 1e9:.2f}",
                "bytes / parameter": f"{r['bytes_per_parameter']:.1f}",
            }
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
