"""The async controller's loops with in-process FAKE rollout workers and a FAKE learner.

The fakes stand in for Ray actors only to test the loops' scheduling (staleness bound, overlap,
version bookkeeping, stop); the real actors are exercised in tests/integration.
"""

import asyncio
import random

import pytest

from pipeline.core.config import PrivyConfig
from pipeline.core.types import Episode, EpisodeGroup, TurnRecord
from pipeline.methods import build_method
from pipeline.orchestration.controller import Controller, task_seed
from pipeline.orchestration.logging import MetricsLogger


class FakeWorker:
    def __init__(self, delay: float, name: str = "t"):
        self.version = 0
        self.delay = delay
        self.name = name
        self.seeds = []

    async def run_group(self, *, task_seed, split, group_size, temperature, sample_seed, **_):
        start_version = self.version
        await asyncio.sleep(self.delay)
        self.seeds.append(task_seed)
        rng = random.Random(sample_seed)
        eps = []
        for _ in range(group_size):
            turn = TurnRecord(
                prompt_ids=[1, 2],
                response_ids=[3, 4],
                behaviour_logprobs=[-1.0, -1.0],
                policy_version=start_version,
                turn_index=0,
                messages=[],
            )
            eps.append(
                Episode(
                    task_id=self.name,
                    env_name="fake",
                    seed=task_seed,
                    turns=[turn],
                    reward=float(rng.random() < 0.5),
                    won=False,
                )
            )
        return EpisodeGroup(
            task_id=self.name,
            seed=task_seed,
            episodes=eps,
            rollout_seconds=self.delay,
            n_generated_tokens=2 * group_size,
        )

    async def set_weights(self, packet):
        self.version = packet


class FakeLearner:
    pad_id = 0

    def __init__(self, delay: float):
        self.delay = delay
        self.trained_versions = []  # per step: the behaviour versions of its rows
        self.version = 0
        self.busy = []

    async def train_step(self, minibatches):
        t0 = asyncio.get_running_loop().time()
        self.trained_versions.append([v for mb in minibatches for v in mb.versions])
        await asyncio.sleep(self.delay)
        self.version += 1
        self.busy.append((t0, asyncio.get_running_loop().time()))
        return {"learner/loss": 0.0}

    async def publish(self, version, workers, scorer=None):
        await asyncio.gather(*[w.set_weights(version) for w in workers])
        return {}


def make_cfg(lag: int, steps: int = 4) -> PrivyConfig:
    cfg = PrivyConfig()
    cfg.trainer.total_steps = steps
    cfg.trainer.groups_per_step = 2
    cfg.trainer.max_policy_lag = lag
    cfg.trainer.val_every = 0
    cfg.rollout.group_size = 2
    return cfg


def run(cfg, workers, learner):
    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    ctl = Controller(cfg, learner=learner, workers=workers, method=method, logger=MetricsLogger([]))
    history = asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    return ctl, history


def test_fake_lag_zero_trains_every_step_on_groups_of_the_current_version():
    learner = FakeLearner(0.01)
    ctl, history = run(make_cfg(lag=0), [FakeWorker(0.01), FakeWorker(0.01)], learner)
    assert len(history) == 4
    for step, versions in enumerate(learner.trained_versions):
        assert set(versions) == {step}
    assert ctl.buffer.stats.consumed == 8 and ctl.buffer.in_flight == 0


def test_fake_tokens_per_second_count_the_groups_played_during_the_first_validation():
    # The first step's groups finish while the validation before it runs; their busy time lies
    # before the step began and still has to divide their tokens (it used to be ~0: 8e9 tokens/s).
    cfg = make_cfg(lag=0, steps=2)
    cfg.trainer.val_at_start, cfg.trainer.val_tasks = True, 2
    _, history = run(cfg, [FakeWorker(0.2)], FakeLearner(0.01))
    # 2 groups x 2 episodes x 2 tokens in about 0.2 s of play: about 40 tokens/s
    assert 5 < history[0]["rollout/tokens_per_s"] < 100
    assert all(0.0 <= h["time/rollout_idle_frac"] <= 1.0 for h in history)


class SplitWorker(FakeWorker):
    """A FAKE worker whose episodes win on the split named ``wins`` only, and that records the
    splits it was asked for."""

    def __init__(self, wins: str):
        super().__init__(0.0)
        self.wins, self.splits = wins, []

    async def run_group(self, *, split, **kw):
        self.splits.append(split)
        group = await super().run_group(split=split, **kw)
        for ep in group.episodes:
            ep.won = split == self.wins
            ep.reward = float(ep.won)
        return group


def test_fake_final_val_splits_are_validated_once_after_the_last_step():
    cfg = make_cfg(lag=0, steps=3)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.val_at_start = 2, 3, True
    cfg.trainer.final_val_splits = ["valid_unseen"]
    cfg.rollout.val_temperatures = [0.0]
    worker = SplitWorker(wins="valid_unseen")
    _, history = run(cfg, [worker], FakeLearner(0.0))
    assert worker.splits.count("valid_unseen") == 3  # the 3 tasks, once, at the end
    assert worker.splits.count(cfg.env.val_split) == 9  # steps 0, 2 and 3
    assert [h.get("final/valid_unseen/success") for h in history] == [None, None, 1.0]
    assert history[-1]["final/valid_unseen/greedy/success"] == 1.0 and history[-1]["val/success"] == 0.0
    assert "time/final/valid_unseen_s" in history[-1]


def test_fake_total_steps_zero_evaluates_the_start_and_the_final_splits_and_plays_no_training_group():
    from pipeline.orchestration.logging import NullSink

    class Rows(NullSink):
        def __init__(self):
            self.rows = []

        def log(self, metrics, step):
            self.rows.append((step, dict(metrics)))

    cfg = make_cfg(lag=0, steps=0)
    cfg.trainer.val_at_start, cfg.trainer.val_tasks = True, 3
    cfg.trainer.final_val_splits = ["valid_unseen"]
    cfg.rollout.val_temperatures = [0.0]
    worker, sink, learner = SplitWorker(wins="valid_unseen"), Rows(), FakeLearner(0.0)
    ctl = Controller(
        cfg,
        learner=learner,
        workers=[worker],
        method=build_method({"name": "grpo"}, invalid_action_penalty=0.1),
        logger=MetricsLogger([sink]),
    )
    history = asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    assert history == [] and learner.trained_versions == [] and ctl.state.step == 0
    assert worker.splits == [cfg.env.val_split] * 3 + ["valid_unseen"] * 3  # no training group
    [(step, row)] = sink.rows
    assert step == 0 and row["val/success"] == 0.0 and row["final/valid_unseen/success"] == 1.0


def test_fake_lag_one_overlaps_rollout_with_training_and_stays_within_the_bound():
    learner = FakeLearner(0.05)
    ctl, history = run(make_cfg(lag=1, steps=6), [FakeWorker(0.05)], learner)
    lags = [step - min(v) for step, v in enumerate(learner.trained_versions)]
    assert max(lags) <= 1
    assert any(lag == 1 for lag in lags)  # rollout ran ahead while the learner trained
    assert all(h["rollout/policy_lag_max"] <= 1 for h in history)


def test_fake_lag_one_trains_the_slow_workers_groups_within_the_bound():
    """Two fast workers and one seven times slower at lag 1: the slow worker's groups are trained
    (the buffer waits for a group that is due instead of dropping it), and no group is too old."""
    import pipeline.orchestration.controller as controller_module

    learner = FakeLearner(0.02)
    trained: list[list[str]] = []
    real = controller_module.rows_of

    def spy(groups):
        trained.append([g.task_id for g in groups])
        return real(groups)

    controller_module.rows_of = spy
    try:
        workers = [FakeWorker(0.02, "fast0"), FakeWorker(0.02, "fast1"), FakeWorker(0.14, "slow")]
        ctl, history = run(make_cfg(lag=1, steps=12), workers, learner)
    finally:
        controller_module.rows_of = real
    flat = [t for step in trained for t in step]
    assert flat.count("slow") >= 2, trained
    lags = [step - min(v) for step, v in enumerate(learner.trained_versions)]
    assert max(lags) <= 1
    m = history[-1]
    assert m["buffer/completed"] - m["buffer/consumed"] <= 4  # nothing piles up or is dropped


def test_fake_task_seeds_follow_the_deterministic_stream():
    worker = FakeWorker(0.0)
    run(make_cfg(lag=0, steps=2), [worker], FakeLearner(0.0))
    assert worker.seeds == [task_seed(0, i) for i in range(4)]


def test_fake_rollout_failure_stops_the_run_with_its_error():
    class Broken(FakeWorker):
        async def run_group(self, **kw):
            raise RuntimeError("env exploded")

    with pytest.raises(RuntimeError, match="env exploded"):
        run(make_cfg(lag=0), [Broken(0.0)], FakeLearner(0.0))


def test_fake_failed_weight_sync_stops_the_run_before_the_next_step():
    """A publish that raises WeightSyncError (a receiver refused a partial or corrupt sync) ends
    the run with a message naming the step; no step trains on the stale weights."""
    from pipeline.distributed.weight_sync import WeightSyncError

    class BrokenSync(FakeLearner):
        async def publish(self, version, workers, scorer=None):
            if version == 2:
                raise WeightSyncError("weights v2: checksum 1.0 != 2.0")
            return await super().publish(version, workers, scorer)

    learner = BrokenSync(0.0)
    with pytest.raises(
        WeightSyncError,
        match=r"stopping the run: syncing the weights of step 2 "
        r"failed \(weights v2: checksum",
    ):
        run(make_cfg(lag=1), [FakeWorker(0.01)], learner)
    assert len(learner.trained_versions) == 2


def test_fake_failed_weight_sync_checkpoints_the_trained_step_then_stops(tmp_path):
    """The step trained before its sync failed: the real Checkpointer saves it (the FAKE
    learner's save writes a file), the message says where to resume, and resuming from it
    continues at the next step."""
    from pipeline.distributed.weight_sync import WeightSyncError
    from pipeline.orchestration.checkpoint import Checkpointer, load_state, resolve_checkpoint

    class BrokenSync(PacketLearner):
        async def publish(self, version, workers, scorer=None):
            if version == 2:
                raise WeightSyncError("weights v2: rollout worker 0 failed: connection reset")
            return await super().publish(version, workers, scorer)

        async def save(self, d):
            (tmp_path / "saved").write_text(str(self.version))

    cfg = make_cfg(lag=0)
    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    learner = BrokenSync(0.0)
    ctl = Controller(
        cfg,
        learner=learner,
        workers=[FakeWorker(0.01)],
        method=method,
        logger=MetricsLogger([]),
        checkpointer=Checkpointer(tmp_path / "run"),
    )
    with pytest.raises(
        WeightSyncError,
        match=r"connection reset\); checkpoint at step 2: resume with "
        r"trainer.resume=RUN_DIR",
    ):
        asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    ckpt = resolve_checkpoint(tmp_path / "run")
    assert ckpt.name == "step_000002" and (tmp_path / "saved").read_text() == "2"
    state = load_state(ckpt)["controller"]
    assert state["step"] == 2 and state["next_task"] >= 4


def test_fake_colocated_vllm_engines_sleep_exactly_while_the_learner_trains():
    events = []

    class SleepyWorker(FakeWorker):
        asleep = False

        async def run_group(self, **kw):
            assert not self.asleep, "a group was played while the engine slept"
            return await super().run_group(**kw)

        async def sleep(self):
            self.asleep = True
            events.append("sleep")

        async def wake_up(self):
            self.asleep = False
            events.append("wake")

    class RecordingLearner(FakeLearner):
        async def train_step(self, minibatches):
            assert all(w.asleep for w in workers)
            events.append("train")
            return await super().train_step(minibatches)

    cfg = make_cfg(lag=0, steps=3)
    cfg.rollout.engine = "vllm"
    cfg.rollout.vllm.enable_sleep_mode = True
    cfg.cluster.colocate = True
    workers = [SleepyWorker(0.01), SleepyWorker(0.01)]
    run(cfg, workers, RecordingLearner(0.01))
    assert events == ["sleep", "sleep", "train", "wake", "wake"] * 3
    events.clear()
    cfg.cluster.colocate = False  # disaggregated engines keep their memory
    workers = [SleepyWorker(0.01)]
    run(cfg, workers, FakeLearner(0.01))
    assert events == []


class FakeScorer:
    """Stands in for the teacher scorer actor: records which loop asked it to score which group."""

    wants_weights = follows_policy = True
    where = "a FAKE scorer"

    def __init__(self, delay: float):
        self.delay, self.version, self.calls = delay, 0, []

    def needs_scoring(self, group) -> bool:  # the surface of TeacherScorer the controller reads
        return any(r.teacher_logprobs is None for r in group.rows())

    async def score(self, groups, step, min_version=0, worker=None):
        self.calls.append((asyncio.current_task().get_name(), groups[0].seed))
        await asyncio.sleep(self.delay)
        for g in groups:
            for r in g.rows():
                r.teacher_logprobs, r.teacher_version = [-1.0] * len(r.response_ids), self.version
        return groups, {"teacher/prompt_tokens_sum": 10.0}

    async def set_weights(self, packet):
        self.version = packet


def test_fake_groups_are_scored_as_they_complete_so_the_learner_never_waits_on_the_teacher():
    """A self-teacher method at lag 1: every group is scored by its rollout loop before it enters
    the buffer, never by the train loop, and each row's teacher is no older than its behaviour
    policy and no newer than the step that trains it."""
    import pipeline.orchestration.controller as controller_module

    scorer = FakeScorer(0.03)

    class Learner(FakeLearner):
        async def publish(self, version, workers, scorer_=None):
            await asyncio.gather(*[w.set_weights(version) for w in [*workers, scorer]])
            return {}

    trained: list[list] = []
    real = controller_module.rows_of

    def spy(groups):
        step = len(trained)
        trained.append(groups)
        for r in (r for g in groups for r in g.rows()):
            assert r.policy_version <= r.teacher_version <= step
        return real(groups)

    method = build_method({"name": "sdar"}, invalid_action_penalty=0.1, env_name="keyword")
    controller_module.rows_of = spy
    try:
        ctl = Controller(
            make_cfg(lag=1, steps=5),
            learner=Learner(0.03),
            workers=[FakeWorker(0.03)],
            method=method,
            logger=MetricsLogger([]),
            scorer=scorer,
        )
        history = asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    finally:
        controller_module.rows_of = real
    assert len(history) == 5 and len(trained) == 5
    loops = {name for name, _ in scorer.calls}
    assert loops and all(name.startswith("rollout") for name in loops), loops
    scored = [seed for _, seed in scorer.calls]
    assert len(scored) == len(set(scored))  # each group once
    assert {g.seed for step in trained for g in step} <= set(scored)
    assert all(h["teacher/rows_scored_frac"] == 1.0 for h in history)


# ----- a worker whose process dies (Ray restarts it: actors.handles.Restartable) ------------------
class DyingWorker(FakeWorker):
    """Dies mid-group once, at its ``die_at``-th group: the call raises ActorDied as the Ray handle
    does; ``revive`` then gives the new process the last published weights."""

    wants_weights = True

    def __init__(self, delay: float, die_at: int):
        super().__init__(delay)
        self.name, self.generation, self.die_at, self.calls = "rollout worker 0", 0, die_at, 0
        self.revived, self.lost_seeds = [], []

    async def run_group(self, **kw):
        from pipeline.core.errors import ActorDied

        self.calls += 1
        if self.calls == self.die_at:
            await asyncio.sleep(self.delay / 2)
            self.lost_seeds.append(kw["task_seed"])
            self.version = 0  # a new process holds the initial weights
            raise ActorDied(self, self.generation, RuntimeError("SIGKILL"))
        assert self.version >= kw["min_version"], "played on weights older than the published ones"
        return await super().run_group(**kw)

    async def revive(self, generation, weights):
        if self.generation > generation:
            return False
        self.generation += 1
        self.revived.append(weights)
        self.version = weights if weights is not None else 0
        return True


class PacketLearner(FakeLearner):
    """Keeps the last published 'packet' (here its version) as the Ray LearnerGroup does."""

    last_packet = None

    async def publish(self, version, workers, scorer=None):
        self.last_packet = version
        return await super().publish(version, workers, scorer)


@pytest.mark.parametrize("lag", [0, 1])
def test_fake_a_dead_worker_is_revived_and_its_group_replayed_from_the_same_seed(lag):
    worker = DyingWorker(0.01, die_at=3)
    learner = PacketLearner(0.01)
    ctl, history = run(make_cfg(lag=lag, steps=4), [worker], learner)
    assert ctl.state.step == 4 and len(history) == 4
    # Revived once, with the weights published last (step 1's at lag 0: calls 1-2 are step 1's
    # groups; at lag 1 the third group may start before that publish).
    assert worker.revived == [1] if lag == 0 else worker.revived in ([None], [1])
    # The lost group is played again, whole, from its task seed; every trained group is complete.
    assert worker.lost_seeds[0] in worker.seeds
    assert sorted(worker.seeds) == sorted(set(worker.seeds))
    assert ctl.state.restarts == 1 and ctl.state.replayed == 1
    assert history[-1]["faults/restarts"] == 1 and history[-1]["faults/replayed_groups"] == 1


def test_fake_a_death_seen_by_several_loops_revives_the_worker_once():
    """Two groups in flight on one worker when it dies: both are replayed, one revive."""
    from pipeline.core.errors import ActorDied

    class TwoDie(DyingWorker):
        async def run_group(self, **kw):
            self.calls += 1
            if self.calls in (3, 4):
                gen = self.generation
                await asyncio.sleep(self.delay)
                self.lost_seeds.append(kw["task_seed"])
                raise ActorDied(self, gen, RuntimeError("SIGKILL"))
            return await FakeWorker.run_group(self, **kw)

    worker = TwoDie(0.02, die_at=0)
    ctl, _ = run(make_cfg(lag=1, steps=4), [worker], PacketLearner(0.01))
    assert ctl.state.restarts == 1 and ctl.state.replayed == 2
    assert set(worker.lost_seeds) <= set(worker.seeds)


def test_fake_a_worker_that_cannot_be_restarted_stops_the_run_with_the_cause():
    class Gone(DyingWorker):
        async def revive(self, generation, weights):
            raise RuntimeError("rollout worker 0 died and Ray will not restart it (cluster.max_restarts used up)")

    with pytest.raises(RuntimeError, match="max_restarts used up"):
        run(make_cfg(lag=0), [Gone(0.01, die_at=2)], PacketLearner(0.0))


class NodeLostWorker(DyingWorker):
    """Dies at its ``die_at``-th group with its node: Ray can place it again only once a node
    joins (``joined``); until then a revive that may wait forever waits, one that may not fails."""

    def __init__(self, delay: float, die_at: int, name: str):
        super().__init__(delay, die_at)
        self.name, self.joined, self.revive_calls = name, asyncio.Event(), []

    async def revive(self, generation, weights, forever=False):
        self.revive_calls.append(forever)
        if not forever:
            raise RuntimeError(f"{self.name} did not come back within 900 s of dying")
        await self.joined.wait()
        return await super().revive(generation, weights)


def _events(capsys) -> list[str]:
    return [x.split(":")[1].strip() for x in capsys.readouterr().err.splitlines() if x.startswith("privy-rl: ")]


def test_fake_a_worker_lost_with_its_node_leaves_the_run_degraded_then_rejoins_with_the_current_weights(capsys):
    """rollout.min_workers=1 of 2: the run goes on with the other worker (the lost group replayed
    there), says it is degraded, and takes the worker back with the last published weights once
    Ray can place it again; never a group on stale weights (DyingWorker asserts it)."""
    lost = NodeLostWorker(0.02, die_at=2, name="rollout worker 0")
    other = FakeWorker(0.02, name="rollout worker 1")
    cfg = make_cfg(lag=1, steps=8)
    cfg.rollout.num_workers, cfg.rollout.min_workers = 2, 1
    learner = PacketLearner(0.01)
    seen: list[float] = []

    class Logger(MetricsLogger):
        def log(self, metrics, step):
            seen.append(metrics["rollout/live_workers"])
            if step == 4:
                lost.joined.set()  # a node joins after step 4
            super().log(metrics, step)

    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    ctl = Controller(cfg, learner=learner, workers=[lost, other], method=method, logger=Logger([]))
    history = asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    assert len(history) == 8 and ctl.state.replayed == 1 and lost.revive_calls == [True]
    assert 1 in seen[:4] and seen[-1] == 2, seen  # degraded, then whole again
    assert lost.revived == [None] and lost.version >= 4  # given the weights published by then
    assert lost.lost_seeds[0] in other.seeds + lost.seeds  # its lost group was played again
    events = _events(capsys)
    assert "degraded" in events and "worker_back" in events and events.index("degraded") < events.index("worker_back")


def test_fake_below_rollout_min_workers_the_run_waits_for_the_worker_and_stops_when_it_does_not_come_back():
    lost = NodeLostWorker(0.02, die_at=2, name="rollout worker 0")
    cfg = make_cfg(lag=0, steps=4)
    cfg.rollout.num_workers = 2  # min_workers null: all of them
    with pytest.raises(RuntimeError, match="did not come back within 900 s"):
        method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
        ctl = Controller(
            cfg, learner=PacketLearner(0.0), workers=[lost, FakeWorker(0.02)], method=method, logger=MetricsLogger([])
        )
        asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    assert lost.revive_calls == [False]


def test_fake_a_dead_scorer_is_revived_and_the_same_group_scored_never_trained_without_it():
    from pipeline.core.errors import ActorDied

    class DyingScorer(FakeScorer):
        name, generation, died = "teacher scorer", 0, 0

        async def score(self, groups, step, min_version=0, worker=None):
            if self.died == 0 and len(self.calls) == 2:
                self.died = 1
                raise ActorDied(self, self.generation, RuntimeError("SIGKILL"))
            return await super().score(groups, step, min_version)

        async def revive(self, generation, weights):
            self.generation += 1
            self.version = weights or 0
            return True

    scorer = DyingScorer(0.0)
    trained = []

    class Learner(PacketLearner):
        async def train_step(self, minibatches):
            trained.extend(mb for mb in minibatches)
            return await super().train_step(minibatches)

    cfg = make_cfg(lag=0, steps=3)
    method = build_method({"name": "sdar"}, invalid_action_penalty=0.1)
    ctl = Controller(
        cfg, learner=Learner(0.0), workers=[FakeWorker(0.01)], method=method, logger=MetricsLogger([]), scorer=scorer
    )
    asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    assert scorer.died == 1 and ctl.state.step == 3 and ctl.state.restarts == 1 and ctl.state.replayed == 0
    assert all(mb.distill.teacher_logprobs is not None for mb in trained)


# ----- the collective weight sync: a restarted consumer joins a new weight group -----------------
class CollectiveLearner(FakeLearner):
    """Has a weight group, as the Ray LearnerGroup does with cluster.weight_sync=collective; the
    ``die_in`` publish (1-based) fails the first time because ``victim`` died in the broadcast."""

    def __init__(self, delay: float, victim=None, die_in: int = 0):
        super().__init__(delay)
        self.weight_group = {"world_size": 2}
        self.victim, self.die_in = victim, die_in
        self.published, self.reforms = [], 0

    async def reform_weight_group(self, workers, scorer=None):
        self.reforms += 1

    async def publish(self, version, workers, scorer=None):
        from pipeline.core.errors import ActorDied

        self.published.append(version)
        if len(self.published) == self.die_in:
            self.victim.version = 0  # the new process holds the initial weights
            raise ActorDied(self.victim, self.victim.generation, RuntimeError("gloo: connection reset"))
        return await super().publish(version, workers, scorer)


def test_fake_collective_a_worker_dead_in_a_rollout_call_rejoins_a_new_group_with_current_weights():
    worker = DyingWorker(0.01, die_at=3)  # dies in its first group of step 2 (lag 0)
    learner = CollectiveLearner(0.01)
    ctl, history = run(make_cfg(lag=0, steps=4), [worker], learner)
    assert ctl.state.step == 4 and ctl.state.restarts == 1 and ctl.state.replayed == 1
    assert worker.revived == [None]  # no object-store packet: the new group carries the weights
    assert learner.reforms == 1
    # The re-formed group got the published version (1) again before the replayed group played.
    assert learner.published == [1, 1, 2, 3, 4]
    assert worker.lost_seeds[0] in worker.seeds


def test_fake_collective_a_worker_dead_in_the_broadcast_rejoins_and_the_broadcast_is_repeated():
    worker = DyingWorker(0.01, die_at=0)
    learner = CollectiveLearner(0.01, victim=worker, die_in=2)
    ctl, history = run(make_cfg(lag=0, steps=4), [worker], learner)
    assert ctl.state.step == 4 and ctl.state.restarts == 1 and ctl.state.replayed == 0
    assert learner.reforms == 1 and learner.published == [1, 2, 2, 3, 4]
    assert worker.version == 4


def test_fake_collective_a_consumer_that_cannot_come_back_stops_with_a_weight_sync_error():
    from pipeline.distributed.weight_sync import WeightSyncError

    class Gone(DyingWorker):
        async def revive(self, generation, weights):
            raise RuntimeError("rollout worker 0 died and Ray will not restart it (cluster.max_restarts used up)")

    worker = Gone(0.01, die_at=0)
    with pytest.raises(WeightSyncError, match="will not restart it"):
        run(make_cfg(lag=0, steps=4), [worker], CollectiveLearner(0.01, victim=worker, die_in=2))


def test_fake_actor_a_hung_group_kills_its_worker_once_however_many_calls_timed_out(monkeypatch):
    """RayRollout over a FAKE Ray actor whose run_group never answers: every call in flight times
    out (rollout.group_timeout_s) and raises ActorDied of the same generation; the process is
    killed once, with a restart allowed."""
    import ray

    from actors.handles import ActorDied, RayRollout

    class Method:
        def remote(self, **kw):
            return asyncio.sleep(3600)

    class HungActor:
        run_group = Method()

    kills = []
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart: kills.append((actor, no_restart)))
    handle = RayRollout(HungActor(), "rollout worker 0", group_timeout_s=0.05)

    async def main():
        return await asyncio.gather(*[handle.run_group(task_seed=i) for i in range(3)], return_exceptions=True)

    errors = asyncio.run(main())
    assert all(isinstance(e, ActorDied) and e.generation == 0 for e in errors), errors
    assert "group_timeout_s=0.05" in str(errors[0])
    assert len(kills) == 1 and kills[0][1] is False


def test_rollout_metrics_give_each_criterion_pass_rate_over_the_episodes_judged_on_it():
    """code_edit's tests_pass moves long before task success does; a criterion an episode has no
    verdict on (param_added_and_used outside add_param tasks) does not count against it."""
    from pipeline.core.types import CriterionResult
    from pipeline.orchestration.step_metrics import rollout_metrics

    def ep(verdicts):
        return Episode(
            task_id="t",
            env_name="code_edit",
            seed=0,
            won=all(verdicts.values()),
            criteria=[CriterionResult(criterion=c, passed=p) for c, p in verdicts.items()],
        )

    episodes = [
        ep({"tests_pass": True, "param_added_and_used": False}),
        ep({"tests_pass": True}),
        ep({"tests_pass": False}),
    ]
    group = EpisodeGroup(task_id="t", seed=0, episodes=episodes)
    m = rollout_metrics([group], invalid_penalty=0.1)
    assert m["rollout/criteria/tests_pass"] == pytest.approx(2 / 3)
    assert m["rollout/criteria/param_added_and_used"] == 0.0
    assert m["rollout/success"] == pytest.approx(1 / 3)
    assert not any(
        k.startswith("rollout/criteria/")
        for k in rollout_metrics(
            [EpisodeGroup(task_id="u", seed=0, episodes=[Episode(task_id="u", env_name="keyword", seed=0)])], 0.1
        )
    )


class FlakyEnvWorker(FakeWorker):
    """A FAKE worker whose env cuts episodes short: the first episode of every group, and every
    episode of the first ``whole`` groups it plays (``Episode.error``, as RolloutWorker records a
    reset/step exception or timeout)."""

    def __init__(self, whole: int = 1):
        super().__init__(0.0)
        self.whole, self.played = whole, 0

    async def run_group(self, **kw):
        group = await super().run_group(**kw)
        self.played += 1
        for i, ep in enumerate(group.episodes):
            if i == 0 or self.played <= self.whole:
                ep.error, ep.reward, ep.turns[0].behaviour_logprobs = "step: TimeoutError", 0.0, [-9.0, -9.0]
        return group


def test_fake_env_errors_leave_statistics_and_batch_and_a_group_with_none_is_played_again():
    cfg = make_cfg(lag=0, steps=3)
    cfg.rollout.group_size = 3
    learner, worker = FakeLearner(0.0), FlakyEnvWorker(whole=1)
    batches = []
    learner_step = learner.train_step

    async def spy(minibatches):
        batches.append(minibatches)
        return await learner_step(minibatches)

    learner.train_step = spy
    ctl, history = run(cfg, [worker], learner)
    for mbs in batches:  # every trained row was completed by its env: no -9 log-probs
        assert all((mb.behaviour_logprobs[mb.response_mask > 0] > -5).all() for mb in mbs)
        assert sum(mb.n_rows for mb in mbs) == 2 * 2  # 2 groups x the 2 episodes the env completed
    assert ctl.state.env_error_groups == 1 and ctl.state.env_error_episodes == 3 + 6
    assert history[-1]["faults/env_error_groups"] == 1
    assert worker.played == 7  # 6 groups trained + the one played again
    assert worker.seeds.count(task_seed(cfg.trainer.seed, 0)) == 2  # the task whose env failed whole, replayed


def test_fake_an_env_that_fails_every_episode_stops_the_run_naming_the_error():
    cfg = make_cfg(lag=0, steps=2)
    # both tasks of the step fail whole and are replayed side by side: either may reach the limit first
    stop = r"every episode of training task [01] ended in an env error, 3 times in a row.*TimeoutError"
    with pytest.raises(RuntimeError, match=stop):
        run(cfg, [FlakyEnvWorker(whole=100)], FakeLearner(0.0))


def test_gap_statistics_of_the_teacher_and_its_noise_floor():
    from pipeline.orchestration.step_metrics import gap_statistics

    got = gap_statistics("noise", [([-1.0, -2.0], [-1.5, -1.0]), ([0.0], [0.0])])  # gaps 0.5, -1.0, 0.0
    assert got["noise/gap_mean"] == pytest.approx(-1 / 6)
    assert got["noise/gap_abs_mean"] == pytest.approx(0.5)
    assert got["noise/negative_gap_fraction"] == pytest.approx(1 / 3)
    assert got["noise/gap_std"] == pytest.approx((((0.5 + 1 / 6) ** 2 + (-1 + 1 / 6) ** 2 + (1 / 6) ** 2) / 2) ** 0.5)
    assert gap_statistics("teacher", []) == {}


class ViewWorker(FakeWorker):
    """A FAKE worker that records, per call, the split, the student view it was given and whether
    demonstrations were asked for."""

    def __init__(self):
        super().__init__(0.0)
        self.calls = []

    async def run_group(self, *, split, view=None, demonstrate=False, **kw):
        self.calls.append((split, view, demonstrate))
        return await super().run_group(split=split, **kw)


class BehaviourScorer:
    """A FAKE teacher scorer (the loops' bookkeeping only): lpT = the behaviour log-probs. (Not
    ``FakeScorer``: a second class of that name shadowed the first for the tests above it.)"""

    wants_weights = follows_policy = True
    where = "a FAKE scorer"

    def __init__(self, method):
        self.spec = method.teacher_spec()

    def needs_scoring(self, group) -> bool:
        return any(r.teacher_logprobs is None for e in group.episodes for r in e.turns if self.spec.selects(e, r))

    async def score(self, groups, step, min_version=0, worker=None):
        for g in groups:
            for r in g.rows():
                r.teacher_logprobs, r.teacher_version = list(r.behaviour_logprobs), step
        return groups, {"teacher/prompt_tokens_sum": 0.0}


@pytest.mark.parametrize("name", ["sdar_hints", "hint_imitation"])
def test_fake_training_and_plain_validation_get_the_students_view_only_the_privileged_replay_a_hint(name):
    method = build_method({"name": name}, invalid_action_penalty=0.1, env_name="keyword")
    cfg = make_cfg(lag=0, steps=2)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.val_at_start = 1, 2, True
    cfg.trainer.final_val_splits = ["test"]
    cfg.rollout.val_temperatures = [0.0]
    worker = ViewWorker()
    scorer = BehaviourScorer(method) if method.teacher_spec() is not None else None
    ctl = Controller(
        cfg, learner=FakeLearner(0.0), workers=[worker], method=method, logger=MetricsLogger([]), scorer=scorer
    )
    asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    assert method.student_view() is None
    train = [c for c in worker.calls if c[0] == "train"]
    held_out = [c for c in worker.calls if c[0] != "train"]
    assert len(train) == 4 and all(view is None for _, view, _ in train)
    assert all(demo == (name == "hint_imitation") for _, _, demo in train)
    assert not any(demo for _, _, demo in held_out)
    plain = [c for c in held_out if c[1] is None]
    privileged = [c for c in held_out if c[1] is not None]
    assert len(plain) == 2 * (3 + 1)  # 2 tasks at steps 0, 1, 2 and the test split
    # only a teacher's privileged validation replays the tasks with the hint, never in training
    assert len(privileged) == (len(plain) if name == "sdar_hints" else 0)


def test_the_noise_floor_check_refuses_a_teacher_noisier_than_its_signal_and_names_both_numbers():
    from pipeline.core.config import ConfigError
    from pipeline.orchestration.step_metrics import check_noise_floor, gap_statistics

    quiet = {
        **gap_statistics("teacher", [([-1.0, -2.0], [-1.5, -1.0])]),
        **gap_statistics("noise", [([-1.5], [-1.49])]),
    }
    check_noise_floor(quiet, 1.0, "x")  # floor 0.01 against a signal of 0.75
    noisy = {**quiet, **gap_statistics("noise", [([-1.5, -0.2], [-1.0, -1.0])])}  # floor 0.65
    with pytest.raises(ConfigError, match=r"noise floor.* is 0\.6500 .*0\.87x its signal .*\(0\.7500\)"):
        check_noise_floor(noisy, 0.5, "rollout.precision=bf16, teacher: scorer.precision=fp32")
    check_noise_floor(noisy, None, "x")  # null: never refuse
    check_noise_floor({"teacher/gap_abs_mean": 0.1}, 0.5, "x")  # no floor measured (noise_floor=false)


def test_fake_time_limit_makes_the_step_that_ends_past_it_the_last_one_with_validation_and_final_splits():
    # trainer.time_limit_s: the first step that ends past the limit is trained, then validated,
    # evaluated on the final splits and checkpointed like the step total_steps would have been.
    cfg = make_cfg(lag=0, steps=200)
    cfg.trainer.val_every, cfg.trainer.val_tasks = 100, 2
    cfg.trainer.final_val_splits = ["valid_unseen"]
    cfg.rollout.val_temperatures = [0.0]
    cfg.trainer.time_limit_s = 0.25
    worker = SplitWorker(wins="valid_unseen")
    ctl, history = run(cfg, [worker], FakeLearner(0.1))  # a step takes about 0.1 s
    assert 2 <= len(history) <= 20 and ctl.state.step == len(history)
    assert ctl.time_limited
    assert history[-1]["final/valid_unseen/success"] == 1.0 and "val/success" in history[-1]
    assert history[-1]["trainer/time_limited"] == 1.0
    assert all("val/success" not in h and "trainer/time_limited" not in h for h in history[:-1])
    assert worker.splits.count("valid_unseen") == 2  # the final split once, at the end
    assert ctl.buffer.in_flight == 0


def test_fake_without_a_time_limit_the_run_trains_every_step():
    cfg = make_cfg(lag=1, steps=5)
    ctl, history = run(cfg, [FakeWorker(0.0)], FakeLearner(0.0))
    assert len(history) == 5 and not ctl.time_limited


def test_fake_a_worker_lost_for_good_during_a_validation_keeps_the_trained_step_in_a_checkpoint(tmp_path):
    """Step 2 trained, then its validation lost the only worker for good (Ray's max_restarts used
    up, as when its memory monitor kills it again and again): the run stops naming the cause and
    where to resume, with step 2 in a checkpoint, though no checkpoint was due (ckpt_every=0)."""
    from pipeline.orchestration.checkpoint import Checkpointer, load_state, resolve_checkpoint

    class GoneInValidation(DyingWorker):
        async def run_group(self, **kw):
            if kw["split"] != "train" and self.calls >= 4:  # a validation, after the 4 training groups of steps 1-2
                self.die_at = self.calls + 1
            return await super().run_group(**kw)

        async def revive(self, generation, weights):
            raise RuntimeError("rollout worker 0 died and Ray will not restart it (cluster.max_restarts used up)")

    class Saver(PacketLearner):
        async def save(self, d):
            (tmp_path / "saved").write_text(str(self.version))

    cfg = make_cfg(lag=0, steps=4)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.ckpt_every = 2, 2, 0
    method = build_method({"name": "grpo"}, invalid_action_penalty=0.1)
    ctl = Controller(
        cfg,
        learner=Saver(0.0),
        workers=[GoneInValidation(0.0, die_at=0)],
        method=method,
        logger=MetricsLogger([]),
        checkpointer=Checkpointer(tmp_path / "run"),
    )
    resume = r"max_restarts used up\); checkpoint at step 2: resume with trainer\.resume="
    with pytest.raises(RuntimeError, match=resume):
        asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    ckpt = resolve_checkpoint(tmp_path / "run")
    assert ckpt.name == "step_000002" and (tmp_path / "saved").read_text() == "2"
    assert load_state(ckpt)["controller"]["step"] == 2


def test_fake_privileged_val_ends_replays_with_the_teachers_context_at_step_0_and_the_last_step_only():
    # trainer.privileged_val=ends: the privilege gap at the start and the end of the run, never on
    # the final splits; the plain validations are the same as with "every".
    method = build_method({"name": "sdar_hints"}, invalid_action_penalty=0.1, env_name="keyword")
    cfg = make_cfg(lag=0, steps=3)
    cfg.trainer.val_every, cfg.trainer.val_tasks, cfg.trainer.val_at_start = 1, 2, True
    cfg.trainer.final_val_splits = ["test"]
    cfg.rollout.val_temperatures = [0.0]
    cfg.trainer.privileged_val = "ends"
    worker = ViewWorker()
    ctl = Controller(
        cfg, learner=FakeLearner(0.0), workers=[worker], method=method, logger=MetricsLogger([]),
        scorer=BehaviourScorer(method),
    )  # fmt: skip
    history = asyncio.run(asyncio.wait_for(ctl.run(), timeout=30))
    held_out = [c for c in worker.calls if c[0] != "train"]
    assert len([c for c in held_out if c[1] is None]) == 2 * (4 + 1)  # steps 0-3 and the test split
    privileged = [c for c in held_out if c[1] is not None]
    assert len(privileged) == 2 * 2 and {c[0] for c in privileged} == {cfg.env.val_split}
    assert ["val/privilege_gap" in h for h in history] == [False, False, True]  # step 0 is not in history
    assert not any(k.startswith("final/test/privilege") for h in history for k in h)


def test_a_learning_teacher_under_a_retirement_rule_gets_its_sr_t_at_every_validation_under_ends():
    from types import SimpleNamespace

    from pipeline.orchestration.validator import Validator

    # retiring_targeted_guidance's teacher is the policy itself: SR_T is its success with the
    # feedback, measured at each window end, so "ends" cannot skip it; a frozen or absent SR_T
    # need (SDAR, GRPO) can.
    needs = {n: build_method({"name": n}, invalid_action_penalty=0.1).needs_privileged_success for n in
             ("retiring_targeted_guidance", "sdar", "grpo")}  # fmt: skip
    assert needs == {"retiring_targeted_guidance": True, "sdar": False, "grpo": False}
    cfg = make_cfg(lag=0)
    for mode, need, expected in [("every", False, [True] * 4), ("ends", False, [True, False, True, False]),
                                 ("ends", True, [True, True, True, False])]:  # fmt: skip
        cfg.trainer.privileged_val = mode
        v = Validator(cfg, None, SimpleNamespace(needs_privileged_success=need), events=None, outcomes=None)
        got = [v._privileged(0, "val", False), v._privileged(2, "val", False), v._privileged(4, "val", True),
               v._privileged(4, "final/test", False)]  # fmt: skip
        assert got == (expected if mode == "ends" else [True] * 4), (mode, need)
