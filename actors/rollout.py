"""Rollout worker: runs the G episodes of one task (one GRPO group) against single-use envs.

Each turn, the next prompt of every live episode is built from the env's messages (the last
``history_length`` turns; older history is dropped first when the prompt would exceed
``max_prompt_tokens``, the task itself never) and all of them go to the engine in ONE batched
``generate`` call. Every assistant turn becomes a TurnRecord carrying exactly the sampled token ids,
their log-probs under the distribution actually sampled, and the weights version that sampled
them. New weights (``set_weights``) are applied between turns, so episodes in flight are never
dropped; a group then records mixed versions and the buffer judges it by its oldest turn.
"""
from __future__ import annotations

import threading
import time

from envs import make_env
from envs.base import Observation, TextEnv
from pipeline.context.placement import PrivilegedPrompt
from pipeline.context.prompts import default_system_prompt
from pipeline.context.providers import StudentView
from pipeline.core.config import EnvConfig, RolloutConfig
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.types import Episode, EpisodeGroup, StopReason, TurnRecord
from pipeline.distributed.weight_sync import WeightPacket, verify


class PromptTooLong(ValueError):
    pass


class RolloutWorker:
    """Plain class (testable without Ray); ``pipeline.orchestration.run`` wraps it with ``ray.remote``."""

    def __init__(self, cfg: RolloutConfig, env_cfg: EnvConfig, model_path: str, *,
                 worker_id: int = 0, engine=None, threads: int | None = None, chat_template: str | None = None):
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
        self.default_system = default_system_prompt(self.tokenizer)  # where a system placement goes
        self._pending: tuple[dict, int] | None = None
        self._lock = threading.Lock()
        # One group at a time: the engine and the envs' native libraries are not thread-safe.
        # (The actor is threaded only so that set_weights lands while a group is being played.)
        self._play_lock = threading.Lock()

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
        return packet.version

    def apply_pending_weights(self) -> bool:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        self.engine.load_state_dict(*pending)
        return True

    # Collective route (pipeline/distributed/collective_sync.py). Neither call takes ``_play_lock``: they run
    # in the actor's second thread while a group may be playing in the first, like set_weights.
    def init_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str,
                          meta, bucket_bytes: int, timeout_s: float | None = None) -> int:
        """Join the learner's weight group as ``rank``; ``meta`` = the learner's ``sync_meta()``."""
        from pipeline.distributed.collective_sync import WeightReceiver

        self._receiver = WeightReceiver(host, port, rank, world_size, backend, meta, bucket_bytes, timeout_s)
        return rank

    def receive_weights(self, version: int) -> int:
        """Receive one broadcast into a fresh dict, check it, queue it as ``set_weights`` does.
        Raises WeightSyncError (and queues nothing) if the sync was partial or corrupt."""
        sd = self._receiver.receive(version)
        with self._lock:
            self._pending = (sd, version)
        return version

    def weights_checksums(self) -> tuple[int, dict[str, float]]:
        """(version, float64 sum of every engine tensor) after applying queued weights: what the
        next turn samples with (tests and debugging; needs an engine exposing ``.model``)."""
        with self._play_lock:
            self.apply_pending_weights()
            sd = self.engine.model.state_dict()
            return self.engine.version, {k: float(v.double().sum()) for k, v in sd.items()}

    # ----- colocation -----------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while a colocated learner trains (no-op for HF / CPU)."""
        with self._play_lock:  # never under a group being played
            getattr(self.engine, "sleep", lambda: None)()

    def wake_up(self) -> None:
        with self._play_lock:
            getattr(self.engine, "wake_up", lambda: None)()

    # ----- prompts -------------------------------------------------------------------------------
    def encode(self, prompt: PrivilegedPrompt) -> list[int]:
        out = self.tokenizer.apply_chat_template([m.as_dict() for m in prompt.messages],
                                                 add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        prefix = list(self.tokenizer(prompt.prefix, add_special_tokens=False)["input_ids"]) if prompt.prefix else []
        return prefix + list(out)

    def build_prompt(self, env: TextEnv, history: list[tuple[str, str]], obs: Observation, turn: int = 0,
                     view: StudentView | None = None):
        """Messages and ids of the next prompt (with the view's privileged context, if any),
        dropping the oldest history until it fits; returns (messages, ids, truncated, context ids)."""
        for h in range(min(self.env_cfg.history_length, len(history)), -1, -1):
            prompt, offered = PrivilegedPrompt(messages=env.build_messages(history, obs, h)), []
            if view is not None:
                prompt, offered = view.apply(prompt.messages, env, turn, self.default_system)
            ids = self.encode(prompt)
            if len(ids) <= self.cfg.max_prompt_tokens:
                return prompt.messages, ids, h < min(self.env_cfg.history_length, len(history)), offered
        raise PromptTooLong(
            f"the prompt without history is {len(ids)} tokens > rollout.max_prompt_tokens="
            f"{self.cfg.max_prompt_tokens}; raise rollout.max_prompt_tokens")

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
    def run_group(self, *, task_seed: int, split: str, group_size: int, temperature: float,
                  sample_seed: int, max_turns: int | None = None, view: StudentView | None = None) -> EpisodeGroup:
        """Play one group; ``view`` puts privileged context into the student's own prompts."""
        with self._play_lock:
            t0 = time.time()
            self.apply_pending_weights()
            envs = [make_env(self.env_cfg.name, self.env_cfg.options, split) for _ in range(group_size)]
            try:
                return self._play(envs, task_seed, temperature, sample_seed, max_turns, t0, view)
            finally:
                for env in envs:
                    env.close()

    def _play(self, envs: list[TextEnv], task_seed: int, temperature: float, sample_seed: int,
              max_turns: int | None, t0: float, view: StudentView | None = None) -> EpisodeGroup:
        obs = [env.reset(task_seed) for env in envs]
        episodes = [Episode(task_id=env.task_id or f"{env.name}-{task_seed}", env_name=env.name,
                            seed=task_seed, task_type=env.task_type, task_text=env.task_text)
                    for env in envs]
        history: list[list[tuple[str, str]]] = [[] for _ in envs]
        live = list(range(len(envs)))
        limit = max_turns or envs[0].max_turns
        n_tokens = 0
        for turn in range(limit):
            if not live:
                break
            if turn > 0:
                self.apply_pending_weights()
            prompts = [self.build_prompt(envs[i], history[i], obs[i], turn, view) for i in live]
            gens = self.engine.generate([p[1] for p in prompts], max_new_tokens=self.cfg.max_new_tokens,
                                        temperature=temperature, top_p=self.cfg.top_p,
                                        seed=sample_seed * 1000 + turn)
            version = self.engine.version
            still = []
            for i, (messages, ids, truncated, offered), gen in zip(live, prompts, gens):
                for cid in offered:
                    if cid not in episodes[i].context_ids:
                        episodes[i].context_ids.append(cid)
                text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
                res = envs[i].step(text)
                n_tokens += len(gen.token_ids)
                episodes[i].turns.append(TurnRecord(
                    prompt_ids=ids, response_ids=list(gen.token_ids),
                    behaviour_logprobs=list(gen.logprobs), policy_version=version, turn_index=turn,
                    messages=messages, response_text=text, action=res.action,
                    step_reward=res.reward, action_valid=res.action_valid, anchor_obs=obs[i].text,
                    thinking_len=self.thinking_tokens(gen.token_ids, text), truncated_prompt=truncated))
                episodes[i].reward += res.reward
                history[i].append((obs[i].text, res.action if res.action_valid else text.strip()))
                obs[i] = res.observation
                if res.criteria:
                    episodes[i].criteria = list(res.criteria)
                if res.won:
                    episodes[i].won = True
                if res.done:
                    episodes[i].stop_reason = StopReason.WON if res.won else StopReason.DONE
                else:
                    still.append(i)
            live = still
        return EpisodeGroup(task_id=episodes[0].task_id, seed=task_seed, episodes=episodes,
                            worker_id=self.worker_id, rollout_seconds=time.time() - t0,
                            n_generated_tokens=n_tokens)

