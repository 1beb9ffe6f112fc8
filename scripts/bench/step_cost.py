"""``make train``'s recipe for a few steps on this tree and on an older commit, side by side.

    python scripts/bench/step_cost.py [--base 153028b|none] [--variant "OVERRIDES" ...] [--steps 4] [--warmup 1]
        [--out DIR] [overrides...]

Each tree runs ``scripts/train.py +experiment=search_qa_warm_start`` (the same cached clone, seed
and task stream) for ``--steps`` training steps with no validation and no checkpoint, alone, one
tree after the other, the current one first. The older commit runs from a git worktree of its
own with a venv of its own, built by that commit's own ``make setup`` (minutes the first time,
then reused from ``.cache/privy-rl/bench_trees/``). A sampler reads the resident size of each
run's learner process twice a second. Per tree: seconds per step, the learner's seconds per step
(``time/train_s``), the rollout wait, tokens forwarded by the learner and its peak resident size
with where it went (``learner_memory_gb``: the learner's own count of its tensors at the last
step, and the rest of the peak); then current / base. Each ``--variant`` (repeatable) adds a run
of this tree with more overrides (a setting against the default, e.g. gradient checkpointing),
named ``variant``, ``variant2``, ... and compared with every other run; ``--base none`` leaves the
older commit out. Steps before ``--warmup`` are left out of the means. Run it alone: other load on
the 2 cores changes every time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lab.bench import ROOT, Bench, add_out

RECIPE = ["+experiment=search_qa_warm_start"]
QUIET = [
    "trainer.val_every=0",
    "trainer.val_at_start=false",
    "trainer.final_val_splits=[]",
    "trainer.ckpt_every=0",
    "logger.progress=false",
]


class LearnerPeak(threading.Thread):
    """The largest resident size of any ``ray::LearnerActor`` process under ``pid`` (``peak``), and
    the largest of its private part (``private``: resident less the pages it shares with other
    processes, mostly the weight packets it wrote into Ray's object store, which are the store's
    memory, counted once for the node: /proc's RssAnon)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.private, self.stop = pid, 0, 0, threading.Event()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.stop.wait(0.5):
            try:
                children = root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for p in children:
                try:
                    if " ".join(p.cmdline()).startswith("ray::LearnerActor"):
                        m = p.memory_info()
                        self.peak = max(self.peak, m.rss)
                        self.private = max(self.private, m.rss - m.shared)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


def base_tree(commit: str) -> tuple[Path, Path]:
    """A worktree of ``commit`` and its own venv's python, built once and kept."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True)
    sha = sha.stdout.strip()
    tree = ROOT / ".cache" / "privy-rl" / "bench_trees" / sha[:12]
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True)
    if not (tree / ".venv" / ".installed").exists():
        subprocess.run(["make", "-C", str(tree), "setup"], check=True)
    return tree, tree / ".venv" / "bin" / "python"


def run_tree(name: str, tree: Path, python: Path, steps: int, overrides: list[str], work: Path) -> dict:
    run_dir = work / name
    cmd = [str(python), "scripts/train.py", *RECIPE, *QUIET, f"trainer.total_steps={steps}"]
    cmd += [f"trainer.run_dir={run_dir}", *overrides]
    env = {**os.environ, "PRIVY_CACHE": str(ROOT / ".cache" / "privy-rl")}  # one model and one clone for both
    print(f"step_cost: {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=tree, env=env)
    peak = LearnerPeak(proc.pid)
    peak.start()
    rc = proc.wait()
    peak.stop.set()
    peak.join()
    if rc != 0:
        raise SystemExit(f"step_cost: {name} exited {rc}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {
        "rows": [r for r in rows if r.get("step", 0) >= 1],
        "learner_peak_gb": peak.peak / 1e9,
        "learner_private_peak_gb": peak.private / 1e9,
        "wall_s": time.time() - t0,
    }


def summarise(run: dict, warmup: int) -> dict:
    rows = [r for r in run["rows"] if r["step"] > warmup] or run["rows"]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if key in r]
        return statistics.fmean(vals) if vals else None

    return {
        "steps_timed": len(rows),
        "step_s": mean("time/step_s"),
        "learner_s": mean("time/train_s"),
        "wait_rollout_s": mean("time/wait_rollout_s"),
        "learner_tokens_per_s": mean("learner/tokens_per_s"),
        "forwarded_tokens": mean("learner/forwarded_tokens"),
        "padding_tokens": mean("learner/padding_tokens"),
        "learner_peak_gb": run["learner_peak_gb"],
        "learner_private_peak_gb": run.get("learner_private_peak_gb"),
        "wall_s": run["wall_s"],
        "learner_memory_gb": where_memory_went(run),
    }


# the tensors the learner counts itself (actors/learner_memory.py) and the object store's pages
TENSORS = ("parameters", "gradients", "optimizer", "deepspeed", "rss_shmem")


def where_memory_went(run: dict) -> dict | None:
    """The learner's breakdown at its last step (``learner/memory/*_gb``: parameters, gradients,
    the optimizer's state, DeepSpeed's own buffers, the shared pages) and ``rest``: the sampled
    peak less all of them (a step's activations and logits, the libraries, what the allocator
    keeps). None for a tree that logged no breakdown."""
    last = next((r for r in reversed(run["rows"]) if "learner/memory/parameters_gb" in r), None)
    if last is None:
        return None
    out = {k[len("learner/memory/") : -len("_gb")]: v for k, v in last.items() if k.startswith("learner/memory/")}
    out["rest"] = run["learner_peak_gb"] - sum(out.get(k, 0.0) for k in TENSORS)
    return out


COLUMNS = ("step_s", "learner_s", "wait_rollout_s", "learner_peak_gb", "learner_private_peak_gb")


def runs_of(report: dict) -> list[str]:
    """The runs present, in table order: base, current, then the variants as given."""
    return [k for k in ("base", "current") if k in report] + [k for k in report if k.startswith("variant")]


def ratios(report: dict) -> dict[str, dict]:
    """``a / b`` of each column for every pair of the runs present, later over earlier."""
    have = runs_of(report)
    out = {}
    for i, b in enumerate(have):
        for a in have[i + 1 :]:
            x, y = report[a], report[b]
            out[f"{a} / {b}"] = {m: (x[m] / y[m] if y.get(m) and x.get(m) is not None else None) for m in COLUMNS}
    return out


def step_table(report: dict) -> list[dict]:
    """The runs' means (seconds to 0.1, GB to 0.01), then their ratios (to 0.01)."""

    def r(x, digits):
        return None if x is None else round(x, digits)

    table = [
        {"tree": k, **{m: r(report[k].get(m), 2 if m.endswith("gb") else 1) for m in COLUMNS}} for k in runs_of(report)
    ]
    table += [{"tree": name, **{m: r(v, 2) for m, v in row.items()}} for name, row in report["ratios"].items()]
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="153028b", help="the older commit (a git ref), or none")
    ap.add_argument(
        "--variant", action="append", default=[], help="overrides of one more run of this tree (space-separated)"
    )
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the means")
    add_out(ap)
    args, overrides = ap.parse_known_args()
    bench = Bench.start(args.out)
    report = {"command": bench.command, "steps": args.steps, "warmup": args.warmup, "overrides": overrides}
    with tempfile.TemporaryDirectory(prefix="step_cost.") as tmp:
        run = run_tree("current", ROOT, Path(sys.executable), args.steps, overrides, Path(tmp))
        report["current"] = {"commit": bench.git["commit"], **summarise(run, args.warmup)}
        for k, given in enumerate(args.variant):
            name, variant = "variant" if k == 0 else f"variant{k + 1}", given.split()
            run = run_tree(name, ROOT, Path(sys.executable), args.steps, [*overrides, *variant], Path(tmp))
            report[name] = {"commit": bench.git["commit"], "overrides": variant, **summarise(run, args.warmup)}
        if args.base != "none":
            tree, python = base_tree(args.base)
            run = run_tree("base", tree, python, args.steps, overrides, Path(tmp))
            report["base"] = {"commit": args.base, **summarise(run, args.warmup)}
    report["ratios"] = ratios(report)
    print(json.dumps(report, indent=1))
    table = step_table(report)
    bench.store(report, table, [*RECIPE, *QUIET, f"trainer.total_steps={args.steps}", *overrides])


if __name__ == "__main__":
    main()
