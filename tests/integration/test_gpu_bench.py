"""scripts/bench/gpu.py end to end on the CPU, at toy sizes, so that the GPU benchmark runs when
a GPU is lent (it is run there rarely, and only what runs here is kept working)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_bench_runs_every_part_on_cpu_and_reports_positive_rates(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench" / "gpu.py"),
        "--device",
        "cpu",
        "--layers",
        "1",
        "--batch",
        "2",
        "4",
        "--prompt-len",
        "8",
        "--new-tokens",
        "4",
        "--reps",
        "1",
        "--score-rows",
        "2",
        "--learn-rows",
        "2",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert r["device"] == "cpu" and r["layers"] == 1
    assert set(r["generate"]["tokens_per_s"]) == {"2", "4"}
    assert all(v > 0 for v in r["generate"]["tokens_per_s"].values())
    assert r["score"]["response_tokens_per_s"] > 0
    learn = r["learn"]
    assert learn["loss_finite"] and learn["tokens_per_s"] > 0 and learn["tokens_per_step"] == 2 * 12
    assert set(r["generate"]["completions_per_s"]) == {"2", "4"} and learn["rows_per_s"] > 0
    # 4 of each row's 12 tokens are response tokens (the rates are rounded to 0.1)
    assert learn["response_tokens_per_s"] == pytest.approx(learn["tokens_per_s"] * 4 / 12, abs=0.1)
    ratios = r["ratios"]
    assert ratios["vs_generate_batch"] == 4
    # rows per completion: learner rows/s over engine completions/s at the largest batch
    assert ratios["learner_rows_per_sampled_completion"] == round(
        learn["rows_per_s"] / r["generate"]["completions_per_s"]["4"], 2
    )
    # per response token: the learner's response tokens/s (not prompt + response) over generated tokens/s
    assert ratios["learner_response_tokens_per_generated_token"] == round(
        learn["response_tokens_per_s"] / r["generate"]["tokens_per_s"]["4"], 2
    )
    assert "learner_tokens_per_generated_token" not in ratios
