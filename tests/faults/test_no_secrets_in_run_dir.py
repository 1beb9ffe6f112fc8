"""No secret reaches the run directory: a real run (with the wandb sink on, offline) started with
a wandb key and *KEY* / *TOKEN* variables in its environment writes none of their values to its
logs, config, metrics, events or checkpoints (issue 13 item 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "WANDB_API_KEY": "a" * 8 + "wandbsecret0123456789abcdef0123456789",
    "HF_TOKEN": "hf_tokensecretABCDEFGHIJ",
    "MY_SERVICE_API_KEY": "svc-keysecret-42",
}


def test_a_run_writes_no_secret_from_its_environment(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, **SECRETS}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            "model=tiny",
            "env=keyword",
            "trainer.total_steps=2",
            "trainer.groups_per_step=1",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "trainer.val_every=2",
            "trainer.val_tasks=1",
            "trainer.ckpt_every=1",
            "logger.progress=false",
            "logger.wandb=true",
            "logger.wandb_mode=offline",
            "learner.precision=fp32",
            "rollout.precision=fp32",
            f"trainer.run_dir={run}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name == "controller.pt" for p in files) and any(".wandb" in str(p) or "wandb" in p.name for p in files)
    leaks = []
    for p in files:
        data = p.read_bytes()
        leaks += [(str(p.relative_to(run)), k) for k, v in SECRETS.items() if v.encode() in data]
    for stream in (r.stdout, r.stderr):
        leaks += [("<console>", k) for k, v in SECRETS.items() if v in stream]
    assert not leaks, leaks
