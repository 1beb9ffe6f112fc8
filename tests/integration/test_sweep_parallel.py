"""Hydra multirun with the joblib launcher (``hydra/launcher=parallel``) on a running Ray cluster.

A separately started head node (2 CPUs, no dashboard, free ports, its own temp dir) stands in for
the cluster. The 2-point sweep runs its points as two processes of the driver; each joins the
cluster (``cluster=existing``-style address) and asks for 1 CPU, so Ray runs both at once on the
2-CPU cluster. The test checks both points trained, the sweep summary was written, and the points
overlapped (each started before the other finished: an ordering of events, not a duration).
The test stops only the process tree it started.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SWEEP_TIMEOUT = 600


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({"RAY_AUTH_MODE": "disabled", "DS_ACCELERATOR": "cpu", "WANDB_MODE": "offline",
                "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    return env


def _stop_tree(proc: subprocess.Popen) -> list:
    """SIGTERM to `ray start --block` (it stops its cluster), then whatever of its tree is left."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=20)
    for sig in ("terminate", "kill"):
        for p in alive:
            try:
                getattr(p, sig)()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=10)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def ray_head():
    """A 2-CPU head node without dashboard; yields its GCS address."""
    temp = tempfile.mkdtemp(prefix="privy-sweep-", dir="/tmp")  # short: unix socket paths
    gcs, client, agent, agent_grpc, rt_agent, metrics = _free_ports(6)
    cmd = [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", "--include-dashboard=false",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={rt_agent}",
           f"--metrics-export-port={metrics}", "--num-cpus=2", "--disable-usage-stats",
           f"--temp-dir={temp}"]
    log = open(Path(temp) / "ray_start.log", "w")
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=temp)
    address = f"127.0.0.1:{gcs}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited {proc.returncode}: "
                                   f"{(Path(temp) / 'ray_start.log').read_text()[-3000:]}")
            st = subprocess.run([str(BIN / "ray"), "status", "--address", address], env=_env(),
                                capture_output=True, text=True, timeout=60)
            if st.returncode == 0 and "CPU" in st.stdout:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not come up within 120 s: {st.stdout[-2000:]}")
            time.sleep(1)
        yield address
    finally:
        left = _stop_tree(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"cluster processes survived the stop: {left}"


def test_joblib_sweep_runs_its_points_at_once_on_the_shared_cluster(ray_head, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
            "cluster=existing", f"cluster.address={ray_head}",
            "model=tiny", "env=keyword", "trainer.total_steps=1", "trainer.val_every=0",
            "trainer.ckpt_every=0", "rollout.max_new_tokens=8", "rollout.group_size=2",
            "trainer.groups_per_step=1", "logger.progress=false",
            "rollout.num_cpus=0.5", "learner.num_cpus=0.5",  # 1 CPU per point: both fit at once
            "trainer.seed=0,1", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=SWEEP_TIMEOUT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "Joblib.Parallel(n_jobs=2" in out  # the joblib launcher ran the sweep
    points = [sweep / "0", sweep / "1"]
    for p in points:
        assert (p / "summary.json").exists(), out[-6000:]
        assert (p / "metrics.jsonl").read_text().count("\n") == 1
    assert (sweep / "sweep_summary.md").exists()
    # config.yaml is written when a point starts, summary.json when it ends: each point started
    # before the other ended, so they ran side by side on the cluster.
    start = [(p / "config.yaml").stat().st_mtime for p in points]
    end = [(p / "summary.json").stat().st_mtime for p in points]
    assert start[0] < end[1] and start[1] < end[0], (start, end)
