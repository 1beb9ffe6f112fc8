"""The command line as users run it: Hydra multirun with a sweep summary, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model=tiny",
    "env=keyword",
    "trainer.total_steps=1",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "rollout.max_new_tokens=8",
    "rollout.group_size=2",
    "trainer.groups_per_step=1",
    "logger.progress=false",
]


def train(args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.integration
def test_multirun_sweeps_sdar_beta_and_writes_a_summary_table(tmp_path):
    sweep = tmp_path / "sweep"
    r = train(["-m", *TINY, "method=sdar", "method.beta=1,10", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    table = (sweep / "sweep_summary.md").read_text()
    assert "method.beta=1" in table and "method.beta=10" in table
    assert len(list(sweep.glob("*/metrics.jsonl"))) == 2


NEW_PRESET = """# A combination no preset has: SDAR's gate on k3, a hints self-teacher, ADRS's window.
name: gated_k3_window
prefix: gk3
parts: {teacher: self, context: hints, signal: aux, schedule: window}  # the other slots: their defaults
mean_std_across_rows: true
norm_std: true
estimator: k3_is
weight: gate
beta: 5.0
lam: 0.05
pg_coef: 1.0
placement: system
warmup_steps: 0
active_steps: null
entropy_coef_active: 0.0
entropy_coef_idle: 0.0
"""


@pytest.mark.integration
def test_a_new_preset_is_one_yaml_file_in_the_users_own_config_dir(tmp_path):
    """docs/extending.md: a new combination of parts is one YAML, found by Hydra's --config-dir
    (nothing in the package or the tests names it), and it trains."""
    conf = tmp_path / "conf" / "method"
    conf.mkdir(parents=True)
    (conf / "gated_k3_window.yaml").write_text(NEW_PRESET)
    run_dir = tmp_path / "run"
    r = train(
        ["--config-dir", str(tmp_path / "conf"), *TINY, "method=gated_k3_window", f"trainer.run_dir={run_dir}"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [step] = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["gk3/loss"] == step["gk3/loss"] and step["teacher/rows_scored_frac"] == 1.0
    assert step["gk3/entropy_coef"] == 0.0  # the window schedule's metric: its part is in the run
    log = (run_dir / "cli.log").read_text()  # the run's console is kept with it, its last line too
    assert "privy-rl: precision: " in log and log.strip().splitlines()[-1].startswith("privy-rl: done: 1 steps")


@pytest.mark.integration
def test_a_sweep_point_with_a_bad_value_records_its_error_and_the_sweep_goes_on(tmp_path):
    """Only a misspelt key or option stops a sweep before its first point (tests/integration/
    test_cli_errors.py); a value out of range fails its own point, named in its record."""
    sweep = tmp_path / "sweep"
    r = train(["-m", *TINY, "learner.lr=-1,1e-5", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]  # a point did not finish: the sweep says so
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/sweep_point.json")}
    [bad] = [v for k, v in records.items() if k.startswith("0_")]
    [good] = [v for k, v in records.items() if k.startswith("1_")]
    assert bad["status"] == "failed" and bad["error"].startswith("config error: learner.lr=-1")
    assert good["status"] == "done" and len(list(sweep.glob("1_*/metrics.jsonl"))) == 1
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["learner.zero_stage=7"], "privy-rl: config error: learner.zero_stage=7"),
        (["method=sdar", "method.beta=-1"], "privy-rl: config error: method=sdar"),
        (["model=hf_path", "model.path=/nonexistent/model"], "privy-rl: missing file: model.path=/nonexistent/model"),
        (["+env.options.bogus=1"], "privy-rl: config error: env"),
    ],
)
def test_bad_launches_fail_with_one_line(tmp_path, args, needle):
    r = train([*TINY, *args, f"trainer.run_dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.startswith("privy-rl:")]
    assert lines and lines[0].startswith(needle), r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def _launch(args, cwd):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(metrics: Path, n: int, proc, timeout: float = 300) -> int:
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if len(lines) >= n:
            return len(lines)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout} s")


LONG = [
    "model=tiny",
    "env=keyword",
    "trainer.total_steps=500",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "rollout.max_new_tokens=48",
    "rollout.group_size=8",
    "trainer.groups_per_step=2",
    "logger.progress=false",
]


@pytest.mark.integration
@pytest.mark.parametrize(
    "signame, extra, status",
    [pytest.param("SIGINT", [], 130, marks=pytest.mark.extended), ("SIGTERM", ["trainer.stop_grace_s=0.01"], 143)],
)
def test_a_stop_signal_checkpoints_the_last_completed_step_and_the_run_resumes(tmp_path, signame, extra, status):
    """Ctrl-C finishes the step it lands in. SIGTERM is a cluster's stop (`ray job stop`, a
    preemption: SIGKILL after a grace): with a grace far shorter than a step, a step still in its
    rollouts is abandoned (its groups kept for the resumed run) and one already in its update is
    finished. Either way the checkpoint is of the last step in metrics.jsonl, the exit status is the
    shell's for the signal and the message says how to resume; the resumed run trains the next step."""
    import json
    import signal

    run_dir = tmp_path / "run"
    proc = _launch([*LONG, f"trainer.run_dir={run_dir}", *extra], tmp_path)
    seen = _wait_for_steps(run_dir / "metrics.jsonl", 2, proc)
    proc.send_signal(getattr(signal, signame))  # most of a tiny step is rollout: the signal lands in one
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err[-3000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= seen
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]:06d}", "the checkpoint is not of the last finished step"
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    abandoned = [e["step"] for e in events if e["event"] == "step_abandoned"]
    assert abandoned in ([], [steps[-1] + 1]) and (signame == "SIGTERM" or not abandoned)
    assert (f"step_abandoned: step={steps[-1] + 1}" in err) == bool(abandoned)
    assert f"stopped after step {steps[-1]} of 500" in err and f"trainer.resume={run_dir}" in err
    assert "Traceback" not in err
    more = [*LONG[:2], f"trainer.total_steps={steps[-1] + 1}", *LONG[3:], f"trainer.run_dir={run_dir}"]
    resumed = train([*more, f"trainer.resume={run_dir}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == steps[-2] + 1


@pytest.mark.integration
def test_a_second_ctrl_c_gives_up_the_step_and_saves_the_last_trained_one(tmp_path):
    """A second Ctrl-C no longer aborts unsaved: the step still in its rollouts is given up at
    once and the last trained step is saved (a third aborts: tests/faults/test_stop_signals.py)."""
    import signal
    import time

    run_dir = tmp_path / "run"
    proc = _launch([*LONG, f"trainer.run_dir={run_dir}"], tmp_path)
    _wait_for_steps(run_dir / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "second stop request (SIGINT)" in err and "Traceback" not in err
    last = [x for x in err.splitlines() if x.startswith("privy-rl: ")][-1]
    assert f"stopped after step {steps[-1]} of 500; step {steps[-1]} is saved" in last, err[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{steps[-1]:06d}"


def test_describe_prints_the_method_and_starts_nothing(tmp_path):
    r = train(["--describe", "method=sdar", "method.beta=10"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "signal: aux" in r.stdout and "  * beta = 10" in r.stdout and "  * weight = 'gate'" in r.stdout
    assert "    lam = 0.01" in r.stdout  # a default, unmarked
    assert not (tmp_path / "runs").exists()
