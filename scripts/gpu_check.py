"""The Python side of scripts/gpu_check.sh: each subcommand is one phase's check (or its setup).

    python scripts/gpu_check.py versions
    python scripts/gpu_check.py ray --device cuda|cpu
    python scripts/gpu_check.py make-model --tok DIR --out DIR
    python scripts/gpu_check.py check-run RUN_DIR --steps N [--teacher] [--gpu]

Each prints what it found and, last, one ``DETAIL: ...`` line that the shell script puts in the
report beside the phase's PASS/FAIL; a failed check raises (exit 1) with what differed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def versions(_args) -> None:
    import importlib

    import torch

    print(f"python {sys.version.split()[0]} ({sys.executable})")
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, devices {torch.cuda.device_count()}")
    gpu = "no CUDA device"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = f"{p.name} {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}"
        print(f"device 0: {gpu}, bf16 {torch.cuda.is_bf16_supported()}, nccl {torch.cuda.nccl.version()}")
    found = {}
    for mod in ("ray", "deepspeed", "transformers", "hydra", "omegaconf", "vllm", "bm25s"):
        try:
            found[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except Exception as e:  # a missing optional part is reported, not fatal here
            found[mod] = f"missing ({type(e).__name__})"
    for k, v in found.items():
        print(f"{k} {v}")
    shm = shutil.disk_usage("/dev/shm").total / 2**30 if os.path.exists("/dev/shm") else 0.0
    print(f"/dev/shm {shm:.1f} GiB; cpus {os.cpu_count()}")
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        print(f"nvidia-smi: {out.stdout.strip()}")
    for mod in ("ray", "deepspeed", "transformers", "hydra"):  # the pipeline cannot run without them
        if found[mod].startswith("missing"):
            raise SystemExit(f"{mod} is {found[mod]}: the payload was not unpacked onto PYTHONPATH")
    print(
        f"DETAIL: torch {torch.__version__} (cuda {torch.version.cuda}), {gpu}; ray {found['ray']}, "
        f"deepspeed {found['deepspeed']}, transformers {found['transformers']}, vllm {found['vllm']}; "
        f"/dev/shm {shm:.0f} GiB"
    )


def ray_check(args) -> None:
    """Two actors with a quarter of the GPU each (a CPU half each with --device cpu) share the
    device and compute on it; a placement group with a fractional bundle is placed."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    gpu = args.device == "cuda"
    ray.init(num_cpus=4, num_gpus=1 if gpu else 0, include_dashboard=False, logging_level="ERROR")
    try:
        res = ray.cluster_resources()
        assert res.get("GPU", 0) == (1 if gpu else 0), res

        @ray.remote
        class Probe:
            def where(self):
                import torch

                dev = "cuda" if gpu else "cpu"
                x = torch.randn(256, 256, device=dev)
                return {
                    "gpu_ids": ray.get_runtime_context().get_accelerator_ids().get("GPU", []),
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "sum": float((x @ x).sum().cpu()),
                    "name": torch.cuda.get_device_name(0) if gpu else "cpu",
                }

        opts = {"num_gpus": 0.25, "num_cpus": 0.5} if gpu else {"num_cpus": 0.5}
        probes = [Probe.options(**opts).remote() for _ in range(2)]
        got = ray.get([p.where.remote() for p in probes], timeout=120)
        for g in got:
            assert math.isfinite(g["sum"]), g
        if gpu:
            assert got[0]["gpu_ids"] == got[1]["gpu_ids"] and len(got[0]["gpu_ids"]) == 1, got
        bundle = {"GPU": 0.5, "CPU": 1} if gpu else {"CPU": 1}
        pg = placement_group([bundle, dict(bundle)], strategy="PACK")
        assert pg.wait(timeout_seconds=60), "a fractional placement group was not placed"
        remove_placement_group(pg)
        print(json.dumps(got))
        print(
            f"DETAIL: 2 actors x {opts} on {got[0]['name']} (GPU ids {got[0]['gpu_ids']}); "
            f"PACK group of 2 x {bundle} placed"
        )
    finally:
        ray.shutdown()


def make_model(args) -> None:
    """A random model of the tokenizer's config (SmolLM2-135M's exact shape): systems checks need
    the shapes, not the weights; the real weights travel only for the learning phase."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(args.tok)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    for f in Path(args.tok).iterdir():  # the tokenizer and chat template, never weights
        if f.is_file() and f.name != "config.json" and f.suffix not in (".safetensors", ".bin", ".gguf"):
            shutil.copy2(f, out / f.name)
    n = sum(p.numel() for p in model.parameters())
    print(f"DETAIL: random {cfg.model_type} of {n / 1e6:.1f}M parameters ({cfg.num_hidden_layers} layers) in {out}")


def check_run(args) -> None:
    """What the CPU integration tests assert of a run, asserted of this one."""
    run = Path(args.run_dir)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, args.steps + 1)), f"steps {steps}, expected 1..{args.steps}"
    for r in rows:
        assert math.isfinite(r["learner/loss"]), f"step {r['step']}: loss {r['learner/loss']}"
        assert r["sync/version"] == r["step"], f"step {r['step']}: sync/version {r['sync/version']}"
        assert r["rollout/policy_lag_max"] == 0, f"step {r['step']}: policy lag {r['rollout/policy_lag_max']} at lag 0"
        if args.teacher:
            assert r["teacher/rows_scored_frac"] == 1.0, f"step {r['step']}: {r['teacher/rows_scored_frac']}"
    hw = json.loads((run / "hardware.json").read_text()) if (run / "hardware.json").exists() else {}
    if args.gpu:  # every actor chose its precision for a GPU (pipeline/core/hardware.py says where)
        reasons = {name: str(info.get("reason", "?")) for name, info in hw.items()}
        assert reasons and all("GPU" in r for r in reasons.values()), reasons
    tail = rows[1:] or rows  # the first step compiles and warms up
    mean = lambda k: sum(r.get(k, 0.0) for r in tail) / len(tail)  # noqa: E731
    print(
        f"DETAIL: {len(rows)} steps, {mean('time/step_s'):.2f} s/step after the first, learner "
        f"{mean('learner/tokens_per_s'):.0f} tok/s, rollout {mean('rollout/tokens_per_s'):.0f} tok/s, sync "
        f"{mean('time/sync_s'):.3f} s; loss finite, sync/version = step, lag 0"
        + (", every teacher row scored" if args.teacher else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("versions").set_defaults(fn=versions)
    p = sub.add_parser("ray")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.set_defaults(fn=ray_check)
    p = sub.add_parser("make-model")
    p.add_argument("--tok", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=make_model)
    p = sub.add_parser("check-run")
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--teacher", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.set_defaults(fn=check_run)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
