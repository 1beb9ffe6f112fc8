"""Which method learns the task: methods x seeds from one warm start, at equal steps and rollouts,
judged on the test split, read once at the end of each run.

    python scripts/bench/learning.py --preset keyword_hints_cpu [--methods grpo hint_distill ...]
        [--seeds 0 1 2 3 4 5] [--repeat-seeds 0] [--out runs/learning/NAME]
        [--results docs/results/NAME] [--parallel N [--time-budget-s S]] [extra hydra overrides...]

Every point is a full training run (``scripts/train.py``, one process each, one after another, or
``--parallel N`` at once) into ``OUT/<method>_s<seed>`` (``_r2``: the same seed run again,
``--repeat-seeds``, to measure how far two runs of one seed differ: threads, bf16 kernels and
asynchrony); a point with a ``summary.json`` is skipped on a rerun, so a comparison that died
resumes where it stopped. A finished point's checkpoints are deleted (``--keep-checkpoints`` keeps
them). All points share the preset's overrides, hence the warm start (built once, cached), the
rollout budget and the validation (``valid``: selects; its curve is logged) and test
(``trainer.final_val_splits``, evaluated once after the last step, per-task outcomes saved) tasks.
A preset with ``start`` also evaluates the starting model itself without training
(``start_s<seed>``: the clone's test success).

``--parallel N`` runs up to N points at once on one Ray cluster this script starts (this machine's
CPUs and GPUs): each point joins it (``cluster.address``) and asks for what its overrides name, so
that fractional GPUs (``learner.num_gpus=0.03`` ...) let one GPU hold many small runs side by side;
its actors get the cores / N threads (``cluster.threads_per_actor``, unless given) and its output
goes to ``OUT/<point>/train.log``. SIGTERM or Ctrl-C to this script reaches every running point
once: each saves a checkpoint and stops, and the shared cluster ends only after them
(``lab/children.py``); a rerun resumes them. The starting model runs first, alone (it builds the
warm start every point reads). ``--time-budget-s S`` bounds the whole comparison: the trained
points all start at once after the start (``--parallel`` must hold them all) and each trains until
``trainer.time_limit_s`` = what is left of S minus ``--reserve-s`` (for its last step, validation
and test), so every method gets the same wall time; the table's ``steps`` column says how many
steps each reached.

The tables (``lab.results.learning_tables``): per method the test success over seeds
with its 95% t interval, the seed-paired difference to GRPO (and to the start) with its paired-t
interval, p-value and a bootstrap interval over test tasks, the seeds ahead/tied/behind, the
validation curve's start and end, and the teacher's diagnostics beside the noise floor (the
teacher's log-prob gap and the same teacher's gap with empty context). ``--results DIR`` stores
the runs' small files (packed into ``DIR/runs.tar.xz`` with any runs stored there before), the
tables and ``meta.json`` (command, commit, machine) as a result folder of docs/results
(``scripts/results.py`` rebuilds and checks the docs' tables from it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.bench import ROOT, Bench
from lab.children import Children
from lab.results import START, TEST_SPLIT, learning_tables, load_run, pack_runs, store_run, write_meta, write_tables

# the points' processes: a stop signal to this script reaches each running point once, and the
# shared cluster of --parallel ends only after they have saved their checkpoints
CHILDREN = Children()


def _from_clone(env: str, methods: tuple[str, ...] = ("grpo",), **more) -> dict:
    """A preset of ``conf/experiment/<env>_warm_start.yaml`` as it is, the clone itself evaluated
    beside the trained points (``start``)."""
    overrides = [f"+experiment={env}_warm_start", "trainer.ckpt_every=0", "logger.progress=false"]
    return {"methods": list(methods), "start": True, "overrides": overrides, **more}


PRESETS = {
    # ALFWorld, SmolLM2 from its expert warm start (conf/experiment/alfworld_warm_start.yaml): 10
    # steps, validation before the first step and every 5 on 32 valid_seen tasks, valid_unseen
    # (ALFWorld's held-out floor plans: its final_val_splits) once at the end; about 1 h 25 min a
    # point on 2 cores (not run as a whole preset).
    "alfworld_cpu": _from_clone("alfworld", ("grpo", "gigpo", "sdar_hints"), split="valid_unseen"),
    # Search-QA from its expert warm start (conf/experiment/search_qa_warm_start.yaml, what `make
    # train` runs: 16 steps, 64 valid questions every 4 steps, 64 test questions at the end): GRPO
    # at every seed, beside the clone itself evaluated without training (start).
    "search_qa_cpu": _from_clone("search_qa"),
    # code_edit and WebShop from their clones (conf/experiment/code_edit_warm_start.yaml,
    # webshop_warm_start.yaml): `--start-only` evaluates the clone itself on valid and test.
    "code_edit_cpu": _from_clone("code_edit"),
    "webshop_cpu": _from_clone("webshop"),
    # The same, from a clone that also played each question as the expert told the answer (the
    # hint in its system message, warm_start.hint_placement=system: it answers at once), so that
    # the self-teachers (sdar_hints, hint_distill) act on the hint they are given; 8 steps,
    # validations at 0, 4 and 8.
    "search_qa_hints_cpu": {
        "methods": ["grpo", "sdar_hints", "hint_distill"],
        "overrides": [
            "+experiment=search_qa_warm_start",
            "warm_start.hint_placement=system",
            "trainer.total_steps=8",
            "trainer.ckpt_every=0",
            "logger.progress=false",
        ],
    },
    # The keyword task from its fp32 clone (conf/experiment/keyword_warm_start.yaml: hint_format=false,
    # 10 steps of 2 x 8, validation sampled at T=1 on 64 held-out tasks every 2 steps). Every
    # teacher method has privileged text that names the hidden format: the skill bank (sdar, adrs,
    # retire_opd), the hint (sdar_hints), the failed criteria's feedback (targeted_guidance). ADRS's
    # shaping window and RetireOPD's phase 1 and retirement window are fitted to 10 steps.
    "keyword_cpu": {
        "methods": ["grpo", "gigpo", "sdar", "sdar_hints", "adrs", "retire_opd", "targeted_guidance"],
        "start": True,
        "overrides": ["+experiment=keyword_warm_start", "logger.progress=false"],
        "method_overrides": {
            "adrs": ["method.warmup_steps=0", "method.active_steps=10"],
            "retire_opd": ["method.phase1_steps=10", "method.window=2"],
        },
    },
    # The same task from a clone that also played each task with the hint in its system message
    # (warm_start.hint_placement=system), so that the policy reads the hint: GRPO against two
    # self-teachers told the graded answer block, SDAR's gated surrogate (lam 0.01) and
    # hint_distill's exact reverse KL (lam 0.1), and the two controls at hint_distill's lam: the null
    # baseline (a fixed negative advantage, no teacher) and the equal-information baseline (NLL on the
    # hinted expert's reply, the hint itself shown). One clone epoch: with 2 epochs the clone
    # started at 0.94 without the hint, no room to learn. The start is the clone, untrained.
    "keyword_hints_cpu": {
        "methods": ["grpo", "sdar_hints", "hint_distill", "null_baseline", "hint_imitation"],
        "start": True,
        "overrides": [
            "+experiment=keyword_warm_start",
            "warm_start.hint_placement=system",
            "warm_start.epochs=1",
            "logger.progress=false",
        ],
        "method_overrides": {"null_baseline": ["method.lam=0.1"], "hint_imitation": ["method.lam=0.1"]},
    },
    # The seed papers' four methods on held-out Search-QA (issue 42), each in its paper's form with
    # its paper's privileged context, beside GRPO and the two controls, all from `make train`'s
    # recipe (conf/experiment/search_qa_warm_start.yaml: the same clone, 16 steps of 4 x 4, lr 1e-5,
    # the same task stream per seed, 64 valid questions every 4 steps, the 64 test questions once):
    # - sdar: SDAR's gate (beta 5, lam 0.01: the released scripts) towards the policy given the
    #   skills retrieved from envs/skill_banks/search_qa.json (keyword mode, 6 general skills, raw
    #   prefix: conf/method/sdar.yaml); skills, not hints;
    # - targeted_guidance: reward from Search-QA's criteria (answered, searched, exact_match,
    #   valid_actions) plus success; the exact reverse KL (lam 0.1) to the policy given the failed
    #   criteria's feedback (envs/search_qa/env.py FEEDBACK) on the failed turns only;
    # - retire_opd: phase 1 trains the skill teacher (skill_grpo), then phase 2 the OPD term (lam
    #   0.01) from it with adaptive retirement, one command. Mapped to the budget before any run:
    #   phase1_steps = 16, the student's own budget, as the paper's 150 teacher steps are its 150
    #   student steps; window = 4 = the recipe's val_every (the windows close on the validations
    #   every method has), so retirement can be judged at steps 8, 12 and 16 (the paper's W = 5 of
    #   150 steps would be less than one step here);
    # - adrs: the L2 shaping (eta 0.02) with its TVA gate from the skills self-teacher. Its paper
    #   schedule, off for steps <= 20 and on for 21-70 of 150 (13% warm-up, 33% on), would never act
    #   in 16 steps: mapped to the same fractions before any run, off for steps 1-2, on for 3-7
    #   (warmup_steps 2, active_steps 5), off after;
    # - null_baseline at lam 0.1, targeted guidance's lam (the largest teacher term here), and
    #   skill_grpo, the equal-information control of these teachers: the same retrieved skills in
    #   the student's own prompts (training, validation and test), "be shown it" beside "distil
    #   it". The skills teachers (sdar, retire_opd, adrs) are told exactly that; the retrieved skills
    #   and mistakes also say what targeted guidance's feedback strings say (one action per reply,
    #   search before answering, the bare span; the turn budget for multi-hop questions only), and
    #   no control shows a feedback string alone. hint_imitation (the hinted expert's episodes) is
    #   not it: it shows the gold answer, which no teacher here is told.
    # Checkpoints every 4 steps and trainer.resume=auto: a point cut short continues from its last
    # checkpoint on a rerun (finished points are skipped). One point at a time on 2 cores: GRPO's
    # seed 0 took 37 min; a teacher point more (its scorer's forwards, the privileged replays at
    # steps 0 and 16), retire_opd two phases. Two GRPO-like points side by side held 12.6 GB of the
    # machine at most (docs/results/parallel_points); whether that is faster is not measured.
    "search_qa_methods": {
        "methods": ["grpo", "sdar", "targeted_guidance", "retire_opd", "adrs", "null_baseline", "skill_grpo"],
        "start": True,
        "overrides": [
            "+experiment=search_qa_warm_start",
            "trainer.ckpt_every=4",
            "trainer.resume=auto",
            "logger.progress=false",
            # the privilege gap at steps 0 and 16 (a teacher's replay of valid took over 3.5x the
            # plain play: at every validation a teacher point would not fit a session)
            "trainer.privileged_val=ends",
        ],
        "method_overrides": {
            "retire_opd": ["method.phase1_steps=16", "method.window=4"],
            "adrs": ["method.warmup_steps=2", "method.active_steps=5"],
            "null_baseline": ["method.lam=0.1"],
        },
    },
    # make train's recipe in the chat prompt format (issue 41): GRPO from a clone made in that
    # format, each turn appended to one conversation, a group's conversations in one shared forward
    # (learner.shared_tokens=4096). make train may switch to it only if its test success over 3
    # seeds is not below the template's: its pairs are search_qa_methods' GRPO points (the same
    # seeds, task stream, test questions and step budget).
    "search_qa_chat": {
        "methods": ["grpo"],
        "start": True,
        "overrides": [
            "+experiment=search_qa_warm_start",
            "env.prompt_format=chat",
            "learner.shared_tokens=4096",
            "trainer.ckpt_every=4",
            "trainer.resume=auto",
            "logger.progress=false",
        ],
    },
    # The learning comparison at GPU scale (scripts/gpu_check.sh, phase learning; issues 29, 42): the
    # points of search_qa_methods from the same clone, with the real SmolLM2, run side by side on one
    # GPU (--parallel 21 --time-budget-s: each point trains until the shared time runs out, so
    # total_steps is only a cap). 8 x 8 episodes a step (the CPU preset: 4 x 4), 128 valid
    # questions every 10 steps and 128 test questions at the end (CPU: 64). At this scale the steps
    # are the papers' own kind (8 x 8 rollouts against their 16 x 8), so ADRS keeps its schedule
    # (steps 21-70: a point that stops before step 21 never shapes, and its steps column says so);
    # RetireOPD trains its teacher 50 steps (inside the point's time limit: a shared budget too
    # short for them fails that point, not the others) and closes a window at each validation
    # (window 10 = val_every). Each point asks for 0.045 of the GPU (learner 0.02, engine 0.015,
    # scorer 0.01: 21 points hold 0.945) and one thread per actor.
    "search_qa_gpu": {
        "methods": ["grpo", "sdar", "targeted_guidance", "retire_opd", "adrs", "null_baseline", "skill_grpo"],
        "start": True,
        "overrides": [
            "+experiment=search_qa_warm_start",
            "trainer.total_steps=1000",
            "trainer.groups_per_step=8",
            "rollout.group_size=8",
            "trainer.val_every=10",
            "trainer.val_tasks=128",
            "trainer.ckpt_every=0",
            "logger.progress=false",
            "cluster.threads_per_actor=1",
            "learner.num_gpus=0.02",
            "rollout.num_gpus=0.015",
            "scorer.num_gpus=0.01",
        ],
        "method_overrides": {
            "retire_opd": ["method.phase1_steps=50", "method.window=10"],
            "null_baseline": ["method.lam=0.1"],
        },
    },
    # The same code path at toy size, what `scripts/gpu_check.sh --cpu` (CI) runs: two methods side
    # by side on a shared local Ray, the tiny random model on the keyword task, time-limited.
    "keyword_tiny_cpu": {
        "methods": ["grpo", "hint_distill"],
        "start": True,
        "overrides": [
            "model=tiny",
            "env=keyword",
            "trainer.total_steps=1000",
            "trainer.groups_per_step=1",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "trainer.val_every=0",
            "trainer.val_tasks=4",
            "trainer.final_val_splits=[test]",
            "trainer.ckpt_every=0",
            "logger.progress=false",
            "cluster.threads_per_actor=1",
        ],
    },
}


def point_name(method: str, seed: int, repeat: int = 1) -> str:
    return f"{method}_s{seed}" + (f"_r{repeat}" if repeat > 1 else "")


def run_point(
    out: Path,
    method: str,
    seed: int,
    overrides: list[str],
    keep_checkpoints: bool = False,
    repeat: int = 1,
    log: bool = False,
) -> Path | None:
    """One training run (or, for ``start``, the starting model evaluated without training); its
    directory, or None when it failed. ``log``: its output to ``<run dir>/train.log`` (points run
    side by side), else to this process's."""
    run_dir = out / point_name(method, seed, repeat)
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary.get("finished", True):  # runs from before the field were all finished ones
            print(f"learning: {run_dir.name} finished earlier: skipped", flush=True)
            return run_dir
        print(f"learning: {run_dir.name} was stopped after step {summary['steps']}: resuming it", flush=True)
    if method == START:  # the starting model: validation (unless the overrides turn it off) and the test split
        explicit = [o for o in overrides if o.startswith("trainer.val_at_start=")][-1:]
        overrides = [o for o in overrides if not o.startswith(("trainer.total_steps=", "trainer.val_at_start="))]
        overrides += ["trainer.total_steps=0", *(explicit or ["trainer.val_at_start=true"])]
    else:
        overrides = [f"method={method}", *overrides]
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        f"trainer.seed={seed}",
        f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
        "trainer.resume=auto",  # a point stopped or killed earlier goes on from its last checkpoint
        *overrides,
    ]
    t0 = time.time()
    print(f"learning: {run_dir.name} ...", flush=True)
    if log:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "train.log", "a") as f:  # a resumed point's log goes on after its first part
            code = CHILDREN.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    else:
        code = CHILDREN.run(cmd, cwd=ROOT)
    if code is None:
        print(f"learning: {run_dir.name}: not started (stopped)", flush=True)
        return None
    print(f"learning: {run_dir.name} exit {code} in {time.time() - t0:.0f} s", flush=True)
    if code != 0:  # failed, or stopped with a checkpoint (128 + the signal): a rerun resumes it
        return None
    if not keep_checkpoints:  # a finished point's metrics are all the table needs; a checkpoint is GBs
        for ckpt in [run_dir / "checkpoints", *run_dir.glob("*/checkpoints")]:  # and a phase-1 teacher's
            shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


@contextlib.contextmanager
def shared_cluster(parallel: int):
    """A Ray cluster for points run side by side; yields its address. Its CPUs are logical: points
    that each ask for a CPU or two all start (oversubscribed on purpose; the preset keeps each
    actor to few threads), while GPUs stay what the machine has, shared by fractional requests."""
    import ray

    ray.init(
        num_cpus=max(os.cpu_count() or 1, 3 * parallel),
        include_dashboard=False,
        logging_level="ERROR",
    )
    try:
        print(f"learning: a Ray cluster for {parallel} points at once: {ray.cluster_resources()}", flush=True)
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def run_plan(
    out: Path,
    plan: list[tuple[str, int, int]],
    overrides_of,
    keep_checkpoints: bool = False,
    parallel: int = 1,
    time_budget_s: float | None = None,
    reserve_s: float = 120.0,
) -> list[Path | None]:
    """Run the plan's points (method, seed, repeat); their directories (None: failed) in plan order.

    ``overrides_of(method)``: a point's overrides. With ``parallel`` > 1 the points join one
    shared cluster, the start first and alone, then up to ``parallel`` at once. With a time budget
    each trained point gets ``trainer.time_limit_s`` from what is left of it when it starts."""
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    starts = [p for p in plan if p[0] == START]
    trained = [p for p in plan if p[0] != START]
    if deadline is not None and len(trained) > parallel:
        raise SystemExit(
            f"learning: --time-budget-s gives every method the same wall time, so all {len(trained)} trained "
            f"points must run at once: set --parallel {len(trained)} (got {parallel})"
        )
    done: dict[tuple[str, int, int], Path | None] = {}
    with shared_cluster(parallel) if parallel > 1 else contextlib.nullcontext() as address:
        joined = [f"cluster.address={address}"] if address else []

        def one(point: tuple[str, int, int]) -> Path | None:
            m, s, k = point
            extra = []
            given = overrides_of(m)
            if parallel > 1 and not any(o.startswith("cluster.threads_per_actor=") for o in given):
                # at lag 0 a point has one busy actor at a time (rollout, then learner): N points
                # side by side share the cores N ways (each actor's default is every core: 2 points
                # of 2-thread actors on 2 cores, beside a niced pip install, took 233 s for a learner
                # step of about 35 s alone)
                extra.append(f"cluster.threads_per_actor={max(1, (os.cpu_count() or 1) // parallel)}")
            if deadline is not None and m != START:
                left = deadline - time.monotonic() - reserve_s
                if left <= 0:
                    print(f"learning: {point_name(m, s, k)}: the time budget is spent: not started", flush=True)
                    return None
                extra.append(f"trainer.time_limit_s={left:.0f}")
            return run_point(out, m, s, given + joined + extra, keep_checkpoints, k, log=parallel > 1)

        for p in starts:  # alone: it builds the warm start (cached) that every point reads
            done[p] = one(p)
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for p, d in zip(trained, pool.map(one, trained)):
                done[p] = d
    return [done[p] for p in plan]


def plot(runs, path: Path) -> None:
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in dict.fromkeys(r.method for r in runs if r.repeat == 1 and r.method != START):
        curves = [r.val_curve() for r in runs if r.method == m and r.repeat == 1 and r.val_curve()]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [statistics.fmean(c[s] for c in curves) for s in steps]
        std = [statistics.stdev([c[s] for c in curves]) if len(curves) > 1 else 0.0 for s in steps]
        ax.plot(steps, mean, marker="o", label=f"{m} (n={len(curves)})")
        ax.fill_between(steps, [a - b for a, b in zip(mean, std)], [a + b for a, b in zip(mean, std)], alpha=0.2)
    ax.set_xlabel("step (0 = the warm start)")
    ax.set_ylabel("valid success (the preset's first val temperature)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="keyword_hints_cpu", choices=sorted(PRESETS))
    ap.add_argument("--methods", nargs="+")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument(
        "--repeat-seeds",
        nargs="*",
        type=int,
        default=[],
        help="seeds run a second time for every method (the same-seed spread)",
    )
    ap.add_argument("--repeat-methods", nargs="*", help="methods of --repeat-seeds (default: every method)")
    ap.add_argument("--start-only", action="store_true", help="evaluate the preset's starting model (its clone) only")
    ap.add_argument("--out", help="the runs' directory (default runs/learning/<preset>)")
    ap.add_argument("--results", help="also store the result folder here (e.g. docs/results/<name>)")
    ap.add_argument("--parallel", type=int, default=1, help="points at once, on one shared Ray cluster (default 1)")
    ap.add_argument(
        "--time-budget-s",
        type=float,
        help="wall seconds for the whole comparison: every trained point at once, each time-limited to what is left",
    )
    ap.add_argument(
        "--reserve-s",
        type=float,
        default=120.0,
        help="seconds a time-limited point keeps for its last step, validation and test (default 120)",
    )
    ap.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each finished point's checkpoints (about 2 GB each for SmolLM2); default: delete them",
    )
    args, extra = ap.parse_known_args()
    CHILDREN.install()
    preset = PRESETS[args.preset]
    out = Path(args.out or ROOT / "runs" / "learning" / args.preset)
    out.mkdir(parents=True, exist_ok=True)
    methods = args.methods or preset["methods"]
    per_method = preset.get("method_overrides", {})
    split = preset.get("split", TEST_SPLIT)
    plan = [(START, args.seeds[0], 1)] if preset.get("start") or args.start_only else []
    if not args.start_only:
        plan += [(m, s, 1) for s in args.seeds for m in methods]  # seed-major: an early stop keeps whole seeds
        plan += [(m, s, 2) for s in args.repeat_seeds for m in (args.repeat_methods or methods)]
    bench = Bench.start(args.results)  # the code the runs use (the tree may change while they run)
    dirs = run_plan(
        out,
        plan,
        lambda m: preset["overrides"] + per_method.get(m, []) + extra,
        args.keep_checkpoints,
        parallel=args.parallel,
        time_budget_s=args.time_budget_s,
        reserve_s=args.reserve_s,
    )
    if CHILDREN.stopped is not None:  # the points saved their checkpoints; tables wait for the rerun
        print("learning: stopped; the same command resumes the stopped points and skips the finished", flush=True)
        sys.exit(128 + CHILDREN.stopped)
    failed = [point_name(m, s, k) for (m, s, k), d in zip(plan, dirs) if d is None]
    runs = [load_run(d) for d in dirs if d is not None]
    try:
        tables = learning_tables(runs, split=split)
        write_tables(out, tables)
        plot(runs, out / "curves.png")
    except ImportError as e:  # an air-gapped GPU machine may lack scipy or matplotlib: the runs are what counts
        print(
            f"learning: no tables here ({e}); the runs are in {out}: copy them to a result folder's runs/, "
            "then run scripts/results.py pack and rebuild where scipy and matplotlib are",
            file=sys.stderr,
        )
        tables = None
    if bench.out:
        folder = bench.out
        folder.mkdir(parents=True, exist_ok=True)
        for d in dirs:
            if d is not None:
                store_run(d, folder)
        pack_runs(folder)
        write_meta(
            folder,
            ROOT,
            bench.git,
            kind="learning",
            command=" ".join(["python", *sys.argv]),
            preset=args.preset,
            overrides=preset["overrides"],
            method_overrides=per_method,
            extra_overrides=extra,
            baseline="grpo",
            split=split,
            failed=failed,
        )
        if tables is not None:
            write_tables(folder, tables)
            plot(runs, folder / "curves.png")
    print(json.dumps(tables, indent=1))
    print(
        f"learning: {out / 'table.md'}, {out / 'curves.png'}" + (f"; stored in {args.results}" if args.results else "")
    )
    if failed:
        print(f"learning: failed points: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
