"""`scripts/submit.sh` against a real, separately started Ray cluster (`ray start --head`).

The cluster runs in its own temp dir and process group with free ports, all on 127.0.0.1; the test
stops it itself (SIGTERM to `ray start --block`, then every process of its tree that is left), so
it never touches another Ray on the machine (which `ray stop --force` would).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from local_ray import RAY, cluster_env, ray_head

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "scripts" / "submit.sh"
JOB_TIMEOUT = 600
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node with 2 CPUs; yields the dashboard (job server) URL."""
    with ray_head(num_cpus=2, dashboard=True) as head:
        TIMINGS["cluster_start"] = head.start_seconds
        yield head.dashboard_url
        t1 = time.time()
    TIMINGS["cluster_stop"] = time.time() - t1


def _job(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = cluster_env()
    return subprocess.run(
        [RAY, "job", *args, "--address", url], env=env, capture_output=True, text=True, timeout=timeout
    )


TINY = ["model=tiny", "env=keyword", "trainer.val_every=0", "logger.progress=false", "trainer.ckpt_every=0"]


def _submit(url: str, sid: str, runs: Path, overrides: list[str], *flags: str, timeout: float = JOB_TIMEOUT):
    """`scripts/submit.sh` against the cluster; a job still running at the timeout is stopped."""
    cmd = ["bash", str(SUBMIT), "--address", url, "--submission-id", sid, *flags, "--runs-dir", str(runs), *overrides]
    try:
        return subprocess.run(cmd, env=cluster_env(), capture_output=True, text=True, timeout=timeout, cwd=runs.parent)
    except subprocess.TimeoutExpired:
        _job(url, "stop", sid)
        raise


def test_submit_runs_a_tiny_job_on_an_existing_cluster(ray_cluster, tmp_path):
    import requests

    url = ray_cluster
    run_dir = tmp_path / "run"
    sid = f"privy-test-{uuid.uuid4().hex[:8]}"
    overrides = [*TINY, "trainer.total_steps=1", "rollout.max_new_tokens=8", "rollout.group_size=2"]
    overrides += ["trainer.groups_per_step=1", f"trainer.run_dir={run_dir}"]
    t0 = time.time()
    res = _submit(url, sid, tmp_path / "runs", overrides)
    TIMINGS["submit_end_to_end"] = time.time() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"submit.sh exited {res.returncode}:\n{out[-6000:]}"
    info = requests.get(f"{url}/api/jobs/{sid}", timeout=30).json()
    assert info["status"] == "SUCCEEDED", info
    assert "cpu cluster" in res.stderr  # auto-detected: no GPU in the cluster's resources
    metrics = run_dir / "metrics.jsonl"
    assert metrics.exists(), f"no metrics.jsonl in {run_dir}:\n{out[-6000:]}"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    # --runs-dir: Hydra's own run dir (its .hydra/ record) went there, its ${...} resolved.
    hydra_dirs = list((tmp_path / "runs").glob("*/*_grpo_keyword/.hydra/overrides.yaml"))
    assert len(hydra_dirs) == 1, list((tmp_path / "runs").rglob("*"))


def test_submit_runs_a_multirun_sweep_in_one_job(ray_cluster, tmp_path):
    """`-m` among the overrides: Hydra's basic launcher runs the points one after the other inside
    the one job, each in its own directory under --runs-dir, then writes the sweep summary."""
    import requests

    url = ray_cluster
    sid = f"privy-test-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    overrides = ["-m", *TINY, "trainer.total_steps=1", "rollout.max_new_tokens=8", "rollout.group_size=2"]
    overrides += ["trainer.groups_per_step=1", "trainer.seed=0,1"]
    t0 = time.time()
    res = _submit(url, sid, runs, overrides)
    TIMINGS["submit_multirun_2_points"] = time.time() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"submit.sh exited {res.returncode}:\n{out[-6000:]}"
    assert requests.get(f"{url}/api/jobs/{sid}", timeout=30).json()["status"] == "SUCCEEDED"
    summaries = sorted(runs.glob("multirun/*/*/*/summary.json"))
    assert len(summaries) == 2, list(runs.rglob("*"))
    assert {p.parent.name.split("_", 1)[0] for p in summaries} == {"0", "1"}
    assert len(list(runs.glob("multirun/*/*/sweep_summary.md"))) == 1


def test_ray_job_stop_leaves_a_checkpoint_of_the_last_completed_step(ray_cluster, tmp_path):
    """`ray job stop` sends SIGTERM and SIGKILL RAY_JOB_STOP_WAIT_TIME_S later (3 s by default: too
    short for a learner update and a checkpoint on a loaded 2-core machine, so the job gets 20 s,
    as docs/cluster.md tells users to do): with trainer.stop_grace_s=20 the run saves the last
    completed step and exits well before the SIGKILL."""
    import requests

    url = ray_cluster
    run_dir = tmp_path / "run"
    sid = f"privy-test-{uuid.uuid4().hex[:8]}"
    overrides = [*TINY, "trainer.total_steps=500", "rollout.max_new_tokens=48", "rollout.group_size=8"]
    overrides += ["trainer.groups_per_step=2", f"trainer.run_dir={run_dir}", "trainer.stop_grace_s=20"]
    grace = ["--env", "RAY_JOB_STOP_WAIT_TIME_S=20"]  # read by the job's supervisor, in the job's env
    res = _submit(url, sid, tmp_path / "runs", overrides, "--no-wait", *grace, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    metrics = run_dir / "metrics.jsonl"
    t0 = time.time()
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert time.time() - t0 < JOB_TIMEOUT, _job(url, "logs", sid).stdout[-4000:]
            status = requests.get(f"{url}/api/jobs/{sid}", timeout=30).json()["status"]
            assert status in ("PENDING", "RUNNING"), (status, _job(url, "logs", sid).stdout[-4000:])
            time.sleep(0.5)
    except BaseException:
        _job(url, "stop", sid)
        raise
    t1 = time.time()
    stop = _job(url, "stop", sid, timeout=120)
    TIMINGS["job_stop"] = time.time() - t1
    assert stop.returncode == 0, stop.stdout + stop.stderr
    while requests.get(f"{url}/api/jobs/{sid}", timeout=30).json()["status"] not in ("STOPPED", "FAILED", "SUCCEEDED"):
        time.sleep(0.5)
    TIMINGS["job_stop_to_stopped"] = time.time() - t1
    logs = _job(url, "logs", sid).stdout
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))
    latest = run_dir / "checkpoints" / "latest"
    assert latest.exists(), logs[-4000:]
    assert latest.read_text().strip() == f"step_{steps[-1]:06d}"
    assert (run_dir / "checkpoints" / latest.read_text().strip() / "controller.pt").exists()
    assert "privy-rl: SIGTERM" in logs and f"trainer.resume={run_dir}" in logs, logs[-4000:]
    assert "stopped after step" in logs  # it exited by itself, not by the SIGKILL 20 s later


def test_retries_submit_a_failed_job_again_and_it_continues_from_its_checkpoint(ray_cluster, tmp_path):
    """`--retries 1`: the job's driver is SIGKILLed after step 2 (what a lost node does to it), the
    job FAILS, submit.sh submits it again with trainer.resume=auto, and the new job continues from
    the last checkpoint: every step is in metrics.jsonl once, submit.sh exits 0."""
    import os
    import signal

    import psutil
    import requests

    url = ray_cluster
    run_dir, steps = tmp_path / "run", 6
    sid = f"privy-test-{uuid.uuid4().hex[:8]}"
    overrides = [x for x in TINY if x != "trainer.ckpt_every=0"] + ["trainer.ckpt_every=1"]
    overrides += [f"trainer.total_steps={steps}", "rollout.max_new_tokens=8", "rollout.group_size=2"]
    overrides += ["trainer.groups_per_step=1", f"trainer.run_dir={run_dir}"]
    cmd = ["bash", str(SUBMIT), "--address", url, "--submission-id", sid, "--retries", "1"]
    cmd += ["--runs-dir", str(tmp_path / "runs"), *overrides]
    proc = subprocess.Popen(cmd, env=cluster_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        t0 = time.time()
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.time() - t0 < JOB_TIMEOUT, proc.communicate()[1][-4000:]
            time.sleep(0.5)
        [driver] = [  # the job's python driver (not `ray job submit`, not a shell around it)
            p
            for p in psutil.process_iter(["cmdline"])
            if (cl := p.info["cmdline"] or [])[1:2] == ["scripts/train.py"] and f"trainer.run_dir={run_dir}" in cl
        ]
        os.kill(driver.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            _job(url, "stop", f"{sid}-retry1")
    assert proc.returncode == 0, err[-4000:]
    assert f"job {sid} FAILED; submitting it again (1 of 1, trainer.resume=auto)" in err, err[-4000:]
    assert requests.get(f"{url}/api/jobs/{sid}", timeout=30).json()["status"] == "FAILED"
    assert requests.get(f"{url}/api/jobs/{sid}-retry1", timeout=30).json()["status"] == "SUCCEEDED"
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == list(range(1, steps + 1))
    assert "trainer.resume=auto: continuing from" in _job(url, "logs", f"{sid}-retry1").stdout


def test_retries_need_a_fixed_run_dir(tmp_path):
    res = subprocess.run(
        ["bash", str(SUBMIT), "--dry-run", "--cpu", "--retries", "2", "model=tiny"],
        env={**cluster_env(), "RAY_BIN": RAY},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--retries needs trainer.run_dir=" in res.stderr


def test_submit_dry_run_quotes_overrides_and_sets_the_env(tmp_path):
    res = subprocess.run(
        [
            "bash",
            str(SUBMIT),
            "--dry-run",
            "--gpu",
            "--address",
            "127.0.0.1:8265",
            "--no-wait",
            "--env",
            "FOO=bar",
            "method=sdar",
            "rollout.val_temperatures=[0.4,0.0]",
        ],
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "--address http://127.0.0.1:8265" in out and "--no-wait" in out
    assert "cluster=existing" in out and "method=sdar" in out
    assert "DS_ACCELERATOR" not in out  # only on CPU clusters
    assert "FOO" in out and "WANDB_MODE" in out and "HF_HUB_OFFLINE" in out
    cpu = subprocess.run(
        ["bash", str(SUBMIT), "--dry-run", "--cpu", "model=tiny"],
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "DS_ACCELERATOR" in cpu.stdout


def teardown_module(module):
    if TIMINGS:
        print("\nsubmit timings (s):", {k: round(v, 1) for k, v in TIMINGS.items()})
