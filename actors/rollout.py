"""Rollout worker: plays groups (the G episodes of one task) against single-use envs, many at once.

The Ray actor is threaded: every ``run_group`` call the controller has admitted runs in a thread
of its own, so a worker holds as many groups in flight as the staleness admission lets start.
Within a group each episode advances on its own: its next prompt is built from the env's messages
(the last ``history_length`` turns; older history is dropped first when the prompt would exceed
``max_prompt_tokens``, the task itself never) and submitted to the worker's one ``TurnBatcher``
the moment its env step returns; the batcher puts every pending turn of every group into one
``generate`` call. Env ``reset``/``step`` run in a bounded pool (``rollout.env_workers`` threads
for envs that declare themselves ``thread_safe``, one thread otherwise, e.g. ALFWorld's PDDL
engine), off the generation path, each under ``rollout.env_timeout_s``: an env that raises or
hangs ends its episode as failed (``Episode.error``, ``StopReason.ERROR``), the group stays
complete and the worker goes on.

Every assistant turn becomes a TurnRecord carrying exactly the sampled token ids, their log-probs
under the distribution actually sampled, and the weights version that sampled them. New weights
(``set_weights``) are loaded by the batcher between two ``generate`` calls, so episodes in flight
are never dropped; a group then records mixed versions and the buffer judges it by its oldest turn.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from actors.engines.base import request_seed
from actors.handles import WeightsLost
from actors.turn_batcher import Request, Sampling, TurnBatcher
from envs import make_env
from envs.base import Observation, TextEnv
from pipeline.context.providers import StudentView
from pipeline.context.student_prompts import StudentPrompts
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.types import Episode, EpisodeGroup, StopReason, TurnRecord
from pipeline.distributed.weight_sync import WeightPacket, verify


class RolloutWorker:
    """Plain class (testable without Ray); ``pipeline.orchestration.launch`` wraps it with ``ray.remote``."""

    def __init__(
        self,
        cfg: RolloutConfig,
        env_cfg: EnvConfig,
        model_path: str,
        *,
        worker_id: int = 0,
        engine=None,
        threads: int | None = None,
        chat_template: str | None = None,
    ):
        self.cfg = cfg
        self.env_cfg = env_cfg
        self.worker_id = worker_id
        self.threads = set_threads(threads)
        self.precision = choose_precision(cfg.precision, "cuda" if cfg.num_gpus > 0 else "cpu")
        if engine is None:
            from actors.engines import make_engine

            engine = make_engine(cfg, model_path, dtype=self.precision.dtype, chat_template=chat_template)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.prompts = StudentPrompts(
            self.tokenizer, max_prompt_tokens=cfg.max_prompt_tokens, history_length=env_cfg.history_length
        )
        self._pending: tuple[dict, int] | None = None
        self._lock = threading.Lock()  # guards _pending and _received
        self._received = 0  # the newest weights version received (queued or applied)
        # Only the batcher's thread touches the engine (it is not thread-safe).
        if cfg.engine == "vllm" and cfg.vllm.continuous:
            from actors.continuous_batcher import ContinuousBatcher

            self.batcher = ContinuousBatcher(
                engine,
                max_batch=cfg.max_batch,
                apply_weights=self.apply_pending_weights,
                weights_pending=lambda: self._pending is not None,
            )
        else:
            self.batcher = TurnBatcher(
                engine,
                max_batch=cfg.max_batch,
                max_tokens=cfg.max_batch_tokens,
                apply_weights=self.apply_pending_weights,
                wait_s=cfg.batch_wait_s,
            )
        from envs import env_class

        # Envs whose native code is not thread-safe (ALFWorld's PDDL engine) step one at a time.
        shared = getattr(env_class(env_cfg.name), "thread_safe", False)
        self.env_pool = ThreadPoolExecutor(max_workers=cfg.env_workers if shared else 1, thread_name_prefix="env")

    @property
    def version(self) -> int:
        return self.engine.version

    def hardware(self) -> dict:
        """Precision and torch threads of this actor (logged by the driver at launch)."""
        return hardware_info(self.precision, self.threads)

    # ----- weights -------------------------------------------------------------------------------
    def set_weights(self, packet: WeightPacket) -> int:
        """Check and queue new weights; they are applied at the next turn boundary."""
        verify(packet)  # completeness + checksum; the engine load is strict on names
        with self._lock:
            self._pending = (packet.state_dict, packet.version)
            self._received = max(self._received, packet.version)
        return packet.version

    def apply_pending_weights(self) -> bool:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        self.engine.load_state_dict(*pending)
        return True

    # Collective route (pipeline/distributed/collective_sync.py). Like set_weights they run in an
    # actor thread of their own while groups are being played, and only queue the weights.
    def init_weight_group(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        meta,
        bucket_bytes: int,
        timeout_s: float | None = None,
    ) -> int:
        """Join the learner's weight group as ``rank``; ``meta`` = the learner's ``sync_meta()``."""
        from pipeline.distributed.collective_sync import WeightReceiver

        self._receiver = WeightReceiver(host, port, rank, world_size, backend, meta, bucket_bytes, timeout_s)
        return rank

    def receive_weights(self, version: int) -> int:
        """Receive one broadcast into a fresh dict, check it, queue it as ``set_weights`` does.
        Raises WeightSyncError (and queues nothing) if the sync was partial or corrupt."""
        if getattr(self, "_receiver", None) is None:  # a process Ray restarted: not in the group yet
            raise WeightsLost(
                f"rollout worker {self.worker_id} is not in the weight group (a restarted "
                f"process); weights v{version} cannot reach it"
            )
        sd = self._receiver.receive(version)
        with self._lock:
            self._pending = (sd, version)
            self._received = max(self._received, version)
        return version

    def weights_checksums(self) -> tuple[int, dict[str, float]]:
        """(version, float64 sum of every engine tensor) after applying queued weights: what the
        next turn samples with (tests and debugging; needs an engine exposing ``.model``)."""
        with self.batcher.engine_lock:
            self.apply_pending_weights()
            sd = self.engine.model.state_dict()
            return self.engine.version, {k: float(v.double().sum()) for k, v in sd.items()}

    # ----- the teacher on this engine (scorer.placement=engine) ----------------------------------------
    def score(
        self, items: list[tuple[list[int], list[int]]], min_version: int = 0, micro_batch_tokens: int | None = None
    ) -> tuple[list[list[float]], int]:
        """The self-teacher's log-probs of (privileged prompt ids, response ids) on the weights
        this worker samples with, and their version: ``TeacherScorerWorker.score``'s contract,
        without a third copy of the policy. Between generate calls (the engine lock), after the
        queued weights are applied (with continuous batching: requests beside the turns in flight,
        ``actors/continuous_batcher.py``); raises WeightsLost below ``min_version``."""
        lps, version = self.batcher.score(
            items, temperature=self.cfg.temperature, micro_batch_tokens=micro_batch_tokens
        )
        self._check_weights(version, min_version)
        return lps, version

    def score_on_support(
        self, items, plain, k: int, min_version: int = 0, micro_batch_tokens: int | None = None
    ) -> tuple:
        """``score``'s contract for estimator ``topk_rkl`` (``pipeline.algorithm.logprobs.score_on_support``):
        (teacher lps, student lps, top-k ids, teacher lps at them, version)."""
        *out, version = self.batcher.score_on_support(
            items, plain, k, temperature=self.cfg.temperature, micro_batch_tokens=micro_batch_tokens
        )
        self._check_weights(version, min_version)
        return (*out, version)

    def _check_weights(self, version: int, min_version: int) -> None:
        """A score on weights older than the published ones: this process was restarted."""
        if version < min_version:
            raise WeightsLost(
                f"rollout worker {self.worker_id} holds weights v{version}, v{min_version} "
                "were published: its process was restarted"
            )

    # ----- colocation -----------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while a colocated learner trains (no-op for HF / CPU)."""
        with self.batcher.engine_lock:  # never under a generate
            getattr(self.engine, "sleep", lambda: None)()

    def wake_up(self) -> None:
        with self.batcher.engine_lock:
            getattr(self.engine, "wake_up", lambda: None)()

    # ----- prompts -------------------------------------------------------------------------------
    def build_prompt(
        self,
        env: TextEnv,
        history: list[tuple[str, str]],
        obs: Observation,
        turn: int = 0,
        view: StudentView | None = None,
    ):
        return self.prompts.build(env, history, obs, turn, view)

    def thinking_tokens(self, response_ids: list[int], text: str) -> int:
        """How many leading response tokens make up ``<think>...</think>`` (0 if no such block)."""
        end = text.find("</think>")
        if end < 0:
            return 0
        end += len("</think>")
        for n in range(1, len(response_ids) + 1):
            if len(self.tokenizer.decode(response_ids[:n], skip_special_tokens=True)) >= end:
                return n
        return len(response_ids)

    # ----- one group -----------------------------------------------------------------------------
    def run_group(
        self,
        *,
        task_seed: int,
        split: str,
        group_size: int,
        temperature: float,
        sample_seed: int,
        max_turns: int | None = None,
        view: StudentView | None = None,
        min_version: int = 0,
        demonstrate: bool = False,
    ) -> EpisodeGroup:
        """Play one group (blocking; groups run concurrently in the actor's threads); ``view``
        puts privileged context into the student's own prompts; ``demonstrate`` adds the hinted
        expert's episode of the task (``EpisodeGroup.demonstrations``, the equal-information
        baseline). Raises WeightsLost if this process never received weights ``min_version`` (the
        last published): Ray restarted it."""
        with self._lock:
            if self._received < min_version:
                raise WeightsLost(
                    f"rollout worker {self.worker_id} holds weights v{self._received}, "
                    f"v{min_version} were published: its process was restarted"
                )
        t0 = time.time()
        envs: list[TextEnv | None] = [None] * group_size
        try:
            group = _Group(self, envs, task_seed, split, temperature, sample_seed, max_turns, view, t0).play()
            if demonstrate:
                group.demonstrations = self.demonstration(task_seed, split, max_turns, group.min_version)
            return group
        finally:
            for env in envs:
                if env is not None:
                    self.env_pool.submit(env.close)

    def demonstration(
        self, task_seed: int, split: str, max_turns: int | None = None, version: int = 0
    ) -> list[Episode]:
        """The hinted expert's episode of the task, under the student's own prompts (no hint in
        them), if it won; [] when it lost, the task has no hint, or the env failed (an env error
        or a timeout costs the step one demonstration, never the group)."""
        from pipeline.context.expert import expert_episode

        def play():
            env = make_env(self.env_cfg.name, self.env_cfg.options, split)
            try:
                return env, expert_episode(env, self.prompts, task_seed, max_turns, hinted_reply=True, version=version)
            finally:
                env.close()

        try:
            env, played = self.env_pool.submit(play).result(timeout=self.cfg.env_timeout_s * (max_turns or 50))
        except Exception as e:  # a demonstration is optional; the group is not
            print(
                f"privy-rl: rollout worker {self.worker_id}: no demonstration for task {task_seed}: "
                f"{type(e).__name__}: {e}"[:400],
                file=sys.stderr,
                flush=True,
            )
            return []
        if played is None or not played[1]:
            return []
        rows, _ = played
        return [
            Episode(
                task_id=f"{self.env_cfg.name}-{task_seed}",
                env_name=self.env_cfg.name,
                seed=task_seed,
                task_type=env.task_type,
                turns=rows,
                reward=env.success_reward,
                won=True,
                stop_reason=StopReason.WON,
            )
        ]

    def close(self) -> None:
        self.batcher.close()
        self.env_pool.shutdown(wait=False, cancel_futures=True)


class _Group:
    """One group in play: each episode alternates a generate request and an env step, on its own.

    Its episodes ``join`` the batcher when play starts and ``leave`` it when they end (or the
    group is abandoned), so that a generate call waits briefly for the ones in env calls."""

    def __init__(
        self,
        worker: RolloutWorker,
        envs: list,
        task_seed: int,
        split: str,
        temperature: float,
        sample_seed: int,
        max_turns: int | None,
        view: StudentView | None,
        t0: float,
    ):
        self.w, self.envs, self.task_seed, self.split = worker, envs, task_seed, split
        self.sampling = Sampling(
            max_new_tokens=worker.cfg.max_new_tokens, temperature=temperature, top_p=worker.cfg.top_p
        )
        self.sample_seed, self.view, self.t0 = sample_seed, view, t0
        self.limit = max_turns  # None: the env's own max_turns, known after the first reset
        self.n_tokens = 0
        self.live = 0  # episodes joined to the batcher and not yet left
        n, name = len(envs), worker.env_cfg.name
        self.episodes = [Episode(task_id=f"{name}-{task_seed}", env_name=name, seed=task_seed) for _ in range(n)]
        self.obs: list = [None] * n
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        # future -> (kind, episode index, [start time once running], data)
        self.pending: dict[Future, tuple[str, int, list, object]] = {}

    # ----- the two kinds of work an episode waits on ---------------------------------------------
    def _env_call(self, kind: str, i: int, fn, *args, data=None) -> None:
        """Run ``fn`` in the env pool; its clock for ``rollout.env_timeout_s`` starts when it runs
        (queueing behind other envs' calls does not count)."""
        started: list[float] = []

        def run():
            started.append(time.time())
            return fn(*args)

        self.pending[self.w.env_pool.submit(run)] = (kind, i, started, data)

    def _landed(self, i: int, *, ask: bool) -> None:
        """An env call of episode i is over: it asks for its next turn, or it has ended."""
        if ask:
            self._ask(i)
        else:
            self.w.batcher.leave(1)
            self.live -= 1

    def _ask(self, i: int) -> None:
        w, ep = self.w, self.episodes[i]
        turn = len(ep.turns)
        messages, ids, truncated, offered = w.build_prompt(self.envs[i], self.history[i], self.obs[i], turn, self.view)
        for cid in offered:
            if cid not in ep.context_ids:
                ep.context_ids.append(cid)
        req = Request(prompt=ids, sampling=self.sampling, seed=request_seed(self.sample_seed * 1000 + turn, i))
        w.batcher.submit([req])
        self.pending[req.future] = ("gen", i, [], (messages, ids, truncated))

    def _fail(self, i: int, what: str, err: BaseException | str) -> None:
        self.episodes[i].error = f"{what}: {err}"[:500]
        self.episodes[i].stop_reason = StopReason.ERROR

    # ----- the loop ------------------------------------------------------------------------------
    def play(self) -> EpisodeGroup:
        w = self.w
        w.batcher.join(len(self.envs))
        self.live = len(self.envs)
        try:
            for i in range(len(self.envs)):
                self._env_call("reset", i, self._make_and_reset, i)
            while self.pending:
                done = self._wait()
                for f in done:
                    kind, i, _, data = self.pending.pop(f)
                    {"reset": self._on_reset, "gen": self._on_generation, "step": self._on_step}[kind](i, f, data)
        finally:
            w.batcher.leave(self.live)  # nothing more will come from an abandoned group
        return EpisodeGroup(
            task_id=self.episodes[0].task_id,
            seed=self.task_seed,
            episodes=self.episodes,
            worker_id=w.worker_id,
            rollout_seconds=time.time() - self.t0,
            n_generated_tokens=self.n_tokens,
        )

    def _wait(self) -> set[Future]:
        """The next finished futures; env calls that ran out of time fail their episodes."""
        timeout = self.w.cfg.env_timeout_s
        env_calls = [(f, t) for f, (kind, _, t, _) in self.pending.items() if kind != "gen"]
        running = [t[0] for _, t in env_calls if t]
        until = min(running) + timeout - time.time() if running else None
        if any(not t for _, t in env_calls):  # re-check soon: a queued call's clock starts when it runs
            until = 1.0 if until is None else min(until, 1.0)
        done, _ = wait(
            list(self.pending), timeout=None if until is None else max(until, 0.0), return_when=FIRST_COMPLETED
        )
        now = time.time()
        for f, t in env_calls:
            if f not in done and t and now - t[0] >= timeout:  # a hung env: its episode ends as failed
                kind, i, _, _ = self.pending.pop(f)
                self._fail(i, f"env {kind}", f"no answer within rollout.env_timeout_s={timeout:g} s")
                self._landed(i, ask=False)
        return done

    def _make_and_reset(self, i: int):
        env = make_env(self.w.env_cfg.name, self.w.env_cfg.options, self.split)
        self.envs[i] = env
        obs = env.reset(self.task_seed)
        # Under the env timeout and off this loop: code_edit's hint runs the tests in its sandbox.
        return env, obs, env.privileged_hint() or ""

    def _on_reset(self, i: int, f: Future, _) -> None:
        try:
            env, self.obs[i], hint = f.result()
        except Exception as e:  # a broken env fails its episode only
            self._fail(i, "env reset", repr(e))
            return self._landed(i, ask=False)
        ep = self.episodes[i]
        ep.privileged_hint = hint
        ep.task_id = env.task_id or ep.task_id
        ep.task_type, ep.task_text = env.task_type, env.task_text
        self.limit = self.limit or env.max_turns
        self._landed(i, ask=True)

    def _on_generation(self, i: int, f: Future, data) -> None:
        gen, version = f.result()  # an engine failure ends the group: it is the worker's, not the episode's
        text = self.w.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        self.n_tokens += gen.n_tokens
        self._env_call("step", i, self.envs[i].step, text, data=(*data, gen, version, text))

    def _on_step(self, i: int, f: Future, data) -> None:
        messages, ids, truncated, gen, version, text = data
        try:
            res = f.result()
        except Exception as e:
            self._fail(i, "env step", repr(e))
            return self._landed(i, ask=False)
        ep, obs = self.episodes[i], self.obs[i]
        turn = len(ep.turns)
        ep.turns.append(
            TurnRecord(
                prompt_ids=ids,
                response_ids=list(gen.token_ids),
                behaviour_logprobs=list(gen.logprobs),
                policy_version=version,
                turn_index=turn,
                messages=messages,
                response_text=text,
                action=res.action,
                step_reward=res.reward,
                action_valid=res.action_valid,
                anchor_obs=obs.text,
                thinking_len=self.w.thinking_tokens(gen.token_ids, text),
                truncated_prompt=truncated,
            )
        )
        ep.reward += res.reward
        self.history[i].append((obs.text, res.action if res.action_valid else text.strip()))
        self.obs[i] = res.observation
        if res.criteria:
            ep.criteria = list(res.criteria)
        ep.won = ep.won or res.won
        if res.done:
            ep.stop_reason = StopReason.WON if res.won else StopReason.DONE
        self._landed(i, ask=not res.done and turn + 1 < self.limit)
