"""scripts/bench/learner_phases.py end to end on the tiny model: every variant runs in a process of
its own, each phase of each step has a reading, and the folder is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_reads_every_phase_of_every_variant_and_stores_its_folder(tmp_path):
    out = tmp_path / "phases"
    cmd = [sys.executable, "scripts/bench/learner_phases.py", "--tasks", "1", "--group", "2", "--steps", "2"]
    cmd += ["--variant", "ckpt=learner.gradient_checkpointing=true", "--out", str(out), "model=tiny"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'scripts'}"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    assert set(report["runs"]) == {"default", "ckpt"}
    for run in report["runs"].values():
        assert run["sizes"]["rows"] >= 4 and run["sizes"]["unique_tokens"] < run["sizes"]["tokens"]
        assert len(run["steps"]) == 2
        for step in run["steps"]:  # the sampler saw each phase, inside the process's own peak
            assert all(0.1 < step[p] <= run["peak_gb"] + 0.05 for p in ("forward", "backward", "optimizer_step"))
        assert run["tensors_gb"]["parameters"] > 0
    assert report["runs"]["ckpt"]["overrides"] == ["model=tiny", "learner.gradient_checkpointing=true"]
    assert "optimizer step peak GB" in (out / "table.md").read_text()
