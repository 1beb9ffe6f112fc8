"""privy-rl vs TRL's GRPOTrainer doing the same work, measured in one invocation.

    make bench-trl ARGS="--steps 7 --out docs/results/vs_trl_<date>"
    .venv-bench/bin/python scripts/bench/vs_trl.py [--steps 7] [--precision fp32|bf16] [--lags 0 1]
        [--engines hf vllm] [--model smollm2_135m|tiny|PATH] [--prompts 8] [--generations 4]
        [--new-tokens 32] [--temperature 1.0] [--repeats 3] [--no-fused-optimizer] [--out DIR]
    # a check that it runs, in about 2 minutes:
    .venv-bench/bin/python scripts/bench/vs_trl.py --model tiny --steps 2 --prompts 2 --generations 2 \\
        --new-tokens 8 --lags 0 --repeats 1 --out /tmp/vs_trl_tiny

**The same work on both sides.** One privy-rl config (``workload_config``: ``env=keyword
method=grpo`` with the sizes above) is composed on both sides, and both read every setting from it:

- *prompts*: the first ``prompts x steps`` tasks of privy-rl's training task stream (task ``i`` =
  ``env.reset(task_seed(trainer.seed, i))``, as the controller plays them), as messages built by
  the env and rendered by the model's chat template. TRL gets the messages, ``prompts`` per step in
  that order, and renders them itself; the TRL side records the prompt ids TRL actually feeds to
  ``generate`` and stops if they differ from the ids of privy-rl's own prompt builder
  (``StudentPrompts``). Both sides report a SHA-256 of those ids (each in its own venv) and the
  script stops if they differ. At lag 0 privy-rl trains exactly these tasks, step by step as TRL;
  at lag >= 1 it plays the same stream, trained in the order groups complete;
- *sampling*: ``generations`` completions per prompt of at most ``new-tokens`` tokens,
  ``temperature``, top-p 1, no top-k, the same stop ids (checked: TRL's ``eos_token_ids`` against
  privy-rl's engine rule, EOS + the template's end-of-turn token);
- *reward*: the env's own reward of the decoded completion (``env.step``), on both sides;
- *update*: GRPO, one optimizer step per step over all ``prompts x generations`` completions, no
  reference model (TRL ``beta=0``, privy-rl ``learner.kl_coef=0``), clip 0.2 (TRL ``epsilon``,
  privy-rl ``clip_low/clip_high``), no entropy bonus (privy-rl ``learner.entropy_coef=0``; TRL has
  none), no gradient checkpointing (TRL's default is on: turned off, as privy-rl's learner), torch
  AdamW, fused on both sides (``--no-fused-optimizer``: the per-tensor loop on both), with
  privy-rl's lr, betas, eps 1e-8, weight decay, grad-norm clip and a constant lr (TRL's default
  schedule decays linearly: set to constant). TRL's loss aggregation stays its default
  (``dapo``), privy-rl's its own: the same tokens are scored either way;
- *precision*: chosen once by ``--precision``, the default being what both run natively on this
  CPU (``pipeline/core/hardware.py`` ``choose_precision("auto")``: bf16 only with avx512_bf16 or
  AMX, else fp32). TRL's bf16 is its ``bf16=True`` (autocast over fp32 weights; ``use_cpu=True``);
  privy-rl's is bf16 weights in the engine and the learner (fp32 master weights);
- *threads*: every core. Each side runs in its own subprocess, one after the other, so they never
  share the cores; privy-rl splits them between its actors at lag >= 1 (``actor_threads``).

**Rounds.** ``--repeats N`` (3) runs every side N times, interleaved (TRL, lag 0, lag 1, TRL, ...),
each in a fresh subprocess. A side's rates pool its rounds' measured steps; each privy-rl / TRL
ratio is taken within a round (the two runs nearest in time) and the table gives the mean over the
rounds with its 95% t interval, every round's value kept in ``results.json``.

**What is reported** (``results.json`` and ``results.md`` in ``--out``, with the exact command
line in ``command.txt``, the git commit, whether the tree was dirty, and the CPU kind: "avx512_bf16"
when ``/proc/cpuinfo`` lists it, else "AVX2 only", and lscpu's model name). Per side, over the
measured steps (every step after the first, which pays for JIT and caches):

- seconds per step: the median; the total;
- completions/s and response tokens/s: the completions, and the tokens they sampled, over the
  measured steps, divided by those steps' total seconds. A completion's tokens are counted the same
  way on both sides, from the ids each side sampled: up to and including the first stop token, or
  all ``new-tokens`` if none came;
- the mean completion length in tokens (and the mean reward, a sanity check);
- the privy-rl / TRL ratios, per completion and per response token.

**Which ratio is fair.** Completion lengths follow each side's own samples (different random
streams, and privy-rl's policy moves step by step), so two sides that do the same work per token
can differ per completion. The per-response-token ratio is the fair one; the per-completion ratio
is what a user sees. Neither normalises the prompt tokens, which are the same on both sides. A
forced-length mode (every completion exactly ``new-tokens`` long) is not offered: TRL has one
(``generation_kwargs={"min_new_tokens": N}``) but privy-rl's engines do not
(``actors/engines/hf.py``, ``vllm.py``), so it would not be the same work.

TRL runs without vLLM (there is none on CPU for it), generating with ``transformers``
``generate``. Each side runs in its own venv: TRL in the one this script is started from
(``.venv-bench``: TRL and what it pulls in, datasets, pandas, pyarrow), privy-rl in the project's
``.venv`` (``--privy-python``; ``--vllm-python`` for ``--engines vllm``): the same privy-rl run
measured 8.5 s per learner step under ``.venv-bench`` and 5.2 s under ``.venv`` on the same
machine (cause not identified), so each framework gets its own clean venv. Run it alone on the
machine: on a shared 2-core CPU the numbers vary severalfold.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from lab.bench import ROOT, Bench, add_out
from lab.trl_report import NOTES, cpu_kind, git_state, markdown, pool, round_ratios, summarize, table_rows

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which privy-rl's learner uses


@dataclass(frozen=True)
class Workload:
    """What both sides run; every field goes into privy-rl's config (``workload_config``), which both
    sides compose and read."""

    model: str = "smollm2_135m"
    steps: int = 7
    prompts: int = 8  # per optimizer step (privy-rl trainer.groups_per_step)
    generations: int = 4  # completions per prompt (privy-rl rollout.group_size, TRL num_generations)
    new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 1e-6
    precision: str = "fp32"  # resolved: fp32 | bf16
    seed: int = 0
    fused_optimizer: bool = True  # torch's fused AdamW on both sides (privy-rl's default, TRL's own)

    @property
    def completions_per_step(self) -> int:
        return self.prompts * self.generations


def workload_config(w: Workload, lag: int = 0, engine: str = "hf"):
    """privy-rl's config of the workload (the TRL side reads its settings from it too)."""
    from pipeline.tools.cli import compose

    model = (
        ["model=" + w.model]
        if w.model in ("smollm2_135m", "gemma3_270m", "tiny", "tiny_bytes")
        else ["model=hf_path", f"model.path={w.model}"]
    )
    return compose(
        [
            *model,
            "env=keyword",
            "method=grpo",
            f"rollout={engine}",
            f"trainer.total_steps={w.steps}",
            "trainer.val_every=0",
            "trainer.ckpt_every=0",
            "trainer.val_at_start=false",
            "trainer.final_val_splits=[]",
            "logger.progress=false",
            f"trainer.seed={w.seed}",
            f"rollout.group_size={w.generations}",
            f"trainer.groups_per_step={w.prompts}",
            f"rollout.max_new_tokens={w.new_tokens}",
            f"rollout.temperature={w.temperature}",
            "rollout.top_p=1.0",
            f"learner.lr={w.lr}",
            f"trainer.max_policy_lag={lag}",
            f"learner.precision={w.precision}",
            f"rollout.precision={w.precision}",
            "learner.kl_coef=0.0",
            "learner.entropy_coef=0.0",
            "learner.gradient_checkpointing=false",
            "learner.lr_schedule=constant",
            "learner.warmup_steps=0",
            "learner.mini_batches=1",
            f"learner.fused_optimizer={str(w.fused_optimizer).lower()}",
            "trainer.skip_zero_advantage_rows=false",
        ]
    )


def trl_optim(cfg) -> str:
    """TRL's name for the AdamW kernel privy-rl's learner runs (``learner.fused_optimizer``)."""
    return "adamw_torch_fused" if cfg.learner.fused_optimizer else "adamw_torch"


def model_path(cfg) -> str:
    from pipeline.models import resolve_model

    return str(resolve_model(cfg.model.path or cfg.model.name, cache_dir=cfg.model.cache_dir))


def training_prompts(cfg, n: int) -> list[dict]:
    """The first ``n`` tasks of privy-rl's training stream: ``{"task_seed", "messages", "ids"}``,
    built by privy-rl's own prompt builder (as its rollout worker builds them)."""
    from envs import make_env
    from pipeline.context.student_prompts import StudentPrompts
    from pipeline.models import load_tokenizer
    from pipeline.orchestration.controller import task_seed

    if cfg.method.get("name") != "grpo":
        raise SystemExit(f"method={cfg.method.get('name')}: the TRL side reproduces plain GRPO prompts only")
    builder = StudentPrompts(
        load_tokenizer(model_path(cfg), cfg.model.chat_template),
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        history_length=cfg.env.history_length,
    )
    out = []
    for i in range(n):
        seed = task_seed(cfg.trainer.seed, i)
        env = make_env(cfg.env.name, cfg.env.options, cfg.env.train_split)
        messages, ids, _, _ = builder.build(env, [], env.reset(seed), 0, view=None)
        out.append({"task_seed": seed, "messages": [m.as_dict() for m in messages], "ids": list(ids)})
    return out


def prompts_digest(ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def privy_stop_ids(path: str, tokenizer) -> list[int]:
    """The stop ids of privy-rl's HF engine (actors/engines/hf.py): EOS, the template's end-of-turn
    token and the model's generation_config EOS."""
    from transformers import GenerationConfig

    from pipeline.core.chat_templates import stop_token_ids

    ids = set(stop_token_ids(tokenizer))
    try:
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        gen_eos = None
    for src in (tokenizer.eos_token_id, gen_eos):
        if src is not None:
            ids.update(src if isinstance(src, (list, tuple)) else [src])
    return sorted(int(i) for i in ids)


# ----- the sides (each in its own subprocess) ---------------------------------------------------
def run_trl(w: Workload) -> dict:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs import make_env
    from pipeline.core.hardware import set_threads
    from pipeline.models import load_tokenizer

    threads = set_threads(os.cpu_count() or 1)
    cfg = workload_config(w)
    path = model_path(cfg)
    tasks = training_prompts(cfg, w.prompts * w.steps)
    data = Dataset.from_list([{"prompt": t["messages"], "task_seed": t["task_seed"]} for t in tasks])

    def reward(prompts, completions, task_seed, **_):
        out = []
        for seed, completion in zip(task_seed, completions):
            env = make_env(cfg.env.name, cfg.env.options, cfg.env.train_split)
            env.reset(seed)
            out.append(float(env.step(completion[-1]["content"]).reward))
        rewards.extend(out)
        return out

    step_s: list[float] = []
    per_step: list[dict] = []  # what each step generated
    fed: list[list[int]] = []  # the prompt ids TRL fed to generate, one per prompt (first of its group)
    rewards: list[float] = []

    class Recorded(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            t0 = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            # Tokens up to and including the first stop id (TRL cuts there itself), else all.
            per_step.append({"generate_s": time.perf_counter() - t0, "lengths": [len(c) for c in completion_ids]})
            fed.extend(list(map(int, p)) for p in prompt_ids[:: w.generations])
            return completion_ids, logprobs

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s.append(time.perf_counter() - self.t0)

    lr = cfg.learner
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=w.completions_per_step,
            num_generations=w.generations,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=w.new_tokens,
            temperature=w.temperature,
            top_p=1.0,
            top_k=0,
            min_p=None,
            repetition_penalty=1.0,
            beta=0.0,
            epsilon=lr.clip_low,
            epsilon_high=lr.clip_high,
            learning_rate=lr.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            optim=trl_optim(cfg),
            adam_beta1=lr.betas[0],
            adam_beta2=lr.betas[1],
            adam_epsilon=ADAM_EPS,
            weight_decay=lr.weight_decay,
            max_grad_norm=lr.grad_clip,
            gradient_checkpointing=False,
            bf16=w.precision == "bf16",
            fp16=False,
            use_cpu=True,
            max_steps=w.steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            dataloader_num_workers=0,
            seed=w.seed,
            shuffle_dataset=False,
            use_vllm=False,
        )
        tok = load_tokenizer(path, cfg.model.chat_template)
        trainer = Recorded(
            model=path, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok, callbacks=[Clock()]
        )
        want_stops = privy_stop_ids(path, tok)
        if sorted(trainer.eos_token_ids) != want_stops:
            raise SystemExit(f"stop ids differ: TRL {sorted(trainer.eos_token_ids)}, privy-rl {want_stops}")
        trainer.train()
    want = [t["ids"] for t in tasks]
    if fed != want:
        bad = next(i for i, (a, b) in enumerate(zip(fed, want)) if a != b) if len(fed) == len(want) else None
        raise SystemExit(
            f"TRL's prompt ids differ from privy-rl's ({len(fed)} vs {len(want)} prompts; "
            f"first difference at prompt {bad})"
        )
    return {
        "step_s": step_s,
        "completions": [len(s["lengths"]) for s in per_step],
        "response_tokens": [sum(s["lengths"]) for s in per_step],
        "generate_s": [s["generate_s"] for s in per_step],
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "threads": threads,
        "stop_ids": want_stops,
        "prompts_sha256": prompts_digest(fed),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }


def run_privy(w: Workload, lag: int, engine: str) -> dict:
    import torch
    import transformers

    from pipeline.models import load_tokenizer
    from pipeline.orchestration.resources import actor_threads
    from pipeline.orchestration.run import run_training

    cfg = workload_config(w, lag, engine)
    path = model_path(cfg)
    tasks = training_prompts(cfg, w.prompts * w.steps)
    with tempfile.TemporaryDirectory() as run_dir:
        history = run_training(cfg, run_dir)
    if len(history) != w.steps:
        raise SystemExit(f"privy-rl ran {len(history)} steps of {w.steps}")
    turns = [h["rollout/turns_per_episode"] for h in history]
    if any(t != 1 for t in turns):
        raise SystemExit(f"keyword episodes should be one turn each, got {turns}")
    n = w.completions_per_step
    return {
        "step_s": [h["time/step_s"] for h in history],
        "completions": [n] * len(history),
        # rollout/response_tokens: mean sampled ids per row, up to and including the stop id
        "response_tokens": [h["rollout/response_tokens"] * n for h in history],
        "reward_mean": statistics.fmean(h["rollout/reward"] for h in history),
        "wait_rollout_s": [h["time/wait_rollout_s"] for h in history],
        "train_s": [h["time/train_s"] for h in history],
        "sync_s": [h["time/sync_s"] for h in history],
        "threads": actor_threads(cfg),
        "stop_ids": privy_stop_ids(path, load_tokenizer(path, cfg.model.chat_template)),
        "prompts_sha256": prompts_digest([t["ids"] for t in tasks]),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="optimizer steps per side (the first is not counted)")
    ap.add_argument(
        "--precision",
        default=None,
        choices=["fp32", "bf16"],
        help="both sides (default: what this CPU runs natively, pipeline/core/hardware.py)",
    )
    ap.add_argument("--model", default="smollm2_135m", help="smollm2_135m | tiny | an HF model directory")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per optimizer step")
    ap.add_argument("--generations", type=int, default=4, help="completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="max new tokens per completion")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lags", type=int, nargs="+", default=[0, 1], help="privy-rl's trainer.max_policy_lag values")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of every side, interleaved; each ratio is paired within its round and the table gives "
        "their mean with its 95%% t interval (default 3)",
    )
    ap.add_argument(
        "--fused-optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch's fused AdamW on both sides (privy-rl learner.fused_optimizer, TRL optim=adamw_torch_fused)",
    )
    add_out(ap, help="a result folder: results.json, results.md, table.md, meta.json, command.txt")
    ap.add_argument(
        "--privy-python",
        default=str(ROOT / ".venv" / "bin" / "python"),
        help="the interpreter of privy-rl's side (default: the project's .venv)",
    )
    ap.add_argument(
        "--engines",
        nargs="+",
        default=["hf"],
        choices=["hf", "vllm"],
        help="privy-rl's rollout engines to measure (vllm runs in --vllm-python)",
    )
    ap.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="the interpreter of privy-rl's side with rollout=vllm (make setup-vllm)",
    )
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # internal: run one side here
    ap.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--lag", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="hf", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pipeline.core.hardware import choose_precision
    from pipeline.core.runtime_env import set_process_env

    set_process_env()
    if args.side:  # a child: one side, its raw measurements on stdout's last line
        w = Workload(**json.loads(args.workload))
        result = run_trl(w) if args.side == "trl" else run_privy(w, args.lag, args.engine)
        print("RESULT " + json.dumps(result))
        return
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is not counted)")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    choice = choose_precision(args.precision or "auto")
    if choice.warning:
        print(f"warning: {choice.warning}", file=sys.stderr)
    # Each flag names the Workload field it sets; the precision is the resolved one.
    flags = {f.name for f in fields(Workload)} & vars(args).keys()
    w = Workload(**{name: getattr(args, name) for name in flags} | {"precision": choice.dtype})
    bench = Bench.start(args.out)  # the code measured, read before it runs
    report = {
        "benchmark": "privy-rl vs TRL GRPOTrainer",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": bench.command,
        "git": git_state(),
        "cpu": cpu_kind(),
        "workload": asdict(w) | {"precision_reason": choice.reason, "precision_warning": choice.warning},
        "repeats": args.repeats,
        "sides": {},
        "ratios": {},
        "notes": NOTES,
    }
    sides = [("trl", 0, "")] + [("privy", lag, eng) for eng in args.engines for lag in args.lags]
    rounds: dict[str, list[dict]] = {}
    for k in range(args.repeats):  # interleaved, so that a drift of the machine touches every side
        for side, lag, engine in sides:
            name = "trl" if side == "trl" else f"privy_{engine}_lag{lag}"
            s = run_side(args, w, side, lag, engine, f"{name} (round {k + 1} of {args.repeats})")
            rounds.setdefault(name, []).append(s)
    report["rounds"] = rounds
    report["sides"] = {name: pool(rs) for name, rs in rounds.items()}
    trl = report["sides"]["trl"]
    for name, s in report["sides"].items():
        if s["prompts_sha256"] != trl["prompts_sha256"] or s["stop_ids"] != trl["stop_ids"]:
            raise SystemExit(
                f"{name} and TRL did not get the same prompts or stop ids: "
                f"{s['prompts_sha256']} {s['stop_ids']} vs {trl['prompts_sha256']} {trl['stop_ids']}"
            )
        if name != "trl":
            report["ratios"][name] = round_ratios(rounds[name], rounds["trl"])
    report["workload"] |= {
        "prompts_sha256": trl["prompts_sha256"],
        "stop_ids": trl["stop_ids"],
        "mean_prompt_tokens": _mean_prompt_tokens(w),
    }
    print(json.dumps(report, indent=1))
    bench.store(report, table_rows(report), report["workload"])
    if bench.out:
        (bench.out / "results.md").write_text(markdown(report))


def run_side(args, w: Workload, side: str, lag: int, engine: str, label: str) -> dict:
    """One side in a subprocess of its own venv; its summary (``summarize``)."""
    python = {"trl": sys.executable, "hf": args.privy_python, "vllm": args.vllm_python}[engine or side]
    if not Path(python).exists():
        raise SystemExit(f"{python} not found (privy-rl's side with rollout={engine}); see --help")
    cmd = [python, __file__, "--side", side, "--lag", str(lag), "--engine", engine or "hf"]
    cmd += ["--workload", json.dumps(asdict(w))]
    print(f"{label}: running ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{label} failed ({proc.returncode}): {proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    s = summarize(json.loads(lines[-1][len("RESULT ") :]))
    print(
        f"{label}: {s['step_s_median']:.2f} s/step, {s['completions_per_s']:.2f} completions/s, "
        f"{s['response_tokens_per_s']:.1f} response tokens/s, {s['mean_completion_tokens']:.1f} tokens per completion",
        file=sys.stderr,
        flush=True,
    )
    return s


def _mean_prompt_tokens(w: Workload) -> float:
    tasks = training_prompts(workload_config(w), w.prompts * w.steps)
    return statistics.fmean(len(t["ids"]) for t in tasks)


if __name__ == "__main__":
    main()
