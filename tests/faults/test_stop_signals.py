"""SIGTERM and SIGINT sent to a real run (the public entry point) at the moments that used to lose
work: during the warm start (a real DeepSpeed clone in a spawned process), while Ray and the
actors start, and twice or three times around the grace save.

Before the controller runs, a signal ends the start-up at once and cleanly: one line, the shell's
status for the signal, nothing half-written in the warm-start cache or the run dir, no clone left
running, and the next start goes on. During the save, a second signal lets it finish (the step is
saved); a third aborts, and the last line says which trained step that loses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from test_divergence_stops import ARGS as DIVERGING

from lab.faults import Throttle, actor_pid

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# the short tiny run of the divergence test, without its divergence and its length
TINY = [a for a in DIVERGING if not a.startswith(("learner.lr=", "trainer.total_steps="))]


def train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``scripts/train.py`` to its end."""
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


class Run:
    """``scripts/train.py`` in a session of its own, its stderr read line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    @property
    def err(self) -> str:
        return "".join(self.lines)

    def wait_for(self, cond, what: str, timeout: float = 600):
        t0 = time.time()
        while not (got := cond()):
            assert self.proc.poll() is None, f"the run ended while waiting for {what}:\n{self.err[-3000:]}"
            assert time.time() - t0 < timeout, f"no {what} within {timeout} s:\n{self.err[-3000:]}"
            time.sleep(0.01)
        return got

    def end(self, timeout: float = 300) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def _last_line(err: str) -> str:
    return [x for x in err.splitlines() if x.startswith("privy-rl: ")][-1]


def _clones(pid: int) -> list[psutil.Process]:
    """The warm start's spawned cloning process(es) under the driver."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if "multiprocessing" in " ".join(p.cmdline())]


# the warm-start stage in `make test-extended` (CI runs both): `make test` keeps the actors' stage
@pytest.mark.parametrize(
    "stage, signame", [pytest.param("warm start", "SIGTERM", marks=pytest.mark.extended), ("actors", "SIGTERM")]
)
def test_a_signal_before_training_ends_the_start_up_cleanly_and_the_next_start_goes_on(tmp_path, stage, signame):
    clones = tmp_path / "clones"
    args = [*TINY, "trainer.total_steps=1", f"trainer.run_dir={tmp_path / 'run'}"]
    if stage == "warm start":
        args += [f"warm_start.cache_dir={clones}", "warm_start.enabled=true", "warm_start.tasks=4"]
        args += ["warm_start.epochs=200"]  # long enough to be signalled in the middle of it
    run = Run(args, tmp_path)
    try:
        if stage == "warm start":
            child = run.wait_for(lambda: _clones(run.proc.pid), "the clone's spawned process")[0]
            run.wait_for(lambda: any(clones.glob(".*.*/")), "the clone's staging dir")
            time.sleep(2)  # in the clone's training
        else:
            run.wait_for(lambda: "starting Ray and the actors" in run.err, "the actors' start-up")
            time.sleep(1)
        t0 = time.time()
        run.proc.send_signal(getattr(signal, signame))
        rc = run.end(timeout=120)
    finally:
        run.kill()
    took, err = time.time() - t0, run.err
    assert rc == 128 + getattr(signal, signame), err[-3000:]
    assert took < 60, f"{took:.0f} s to stop"
    what = "the warm start" if stage == "warm start" else "Ray and the actors' start-up"
    assert f"{signame} during {what}: stopped before any step of this start was trained" in _last_line(err), err
    assert "Traceback" not in err
    if stage == "warm start":
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the clone trains on, orphaned"
        assert [p.name for p in clones.iterdir() if not p.name.endswith(".lock")] == [], "half-written clone"
    assert not (tmp_path / "run").exists(), "a run stopped before training leaves no run dir"
    again = train([a for a in args if "epochs" not in a], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]


def _saving(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob(".tmp_step_*"))


@pytest.mark.parametrize("signame, n", [("SIGTERM", 2), ("SIGINT", 3)])
def test_repeated_signals_during_the_grace_save(tmp_path, signame, n):
    """The first signal stops the run after its step; the learner is slowed (stopped 95% of the
    time) so that its save lasts; a second signal during the save lets it finish, a third aborts
    it and the last line says the step is lost, nothing being saved before it (ckpt_every=0)."""
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.total_steps=500", "trainer.stop_grace_s=600", f"trainer.run_dir={run_dir}"]
    run = Run(args, tmp_path)
    sig = getattr(signal, signame)
    throttle = None
    try:
        metrics = run_dir / "metrics.jsonl"
        run.wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "step 3")
        learner = actor_pid(run.proc.pid, "LearnerActor")
        run.proc.send_signal(sig)
        throttle = Throttle(lambda: learner, stopped=0.95, period=0.5)
        throttle.start()
        run.wait_for(lambda: _saving(run_dir), "the grace save")
        for _ in range(n - 1):
            run.proc.send_signal(sig)
            time.sleep(0.5)
        assert _saving(run_dir), "the save ended before the signals were all sent"
        rc = run.end(timeout=600)
    finally:
        if throttle is not None:
            throttle.stop()
        run.kill()
    err = run.err
    assert rc == 128 + sig, err[-3000:]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    last = _last_line(err)
    ckpts = run_dir / "checkpoints"
    if n == 2:
        assert "second stop request" in err and "letting a save in progress finish" in err, err[-3000:]
        assert last.endswith(
            f"stopped after step {steps[-1]} of 500; step {steps[-1]} is saved; continue with trainer.resume={run_dir}"
        ), last
        assert (ckpts / "latest").read_text().strip() == f"step_{steps[-1]:06d}"
        assert not _saving(run_dir)
        # stopped, not finished: scripts/bench/learning.py resumes such a point rather than storing it
        assert json.loads((run_dir / "summary.json").read_text())["finished"] is False
        more = [*args[:-2], f"trainer.total_steps={steps[-1] + 1}", f"trainer.run_dir={run_dir}"]
        resumed = train([*more, f"trainer.resume={run_dir}"], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()][-1] == steps[-1] + 1
        assert json.loads((run_dir / "summary.json").read_text())["finished"] is True
    else:
        # the step the first signal let finish is trained, then its save is aborted: nothing is saved
        assert "third stop request (SIGINT): aborting now" in err, err[-3000:]
        saving = steps[-1] + 1
        assert last.endswith(
            f"aborted while saving step {saving}: steps 1-{saving} were trained but are not saved; no step is saved"
        ), last
        assert not (ckpts / "latest").exists()
    assert "Traceback" not in err


@pytest.mark.extended
def test_sigterm_during_a_validation_saves_the_step_and_the_resumed_run_validates_it(tmp_path):
    """A validation can outlast any grace (64 Search-QA questions take 2-10 min on 2 cores; a
    preemption gives 30 s): SIGTERM during step 2's validation, the rollout worker slowed 20x so
    that it cannot end in the grace, cancels it and saves step 2 in time; the resumed run validates
    step 2 first, then trains step 3."""
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.total_steps=3", "trainer.val_every=2", "trainer.val_tasks=64", "trainer.stop_grace_s=20"]
    run = Run([*args, f"trainer.run_dir={run_dir}"], tmp_path)
    throttle = None
    try:
        run.wait_for(lambda: "privy-rl: val at step 2: " in run.err, "step 2's validation")
        worker = actor_pid(run.proc.pid, "RolloutWorker")
        throttle = Throttle(lambda: worker, stopped=0.95, period=0.5)
        throttle.start()
        t0 = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        rc = run.end(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        if throttle is not None:
            throttle.stop()
        run.kill()
    err = run.err
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    # the grace and the actors' shutdown; waiting for the slowed validation took minutes
    assert seconds < 20 + 30, err[-3000:]
    assert "the validation of step 2 is put off" in err, err[-3000:]
    assert _last_line(err).endswith(
        f"step 2 is saved, its validation put off; continue with trainer.resume={run_dir} (they run first)"
    ), _last_line(err)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert json.loads((run_dir / "summary.json").read_text())["finished"] is False
    resumed = train([*args, f"trainer.run_dir={run_dir}", f"trainer.resume={run_dir}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "val/success" in r) for r in rows] == [(1, False), (2, False), (2, True), (3, True)]
    assert json.loads((run_dir / "summary.json").read_text())["finished"] is True
