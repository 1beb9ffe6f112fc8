"""A separately started Ray head node for tests that need a real cluster (``ray start --head``).

The head runs in its own temp dir and process group, with free ports, on 127.0.0.1. ``stop_tree``
stops exactly the processes it started (SIGTERM to ``ray start --block``, then whatever of its
tree is left), so a test never touches another Ray on the machine (``ray stop --force`` would).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_env() -> dict[str, str]:
    """The environment of the cluster's processes and of the CLI calls made against it."""
    env = dict(os.environ)
    # The cluster's `python` (the job's interpreter) is this venv's, as after `. .venv/bin/activate`.
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        {
            "RAY_AUTH_MODE": "disabled",
            "DS_ACCELERATOR": "cpu",
            "WANDB_MODE": "offline",
            "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    return env


def stop_tree(proc: subprocess.Popen, grace: float = 20.0) -> list:
    """Stop ``proc`` and every process it started; returns those still alive (none expected)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` shuts its cluster down on SIGTERM
    _, alive = psutil.wait_procs(tree, timeout=grace)
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
    return [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@dataclass
class Head:
    address: str  # GCS address, host:port
    dashboard_url: str | None  # the job server, when started with a dashboard
    start_seconds: float


def _ready(head: Head) -> bool:
    if head.dashboard_url is not None:
        import requests

        try:
            return requests.get(f"{head.dashboard_url}/api/version", timeout=2).ok
        except requests.RequestException:
            return False
    st = subprocess.run(
        [RAY, "status", "--address", head.address], env=cluster_env(), capture_output=True, text=True, timeout=60
    )
    return st.returncode == 0 and "CPU" in st.stdout


def _start(num_cpus: int, dashboard: bool, timeout: float, temp: str):
    """Start ``ray start --head --block`` and wait until it answers; returns (proc, head, log) or
    raises. The ports are picked free but only bound by Ray later, so another socket can take one
    in between: the caller retries on a port clash."""
    gcs, dash, client, agent, agent_grpc, rt_agent, metrics = free_ports(7)
    cmd = [
        RAY,
        "start",
        "--head",
        "--block",
        f"--port={gcs}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={rt_agent}",
        f"--metrics-export-port={metrics}",
        f"--num-cpus={num_cpus}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    cmd += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"] if dashboard else ["--include-dashboard=false"]
    log_path = Path(temp) / "ray_start.log"
    log = open(log_path, "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=cluster_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=temp
    )
    head = Head(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}" if dashboard else None, 0.0)
    try:
        while not _ready(head):
            if proc.poll() is not None:
                text = log_path.read_text()
                raise (_PortClash if _PORT_CLASH.search(text) else RuntimeError)(
                    f"ray start exited {proc.returncode}: {text[-3000:]}"
                )
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the Ray head did not come up within {timeout:.0f} s")
            time.sleep(0.5)
    except BaseException:
        stop_tree(proc)
        log.close()
        raise
    head.start_seconds = time.monotonic() - t0
    return proc, head, log


class _PortClash(RuntimeError):
    pass


_PORT_CLASH = re.compile(r"(?i)address already in use|already in use|failed to bind|EADDRINUSE")


@contextlib.contextmanager
def ray_head(num_cpus: int = 2, dashboard: bool = False, timeout: float = 120) -> Iterator[Head]:
    """Start a head node, wait until it answers, yield it, stop its whole process tree."""
    temp = tempfile.mkdtemp(prefix="privy-ray-", dir="/tmp")  # short: unix socket paths (108 bytes)
    try:
        for attempt in range(3):
            try:
                proc, head, log = _start(num_cpus, dashboard, timeout, temp)
                break
            except _PortClash:
                if attempt == 2:
                    raise
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    try:
        yield head
    finally:
        left = stop_tree(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"cluster processes survived the stop: {left}"
