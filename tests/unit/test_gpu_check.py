"""scripts/gpu_check.sh's payload handling and scripts/gpu_check.py's run assertions, on CPU.

The payload arrives on the GPU machine as parts sent back to back; a part lost (the machine drops
what it received after 30 s idle) or corrupted must stop the check at once with exit 3, naming
it, before any phase spends the device's 15 minutes. The whole check runs in CI as
`scripts/gpu_check.sh --cpu` (.ci/run).
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _payload(stage: Path, n_parts: int = 2) -> list[Path]:
    """A real payload in miniature: one solid tar.xz of a site folder, split, with a manifest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in (("site_core/probe_mod.py", "X = 1\n"), ("smollm2_tok/tokenizer.json", "{}")):
            data = text.encode() * 2000
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(buf.getvalue())
    stage.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(blob) / n_parts)
    parts = []
    for i in range(n_parts):
        p = stage / f"bundle.part{i:02d}"
        p.write_bytes(blob[i * size : (i + 1) * size])
        parts.append(p)
    manifest = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in parts)
    (stage / "MANIFEST.sha256").write_text(manifest)
    return parts


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "GPU_CHECK_SITE": str(tmp_path / "site"), "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", str(SCRIPT), "--stage", str(tmp_path / "stage"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = (out / "report.txt").read_text() if (out / "report.txt").exists() else ""
    return res, report


def test_a_part_lost_on_the_way_stops_the_check_with_exit_3_naming_it(tmp_path):
    parts = _payload(tmp_path / "stage", 3)
    parts[1].unlink()
    res, report = _check(tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "bundle.part01" in report and "parts missing" in report, report
    assert "versions" not in report  # nothing else ran


def test_a_corrupted_part_stops_the_check_with_exit_3(tmp_path):
    parts = _payload(tmp_path / "stage", 2)
    parts[0].write_bytes(parts[0].read_bytes()[:-1] + b"\0")
    res, report = _check(tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "checksum" in report, report


def test_a_whole_payload_is_verified_and_unpacked(tmp_path):
    _payload(tmp_path / "stage", 2)
    res, report = _check(tmp_path, "--phases", "none")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "setup      PASS" in report and "2 part(s) verified and unpacked" in report, report
    assert (tmp_path / "site" / "site_core" / "probe_mod.py").read_text().startswith("X = 1")
    for phase in ("versions", "ray", "train", "gpu_tests", "vllm", "colocated", "bench"):
        assert f"{phase:<10} SKIP" in report and "not asked" in report, (phase, report)
    assert (tmp_path / "out" / "gpu_check.tar.gz").exists()


def _rows(n: int, **change) -> list[dict]:
    rows = [
        {
            "step": s,
            "learner/loss": 0.1,
            "sync/version": s,
            "rollout/policy_lag_max": 0,
            "teacher/rows_scored_frac": 1.0,
            "time/step_s": 1.0,
            "learner/tokens_per_s": 100.0,
            "rollout/tokens_per_s": 50.0,
            "time/sync_s": 0.1,
        }
        for s in range(1, n + 1)
    ]
    rows[-1].update(change)
    return rows


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({}, None),
        ({"learner/loss": float("nan")}, "loss nan"),
        ({"sync/version": 2}, "sync/version 2"),
        ({"rollout/policy_lag_max": 1}, "policy lag 1"),
        ({"teacher/rows_scored_frac": 0.5}, "0.5"),
    ],
)
def test_check_run_asserts_what_the_cpu_integration_tests_assert(tmp_path, change, why):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(3, **change)))
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "check-run", str(run), "--steps", "3", "--teacher"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if why is None:
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().splitlines()[-1].startswith("DETAIL: 3 steps")
    else:
        assert res.returncode != 0 and why in res.stderr, res.stderr
