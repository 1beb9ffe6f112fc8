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
from concurrent.futures import ThreadPoolExecutor

from actors.group_play import GroupPlay
from actors.turn_batcher import TurnBatcher
from envs import make_env
from envs.base import Observation, TextEnv
from pipeline.context.providers import StudentView
from pipeline.context.student_prompts import StudentPrompts
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.errors import WeightsLost
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.types import Episode, EpisodeGroup, StopReason, TurnRecord
from pipeline.distributed.collective_sync import WeightGroupMember
from pipeline.distributed.weight_sync import WeightPacket, verify


class RolloutWorker(WeightGroupMember):
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
            self.tokenizer,
            max_prompt_tokens=cfg.max_prompt_tokens,
            history_length=env_cfg.history_length,
            prompt_format=env_cfg.prompt_format,
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

    # Collective route: ``init_weight_group`` (WeightGroupMember) and ``receive_weights``. Like
    # set_weights they run in an actor thread of their own while groups are being played, and only
    # queue the weights.
    def receive_weights(self, version: int) -> int:
        """Receive one broadcast into a fresh dict, check it, queue it as ``set_weights`` does.
        Raises WeightSyncError (and queues nothing) if the sync was partial or corrupt."""
        sd = self._receive_weights_dict(version, f"rollout worker {self.worker_id}")
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
    def score(self, items, plain, needs, min_version: int = 0, micro_batch_tokens: int | None = None):
        """The self-teacher on the weights this worker samples with: ``TeacherScorerWorker.score``'s
        contract (a ``TeacherOutput`` with its version), without a third copy of the policy.
        Between generate calls (the engine lock), after the queued weights are applied (with
        continuous batching: requests beside the turns in flight, ``actors/continuous_batcher.py``);
        raises WeightsLost below ``min_version``."""
        out = self.batcher.score_teacher(
            items, plain, needs, temperature=self.cfg.temperature, micro_batch_tokens=micro_batch_tokens
        )
        self._check_weights(out.version, min_version)
        return out

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
        last: TurnRecord | None = None,
    ):
        return self.prompts.build(env, history, obs, turn, view, last)

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
            group = GroupPlay(self, envs, task_seed, split, temperature, sample_seed, max_turns, view, t0).play()
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
