"""scripts/gpu_check.sh's payload handling, its phase runner's report (scripts/gpu_check.py run)
and its run assertions, on CPU.

The payload arrives on the GPU machine as parts sent back to back; a part lost (the machine drops
what it received after 30 s idle) or corrupted must stop the check at once with exit 3, naming
it, before any phase spends the device's 15 minutes. The whole check runs in CI as
`scripts/gpu_check.sh --cpu` (.ci/run).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import lzma
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(gpu_check)


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


def _runner(tmp_path: Path, budget_left: float = 600.0):
    (tmp_path / "out").mkdir(exist_ok=True)
    check = gpu_check.Check(
        cpu=True, out=tmp_path / "out", stage=tmp_path, site=tmp_path, work=tmp_path, budget=600, phases=None
    )
    check.deadline = time.time() + budget_left
    return check


def _py(code: str) -> "gpu_check.Step":
    return gpu_check.Step([sys.executable, "-c", code])


def _report(check) -> list[str]:
    return (check.out / "report.txt").read_text().splitlines()


def test_a_phase_past_its_timeout_is_stopped_and_fails_naming_its_last_detail(tmp_path):
    check = _runner(tmp_path)
    slow = _py("import time; print('DETAIL: warming up', flush=True); time.sleep(60)")
    # 5 s: a loaded 2-core machine can take over 1 s to start the child and print its detail
    assert gpu_check.run_phase(check, gpu_check.Phase("slow", 5, lambda c, s: [slow])) == 124
    [row] = _report(check)
    assert row.startswith("slow       FAIL") and row.endswith("timed out after 5 s; last: warming up"), row
    assert check.failed


def test_a_step_that_fails_on_the_way_fails_the_phase_with_exit_1_and_its_error_line(tmp_path):
    check = _runner(tmp_path)
    steps = [_py("import sys; print('ValueError: no such model', file=sys.stderr); sys.exit(2)"), _py("print('never')")]
    assert gpu_check.run_phase(check, gpu_check.Phase("train", 60, lambda c, s: steps)) == 1
    [row] = _report(check)
    assert row.startswith("train      FAIL") and row.endswith("exit 1: ValueError: no such model"), row
    assert "never" not in (check.out / "train.log").read_text()


def test_a_check_passes_with_its_detail_and_skips_say_why(tmp_path):
    check = _runner(tmp_path)
    ok = gpu_check.Phase("ray", 60, lambda c, s: [_py("print('x')")], lambda c: _py("print('DETAIL: 2 actors')"))
    assert gpu_check.run_phase(check, ok) == 0

    def no_gpu(c, s):
        raise gpu_check.Skip("--cpu: needs CUDA")

    assert gpu_check.run_phase(check, gpu_check.Phase("gpu_tests", 60, no_gpu)) == gpu_check.SKIP_RC
    exits_77 = gpu_check.Phase("setup", 60, lambda c, s: [_py("print('no payload'); raise SystemExit(77)")])
    assert gpu_check.run_phase(check, exits_77) == gpu_check.SKIP_RC
    check.phases = "train"
    assert gpu_check.run_phase(check, ok) is None
    check.phases, check.deadline = None, time.time() + 20  # less than a phase's minimum left
    assert gpu_check.run_phase(check, ok) is None
    rows = _report(check)
    assert rows[0].startswith("ray        PASS") and rows[0].endswith("  2 actors")
    assert rows[1].endswith("  --cpu: needs CUDA") and rows[1].startswith("gpu_tests  SKIP")
    assert rows[2].startswith("setup      SKIP") and rows[2].endswith("  no payload")
    assert rows[3] == "ray        SKIP    0 s  not asked (--phases train)"
    assert rows[4].startswith("ray        SKIP    0 s  out of time: 1") and not check.failed
