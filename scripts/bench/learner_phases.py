"""Where the learner's resident memory peaks within a step: forward, backward or the optimizer step.

    python scripts/bench/learner_phases.py [--variant NAME=OVERRIDES ...] [--tasks 4] [--group 6]
        [--steps 2] [--out DIR] [overrides...]

The learner class alone (``LearnerWorker``, no Ray, one rank, DeepSpeed on gloo), in a process of
its own per variant, on jemalloc as the actors run (``cluster.allocator``), with ``make train``'s
model and learner settings (``+experiment=search_qa_warm_start``). Its rows are shaped like a
step of that recipe: the Search-QA expert's turns on train tasks ``0..tasks-1`` through the real
prompt builder and tokenizer, each prompt ``--group`` times (a group: the played reply and
``group - 1`` random replies of the same length, advantages of both signs). A thread reads the
process's resident size every 20 ms, labelled with the phase it is in: the forward (with the
loss), DeepSpeed's backward, its optimizer step. Per variant: the setup's peak, the resident size
after setup, each phase's peak over ``--steps`` steps, the step's seconds and the tensors the
engine holds. What the Ray actor adds (Ray's own threads and buffers, the object store's pages of
weight packets) is not here: ``step_cost.py`` measures the real learner actor.

Variants: ``NAME=OVERRIDES`` (space-separated Hydra overrides), each against the recipe as is,
which runs first as ``default``. Memory is not changed by other load on the cores; the seconds are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from actors.learner_memory import rss_peak_gb, status_gb
from lab.bench import ROOT, Bench, add_out

RECIPE = ["+experiment=search_qa_warm_start"]
VARIANTS = {
    "checkpointed": "learner.gradient_checkpointing=true",
    "checkpointed_head_chunk": "learner.gradient_checkpointing=true learner.head_chunk_tokens=256",
}
PHASES = ("forward", "backward", "optimizer_step")


def rss_gb() -> float:
    return status_gb("VmRSS") or 0.0  # Linux's /proc: this bench runs where the learner's memory is read


class PhaseSampler(threading.Thread):
    """The resident size every ``period`` s, kept as the peak of the phase it fell in."""

    def __init__(self, period: float = 0.02):
        super().__init__(daemon=True)
        self.period, self.phase, self.peaks = period, "idle", {}

    def read(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), rss_gb())

    def run(self) -> None:
        while True:
            self.read(self.phase)
            time.sleep(self.period)

    def wrap(self, fn, phase: str):
        def labelled(*args, **kwargs):
            before, self.phase = self.phase, phase
            self.read(phase)  # a phase shorter than the period still has its readings
            try:
                return fn(*args, **kwargs)
            finally:
                self.read(phase)
                self.phase = before

        return labelled


def step_rows(cfg, tokenizer, tasks: int, group: int):
    """A TrainBatch like one of the recipe's steps (see the module docstring), and its sizes."""
    import dataclasses

    import torch

    from pipeline.algorithm.shared_prefix import unique_tokens
    from pipeline.context.student_prompts import StudentPrompts
    from pipeline.core.types import Credit
    from pipeline.orchestration.batches import build_train_batch
    from pipeline.orchestration.warm_start import expert_rows

    prompts = StudentPrompts(
        tokenizer, max_prompt_tokens=cfg.rollout.max_prompt_tokens, history_length=cfg.env.history_length
    )
    played = expert_rows(cfg.env, prompts, tasks=tasks).rows
    g = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    rows = []
    for r in played:
        for k in range(group):
            reply = list(r.response_ids) if k == 0 else torch.randint(3, vocab, (r.n_response,), generator=g).tolist()
            rows.append(dataclasses.replace(r, response_ids=reply, behaviour_logprobs=[-2.0] * len(reply)))
    credit = Credit(advantages=[[(-1.0) ** i * 0.5] * r.n_response for i, r in enumerate(rows)])
    batch = build_train_batch(rows, credit, pad_id=tokenizer.pad_token_id, default_entropy_coef=0.001)
    seqs = [r.prompt_ids + r.response_ids for r in rows]
    sizes = {
        "rows": len(rows),
        "tokens": sum(map(len, seqs)),
        "unique_tokens": unique_tokens(seqs),
        "response_tokens": sum(r.n_response for r in rows),
    }
    return batch, sizes


def child(overrides: list[str], tasks: int, group: int, steps: int) -> dict:
    """One variant in this process (the parent starts it with the allocator's environment)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    one_rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for k, v in {**one_rank, "MASTER_PORT": str(29500 + os.getpid() % 2000)}.items():
        os.environ.setdefault(k, v)
    import torch

    from actors.learner import LearnerWorker
    from pipeline.models import load_tokenizer, resolve_model
    from pipeline.tools.cli import compose

    cfg = compose([*RECIPE, *overrides])
    threads = cfg.cluster.threads_per_actor
    torch.set_num_threads(int(threads) if threads else os.cpu_count() or 1)  # as the learner actor's
    model = str(resolve_model(cfg.model.path or cfg.model.name))
    batch, sizes = step_rows(cfg, load_tokenizer(model), tasks, group)
    sampler = PhaseSampler()

    class Labelled(LearnerWorker):
        @property
        def _forward(self):  # the loss's forward
            return sampler.wrap(super()._forward, "forward")

    worker = Labelled(cfg.learner, model, temperature=cfg.rollout.temperature, total_steps=steps)
    worker.setup()
    out = {"sizes": sizes, "setup_peak_gb": rss_peak_gb(), "after_setup_gb": rss_gb(), "steps": []}
    sampler.start()
    engine = worker.engine
    engine.backward = sampler.wrap(engine.backward, "backward")
    engine.step = sampler.wrap(engine.step, "optimizer_step")
    for _ in range(steps):
        sampler.peaks.clear()
        t0 = time.time()
        metrics = worker.train_step([batch])
        seconds = time.time() - t0
        time.sleep(0.05)  # the sampler's last reading of the step
        out["steps"].append({"seconds": seconds, **{p: sampler.peaks.get(p, 0.0) for p in PHASES}})
    out["peak_gb"] = rss_peak_gb()
    out["tensors_gb"] = {
        k.removeprefix("learner/memory/").removesuffix("_gb"): v[0] if isinstance(v, tuple) else v
        for k, v in metrics.items()
        if k.startswith("learner/memory/") and k.split("/")[-1].removesuffix("_gb") in TENSORS
    }
    return out


TENSORS = ("parameters", "gradients", "optimizer", "deepspeed")


def run_variant(name: str, overrides: list[str], args) -> dict:
    from pipeline.core.runtime_env import allocator_env

    cmd = [sys.executable, __file__, "--child", json.dumps(overrides)]
    cmd += ["--tasks", str(args.tasks), "--group", str(args.group), "--steps", str(args.steps)]
    env = {**os.environ, **allocator_env("jemalloc"), "PYTHONPATH": f"{ROOT}:{ROOT / 'scripts'}"}
    print(f"learner_phases: {name}: {' '.join(overrides) or '(the recipe as is)'}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"learner_phases: {name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {"overrides": overrides, **json.loads(lines[-1])}


def table(report: dict) -> list[dict]:
    rows = []
    for name, run in report["runs"].items():
        peak = {p: max(s[p] for s in run["steps"]) for p in PHASES}
        rows.append({
            "variant": name,
            "setup peak GB": round(run["setup_peak_gb"], 2),
            "after setup GB": round(run["after_setup_gb"], 2),
            **{f"{p.replace('_', ' ')} peak GB": round(v, 2) for p, v in peak.items()},
            "process peak GB": round(run["peak_gb"], 2),
            "step s": round(sum(s["seconds"] for s in run["steps"]) / len(run["steps"]), 1),
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", help="NAME=OVERRIDES (default: checkpointing; with a chunked head)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    add_out(ap)
    args, overrides = ap.parse_known_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child), args.tasks, args.group, args.steps)), flush=True)
        return
    bench = Bench.start(args.out)
    variants = dict(v.split("=", 1) for v in args.variant) if args.variant else VARIANTS
    runs = {"default": run_variant("default", overrides, args)}
    for name, more in variants.items():
        runs[name] = run_variant(name, [*overrides, *more.split()], args)
    report = {"command": bench.command, "recipe": RECIPE, "tasks": args.tasks, "group": args.group, "runs": runs}
    rows = table(report)
    print(json.dumps(report, indent=1))
    for r in rows:
        print(r, file=sys.stderr)
    bench.store(report, rows)


if __name__ == "__main__":
    main()
