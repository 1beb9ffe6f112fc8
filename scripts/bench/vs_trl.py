"""privy-rl vs TRL's GRPOTrainer on the same workload, measured in one invocation.

    make bench-trl ARGS="--steps 7"          # = .venv-bench/bin/python scripts/bench/vs_trl.py
    .venv-bench/bin/python scripts/bench/vs_trl.py [--steps 7] [--precision auto|fp32|bf16]
        [--lags 0 1] [--out vs_trl.json]

The workload, identical on both sides: SmolLM2-135M-Instruct; the keyword task's prompts
(chat-templated by the model's template); 8 prompts x 4 completions of at most 32 new tokens per
optimizer step, temperature 1.0, top-p 1; GRPO with no reference model (TRL ``beta=0``), lr 1e-6;
the reward is the keyword rubric (the fraction of its three criteria passed); the same precision
(``auto`` resolves as privy-rl's learner does, ``pipeline/core/hardware.py``) and the same torch
threads (all cores; privy-rl splits them between its actors at lag >= 1). Each side runs in its own
subprocess, one after the other, so they never share the cores. Reported: the median seconds per
optimizer step over the steps after the first (JIT, caches), completions per second (32 / that),
and privy-rl / TRL ratios of completions per second. TRL runs without vLLM (there is none on CPU
for it), generating with ``transformers`` ``generate``. Each side runs in its own venv: TRL in the
one this script is started from (``.venv-bench``, which has TRL and what it pulls in: datasets,
pandas, pyarrow), privy-rl in the project's ``.venv`` (``--privy-python`` to change): the
same privy-rl run measured 8.5 s per learner step under ``.venv-bench`` and 5.2 s under ``.venv`` on
the same machine (cause not identified), so each framework gets its own clean venv.

The CPU kind matters (bf16 is native only with avx512_bf16 or AMX): the JSON records it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPTS, GENERATIONS, NEW_TOKENS, LR = 8, 4, 32, 1e-6


def keyword_tasks(n: int) -> list[tuple[str, object]]:
    """(prompt text, env) for the first n training tasks of the keyword env (seeds 0..n-1 are
    what privy-rl's task stream uses too only by accident; both sides see one task per prompt)."""
    from envs import make_env

    out = []
    for seed in range(n):
        env = make_env("keyword", {}, "train")
        out.append((env.reset(seed).text, env))
    return out


def run_trl(steps: int, dtype: str) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pipeline.models import load_tokenizer, resolve_model

    path = str(resolve_model("smollm2_135m"))
    tasks = keyword_tasks(PROMPTS * steps)
    envs = {text: env for text, env in tasks}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text, _ in tasks])

    def reward(prompts, completions, **_):
        out = []
        for p, c in zip(prompts, completions):
            env = envs[p[-1]["content"]]
            criteria = env.judge(c[-1]["content"])
            out.append(sum(x.passed for x in criteria) / len(criteria))
        return out

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=PROMPTS * GENERATIONS, num_generations=GENERATIONS,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
            max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, beta=0.0,
            max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", bf16=dtype == "bf16",
            use_cpu=True, dataloader_num_workers=0, seed=0, shuffle_dataset=False, use_vllm=False)
        trainer = GRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=data,
                              processing_class=load_tokenizer(path), callbacks=[Clock()])
        trainer.train()
    return {"step_s": times}


def run_privy(steps: int, precision: str, lag: int, engine: str = "hf") -> dict:
    from pipeline.orchestration.run import run_training
    from pipeline.tools.cli import compose

    cfg = compose(["model=smollm2_135m", "env=keyword", f"rollout={engine}", f"trainer.total_steps={steps}", "trainer.val_every=0",
                   "trainer.ckpt_every=0", "logger.progress=false", f"rollout.group_size={GENERATIONS}",
                   f"trainer.groups_per_step={PROMPTS}", f"rollout.max_new_tokens={NEW_TOKENS}",
                   "rollout.temperature=1.0", "rollout.top_p=1.0", f"learner.lr={LR}", f"trainer.max_policy_lag={lag}",
                   f"learner.precision={precision}", f"rollout.precision={precision}"])
    with tempfile.TemporaryDirectory() as run_dir:
        history = run_training(cfg, run_dir)
    keys = ("time/step_s", "time/train_s", "time/wait_rollout_s", "time/sync_s", "rollout/tokens_per_s")
    return {k.split("/")[-1]: [h.get(k, 0.0) for h in history] for k in keys} | {"step_s": [h["time/step_s"]
                                                                                         for h in history]}


def summary(times: list[float]) -> dict:
    rest = times[1:] or times
    med = statistics.median(rest)
    return {"step_s_median": med, "step_s": times, "completions_per_s": PROMPTS * GENERATIONS / med}


def cpu_kind() -> dict:
    from pipeline.core.hardware import CpuFeatures

    cpu = CpuFeatures.detect()
    return {"capability": cpu.capability, "avx512_bf16": cpu.avx512_bf16, "amx": cpu.amx_bf16,
            "native_bf16": cpu.native_bf16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="optimizer steps per side (the first is not counted)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--lags", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default=None)
    ap.add_argument("--privy-python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="the interpreter of privy-rl's side (default: the project's .venv)")
    ap.add_argument("--engines", nargs="+", default=["hf"], choices=["hf", "vllm"],
                    help="privy-rl's rollout engines to measure (vllm runs in --vllm-python)")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"),
                    help="the interpreter of privy-rl's side with rollout=vllm (make setup-vllm)")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # internal: run one side here
    ap.add_argument("--lag", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="hf", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pipeline.core.hardware import choose_precision
    from pipeline.core.runtime_env import set_process_env

    set_process_env()
    dtype = choose_precision(args.precision).dtype
    if args.side:  # a child: one side, its raw timings on stdout's last line
        result = run_trl(args.steps, dtype) if args.side == "trl" else run_privy(args.steps, dtype, args.lag, args.engine)
        print("RESULT " + json.dumps(result))
        return
    out = {"workload": {"model": "smollm2_135m", "prompts": PROMPTS, "generations": GENERATIONS,
                        "max_new_tokens": NEW_TOKENS, "steps": args.steps, "precision": dtype,
                        "threads": os.cpu_count()}, "cpu": cpu_kind()}
    sides = [("trl", 0, "")] + [("privy", lag, eng) for eng in args.engines for lag in args.lags]
    for side, lag, engine in sides:
        python = {"trl": sys.executable, "hf": args.privy_python, "vllm": args.vllm_python}[engine or side]
        if not Path(python).exists():
            raise SystemExit(f"{python} not found (privy-rl's side with rollout={engine}); see --help")
        cmd = [python, __file__, "--side", side, "--lag", str(lag), "--steps", str(args.steps),
               "--precision", args.precision, "--engine", engine or "hf"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{side} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        raw = json.loads(lines[-1][len("RESULT "):])
        name = "trl" if side == "trl" else f"privy_{engine}_lag{lag}"
        out[name] = summary(raw["step_s"]) | {k: v for k, v in raw.items() if k != "step_s"}
        print(f"{name}: {out[name]['step_s_median']:.2f} s/step, {out[name]['completions_per_s']:.2f} completions/s",
              file=sys.stderr, flush=True)
    for engine in args.engines:
        for lag in args.lags:
            name = f"privy_{engine}_lag{lag}"
            out[f"ratio_{engine}_lag{lag}"] = out[name]["completions_per_s"] / out["trl"]["completions_per_s"]
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
