"""scripts/docker_build.sh and docker_base.sh decide the base, the torch wheel and the CA secret.

Run against a fake `docker` and `pip3` (mocks of the two programs, named so: shell scripts that
record their arguments); the real build is `make docker-smoke` (scripts/docker_smoke.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_DOCKER = """#!/bin/bash
echo "DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-} $*" >> "$FAKE_LOG"
case "$1 $2" in
  "buildx version") exit 1 ;;
  "version --format") echo 20.10.24 ;;
  "image inspect") [ "$3" = "$FAKE_HAVE" ] ;;
  "pull -q") exit 1 ;;
esac
"""

FAKE_PIP = """#!/bin/bash
echo "pip $*" >> "$FAKE_LOG"
[ -n "$FAKE_WHEEL" ] && touch "docker/wheels/$FAKE_WHEEL"
[ -n "$FAKE_WHEEL" ]
"""


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    repo = tmp_path / "repo"
    if not repo.exists():
        (repo / "scripts").mkdir(parents=True)
        (repo / "docker" / "wheels").mkdir(parents=True)
        for name in ("docker_build.sh", "docker_base.sh"):
            shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        for name, text in (("docker", FAKE_DOCKER), ("pip3", FAKE_PIP)):
            (bin_ / name).write_text(text)
            (bin_ / name).chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    base_env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_LOG": str(log), "HOME": str(tmp_path)}
    res = subprocess.run(
        ["bash", str(repo / "scripts" / "docker_build.sh")],
        env={**base_env, "DOCKER": str(tmp_path / "bin" / "docker"), "FAKE_HAVE": "privy-rl-base:bookworm", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return res, log.read_text().splitlines()


def _build_line(lines: list[str]) -> str:
    builds = [line for line in lines if " build " in f" {line} "]
    assert len(builds) == 1, lines
    return builds[0]


def test_a_named_ca_bundle_goes_in_as_a_buildkit_secret_on_the_local_base(tmp_path):
    ca = tmp_path / "bundle.crt"
    ca.write_text("x")
    res, lines = _run(tmp_path, PRIVY_DOCKER_CA=str(ca), FAKE_WHEEL="torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")
    assert res.returncode == 0, res.stderr
    line = _build_line(lines)
    assert line.startswith("DOCKER_BUILDKIT=1 build "), line  # a 20.10 client: BuildKit behind the variable
    assert f"--secret id=pip_cert,src={ca}" in line
    assert "--build-arg BASE=privy-rl-base:bookworm" in line  # python:3.11-slim could not be pulled
    assert "-f docker/Dockerfile.cpu" in line and "-t privy-rl:cpu" in line
    pips = [x for x in lines if x.startswith("pip ")]
    assert pips == ["pip download -q --no-deps --only-binary=:all: -d docker/wheels torch==2.13.0+cpu"], pips


def test_no_ca_switch_means_no_secret_and_no_wheel_means_the_index(tmp_path):
    res, lines = _run(tmp_path, PRIVY_DOCKER_CA="none", FAKE_WHEEL="")
    assert res.returncode == 0, res.stderr
    assert "--secret" not in _build_line(lines)
    assert "takes it from the PyTorch CPU index" in res.stderr


def test_the_official_base_is_used_where_it_is_there(tmp_path):
    res, lines = _run(tmp_path, PRIVY_DOCKER_CA="none", FAKE_HAVE="python:3.11-slim", FAKE_WHEEL="")
    assert res.returncode == 0, res.stderr
    assert "--build-arg BASE=python:3.11-slim" in _build_line(lines)


def test_a_stale_wheel_is_removed_before_the_host_resolves_one(tmp_path):
    res, _ = _run(tmp_path, PRIVY_DOCKER_CA="none", FAKE_WHEEL="")
    old = tmp_path / "repo" / "docker" / "wheels" / "torch-2.12.0+cpu-cp311-cp311-linux_x86_64.whl"
    old.write_text("old")
    res, _ = _run(tmp_path, PRIVY_DOCKER_CA="none", FAKE_WHEEL="")
    assert res.returncode == 0, res.stderr
    assert not old.exists()
    assert os.listdir(tmp_path / "repo" / "docker" / "wheels") == []
