"""An env that raises in a step, hangs in one (``rollout.env_timeout_s``), fails its reset or its
privileged hint, inside a real rollout worker with the real HF engine: only that episode fails,
with the error recorded in it, the group stays complete, and the worker goes on (issue 13 item 5). The parser side (garbage
model output) is tests/faults/test_env_parser_fuzz.py."""
from __future__ import annotations

import time

import pytest

from pipeline.core.types import StopReason
from scripted_envs import HANG, play, rollout_worker

pytestmark = pytest.mark.integration


def test_an_env_that_raises_or_hangs_fails_only_its_episode_and_the_worker_goes_on(tiny_model_dir):
    worker = rollout_worker(tiny_model_dir, "steps3_broken", env_timeout_s=2.0)
    try:
        t0 = time.time()
        [group] = play(worker, 1, group_size=6)
        assert not HANG.is_set() and time.time() - t0 < 60  # returned while the hung step still hangs
        # envs are built in parallel threads: find each scripted failure by what it says
        errors = sorted((e.error for e in group.episodes if e.error), key=lambda m: m.split(":")[0])
        assert len(errors) == 4 and all(e.stop_reason is StopReason.ERROR for e in group.episodes if e.error)
        assert any(m.startswith("env step") and "the engine crashed on this action" in m for m in errors)
        assert any(m.startswith("env step") and "rollout.env_timeout_s=2" in m for m in errors)
        assert any(m.startswith("env reset") and "no such game file" in m for m in errors)
        assert any(m.startswith("env reset") and "the test sandbox could not start" in m for m in errors)
        crashed = next(e for e in group.episodes if "crashed" in e.error)
        assert len(crashed.turns) == 1  # its first turn is kept
        healthy = [e for e in group.episodes if not e.error]
        assert len(healthy) == 2 and all(e.stop_reason is StopReason.WON and len(e.turns) == 3 for e in healthy)
        # the worker still plays: the next instances are healthy
        [again] = play(worker, 1, group_size=2)
        assert all(e.stop_reason is StopReason.WON for e in again.episodes)
    finally:
        HANG.set()
        worker.close()
