"""`scripts/submit.sh` against a real, separately started Ray cluster (`ray start --head`).

The cluster runs in its own temp dir and process group with free ports, all on 127.0.0.1; the test
stops it itself (SIGTERM to `ray start --block`, then every process of its tree that is left), so
it never touches another Ray on the machine (which `ray stop --force` would).
"""

from __future__ import annotations

import json
import shlex
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


@pytest.mark.extended
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


@pytest.mark.extended
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


@pytest.mark.extended
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


@pytest.mark.extended
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


# The plain `ray job submit` of docs/cluster.md ("Without submit.sh"): the same excludes.
PLAIN_RUNTIME_ENV = {
    "excludes": ["/.git/", "/.venv*/", "/.cache/", "/runs/", "/outputs/", "/multirun/", "/wandb/", "/gpu_check_out*/"]
}


@pytest.mark.extended
def test_a_plain_ray_job_submit_runs_the_uploaded_checkout_without_local_outputs(ray_cluster, tmp_path):
    """docs/cluster.md's plain command from a checkout holding local outputs: the job imports the
    uploaded code (Ray puts its working dir on the job's path; scripts/train.py adds nothing),
    none of the outputs or venvs was uploaded, and the run trains."""
    import requests

    checkout = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (checkout / f).parent.mkdir(parents=True, exist_ok=True)
            (checkout / f).write_bytes((ROOT / f).read_bytes())
    outputs = ["runs/x", "multirun/x", "outputs/x", ".cache/x", ".venv-junk/x", "gpu_check_out/x", "wandb/x"]
    for junk in outputs:
        (checkout / junk).mkdir(parents=True)
        (checkout / junk / "big.bin").write_bytes(b"0" * 1024)
    run_dir = tmp_path / "run"
    probe = (
        "import os, pipeline; left = [d for d in ('runs', 'multirun', 'outputs', '.cache', '.venv-junk', "
        "'gpu_check_out', 'wandb') if os.path.exists(d)]; print('uploaded outputs:', left); "
        "print('pipeline from', os.path.dirname(pipeline.__file__))"
    )
    overrides = [*TINY, "trainer.total_steps=1", "rollout.max_new_tokens=8", "rollout.group_size=2"]
    overrides += ["trainer.groups_per_step=1", f"trainer.run_dir={run_dir}"]
    sid = f"privy-test-{uuid.uuid4().hex[:8]}"
    cmd = [RAY, "job", "submit", "--address", ray_cluster, "--submission-id", sid, "--working-dir", "."]
    cmd += ["--runtime-env-json", json.dumps(PLAIN_RUNTIME_ENV), "--"]
    # `ray job submit` shell-quotes each word after --: one `sh -c` chains the probe and the run.
    chain = shlex.join(["python", "-c", probe]) + " && "
    chain += shlex.join(["python", "scripts/train.py", "cluster=existing", *overrides])
    cmd += ["sh", "-c", chain]
    try:
        res = subprocess.run(cmd, env=cluster_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=checkout)
    except subprocess.TimeoutExpired:
        _job(ray_cluster, "stop", sid)
        raise
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert requests.get(f"{ray_cluster}/api/jobs/{sid}", timeout=30).json()["status"] == "SUCCEEDED"
    assert "uploaded outputs: []" in out, out[-6000:]
    [line] = [x for x in out.splitlines() if x.startswith("pipeline from ")]
    assert str(ROOT) not in line and str(checkout) not in line  # the job's own copy, not a local checkout
    assert (run_dir / "metrics.jsonl").exists(), out[-6000:]
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1]


def test_submit_to_an_address_where_no_cluster_answers_is_one_line_naming_it():
    from local_ray import free_ports

    [port] = free_ports(1)  # closed again: nothing listens there
    res = subprocess.run(
        ["bash", str(SUBMIT), "--address", f"127.0.0.1:{port}", "model=tiny"],
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"submit.sh: no Ray job server answers at http://127.0.0.1:{port} ([Errno 111] Connection refused): "
        "start the cluster (ray start --head --dashboard-host=...) or pass --address http://HOST:8265"
    ]


def test_submit_can_give_the_job_its_dependencies_and_the_model_cache():

    import tomllib

    res = subprocess.run(
        [
            "bash",
            str(SUBMIT),
            "--dry-run",
            "--deps",
            "pip",
            "--extras",
            "sweep",
            "--cache",
            "/cache/privy-rl",
            "model=tiny",
        ],
        env=cluster_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout)
    env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert env["pip"]["packages"] == [*project["dependencies"], *project["optional-dependencies"]["sweep"]]
    assert env["env_vars"]["PRIVY_CACHE"] == "/cache/privy-rl"
    for local in ("/runs/", "/multirun/", "/outputs/", "/.cache/", "/.venv*/", "/gpu_check_out*/"):
        assert local in env["excludes"]
    uv = subprocess.run(
        ["bash", str(SUBMIT), "--dry-run", "--deps", "uv"], env=cluster_env(), capture_output=True, text=True
    )
    argv = shlex.split(uv.stdout)
    assert json.loads(argv[argv.index("--runtime-env-json") + 1])["uv"] == project["dependencies"]
    bad = subprocess.run(
        ["bash", str(SUBMIT), "--dry-run", "--deps", "conda"], env=cluster_env(), capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--deps wants pip or uv" in bad.stderr


def teardown_module(module):
    if TIMINGS:
        print("\nsubmit timings (s):", {k: round(v, 1) for k, v in TIMINGS.items()})
