"""A run on one machine serves nothing beyond it: during a real run through the public entry
point, every socket that its processes (the driver, Ray's GCS, raylet, agents and the actors)
listen on is bound to a loopback address (issue 13 item 8)."""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import pytest
from test_actor_restart import _launch, _steps

pytestmark = pytest.mark.integration

ARGS = [
    "model=tiny",
    "env=keyword",
    "trainer.total_steps=3",
    "trainer.groups_per_step=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.precision=fp32",
    "rollout.precision=fp32",
]


def _listening(root: int) -> dict[str, list[str]]:
    """Listening TCP addresses of ``root`` and its descendants, by process title."""
    import psutil

    out: dict[str, list[str]] = {}
    procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    for p in procs:
        try:
            title = " ".join(p.cmdline())[:60] or p.name()
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.setdefault(title, []).append(c.laddr.ip)
    return out


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_every_port_of_a_local_run_listens_on_loopback_only(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(ARGS, run_dir)
    try:
        t0 = time.time()
        while len(_steps(run_dir / "metrics.jsonl")) < 1:  # every actor is up and has trained once
            assert proc.poll() is None and time.time() - t0 < 600, "step 1 never came"
            time.sleep(0.1)
        listening = _listening(proc.pid)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert sum(len(v) for v in listening.values()) >= 5, listening  # Ray's servers were seen
    exposed = {title: ips for title, ips in listening.items() if not all(_loopback(ip) for ip in ips)}
    assert not exposed, f"listening beyond loopback: {exposed}"
