"""An env that raises in a step, hangs in one (``rollout.env_timeout_s``), fails its reset or its
privileged hint, inside a real rollout worker with the real HF engine: only that episode fails,
with the error recorded in it, the group stays complete, and the worker goes on (issue 13 item 5).
The parser side (garbage model output) is tests/faults/test_env_parser_fuzz.py."""

from __future__ import annotations

import time

import pytest
from scripted_envs import HANG, play, rollout_worker

from pipeline.core.types import StopReason

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


def test_a_training_task_whose_env_always_fails_is_replayed_then_stops_the_real_run(ray_local, tmp_path):
    """A real run (Ray actors, DeepSpeed learner, tiny model) on ALFWorld's real engine whose one
    training game file is corrupted after generation: every episode of each group ends in an env
    error, so no group reaches the learner (an env's failure is not the policy's); the task is
    played again, counted, and after MAX_ENV_ERROR_REPLAYS the run stops naming the error."""
    import json

    from envs import make_env
    from pipeline.orchestration.env_errors import MAX_ENV_ERROR_REPLAYS
    from pipeline.orchestration.run import run_training
    from pipeline.tools.cli import compose

    games = tmp_path / "games"
    opts = {"max_receptacles": 6, "max_objects": 6, "n_tasks": 1, "max_turns": 2, "cache_dir": str(games)}
    env = make_env("alfworld", opts, split="train")
    env.reset(0)  # generates (and caches) the one training game
    env.close()
    [game] = list(games.rglob("game.tw-pddl"))
    game.write_text("{ this is not a game")
    cfg = compose(
        [
            "model=tiny",
            "env=alfworld",
            "env.options.max_receptacles=6",
            "env.options.max_objects=6",
            "env.options.n_tasks=1",
            "env.options.max_turns=2",
            f"+env.options.cache_dir={games}",
            "rollout.max_new_tokens=8",
            "rollout.group_size=2",
            "trainer.groups_per_step=1",
            "trainer.total_steps=2",
            "trainer.val_every=0",
            "trainer.ckpt_every=0",
            "logger.progress=false",
        ]
    )
    with pytest.raises(Exception, match=r"every episode of training task \d+ ended in an env error"):
        run_training(cfg, tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    errors = [e for e in events if e["event"] == "env_error"]
    assert len(errors) == MAX_ENV_ERROR_REPLAYS and all(e["kept"] == 0 and e["episodes"] == 2 for e in errors)
    assert "env reset" in errors[0]["error"]
