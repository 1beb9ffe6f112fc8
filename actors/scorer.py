"""The teacher scorer: log-probs of the sampled response tokens under a privileged prompt.

``TeacherScorerWorker`` (plain class; ``ray.remote`` makes it an actor) holds the teacher weights:
the policy itself, kept in sync like a rollout worker (``source=self``), or a frozen checkpoint
(``source=frozen``). ``score`` runs ONE no-grad forward per micro-batch (token budget) over
``privileged prompt + response`` and returns the teacher log-prob of every response token, at the
rollout temperature, with the LM head applied only at response positions.

``TeacherScorer`` is the driver-side handle the controller awaits: it asks the method's
``TeacherSpec`` which rows to score and its context provider for their privileged prompts
(``pipeline.context.providers``; one provider on the driver, so UCB statistics are central),
calls the worker, and fills ``TurnRecord.teacher_logprobs`` / ``teacher_version``.
"""

from __future__ import annotations

import time

import torch

from actors.handles import Restartable, WeightsLost
from pipeline.algorithm.logprobs import score_responses
from pipeline.context.prompts import TeacherPrompts
from pipeline.context.providers import TeacherSpec
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.types import EpisodeGroup
from pipeline.distributed.weight_sync import WeightPacket, verify


class TeacherScorerWorker:
    """``engine="hf"``: the teacher is an HF model and ``score`` one no-grad forward per
    micro-batch. ``engine="vllm"`` (``scorer.engine=vllm``): the teacher is a ``VLLMEngine`` of
    this actor's own, scoring with ``prompt_logprobs`` (temperature 1 only), as an inference
    server would serve a frozen OPD teacher; weights sent to it (a self-teacher) are reloaded in
    place. ``vllm``: the engine's options (``rollout.vllm``)."""

    def __init__(
        self,
        model_path: str,
        *,
        temperature: float,
        micro_batch_tokens: int,
        precision: str = "auto",
        device: str = "cpu",
        threads: int | None = None,
        engine: str = "hf",
        vllm=None,
        chat_template: str | None = None,
    ):
        from pipeline.models import as_torch_dtype, load_model

        self.threads = set_threads(threads)
        # "cuda": local device 0 of the GPU Ray gave this actor (scorer.num_gpus > 0).
        self.device = torch.device(device)
        self.precision = choose_precision(precision, self.device.type)
        self.engine = None
        if engine == "vllm":
            import json
            from pathlib import Path

            from actors.engines.vllm import VLLMEngine

            v = vllm
            # A privileged prompt is longer than the student's by its context: by default the
            # engine takes what the model does (capped: the KV cache must hold one sequence).
            positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings", 4096)
            self.engine = VLLMEngine(
                model_path,
                dtype=self.precision.dtype,
                max_model_len=v.max_model_len or min(int(positions), 8192),
                gpu_memory_utilization=v.gpu_memory_utilization,
                enforce_eager=v.enforce_eager,
                in_process=True,
                kv_cache_gb=v.kv_cache_gb,
                chat_template=chat_template,
            )
            self.model = None
        else:
            self.model = load_model(model_path, as_torch_dtype(self.precision.dtype), self.device)
            self.model.requires_grad_(False)
        self.temperature = temperature
        self.micro_batch_tokens = micro_batch_tokens
        self.version = 0

    def _load(self, state_dict, version: int) -> None:
        if self.engine is not None:
            self.engine.load_state_dict(state_dict, version)
        else:
            self.model.load_state_dict(state_dict, strict=True)
        self.version = version

    def hardware(self) -> dict:
        return hardware_info(self.precision, self.threads)

    def set_weights(self, packet: WeightPacket) -> int:
        verify(packet)
        self._load(packet.state_dict, packet.version)
        return self.version

    # Collective route (pipeline/distributed/collective_sync.py): same contract as set_weights.
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
        from pipeline.distributed.collective_sync import WeightReceiver

        self._receiver = WeightReceiver(host, port, rank, world_size, backend, meta, bucket_bytes, timeout_s)
        return rank

    def receive_weights(self, version: int) -> int:
        """Receive, check (raises WeightSyncError, loading nothing), then load."""
        if getattr(self, "_receiver", None) is None:  # a process Ray restarted: not in the group yet
            raise WeightsLost(
                f"the teacher scorer is not in the weight group (a restarted process); "
                f"weights v{version} cannot reach it"
            )
        self._load(self._receiver.receive(version), version)
        return self.version

    def score(self, items: list[tuple[list[int], list[int]]], min_version: int = 0) -> tuple[list[list[float]], int]:
        """``items`` = (privileged prompt ids, response ids); returns per-token log-probs and the
        weights version that scored them. Raises WeightsLost below ``min_version`` (a self-teacher
        Ray restarted: it holds the initial weights)."""
        if self.version < min_version:
            raise WeightsLost(
                f"the teacher scorer holds weights v{self.version}, v{min_version} "
                f"were published: its process was restarted"
            )
        if self.engine is not None:
            return self.engine.score(items, temperature=self.temperature), self.version
        lps = score_responses(
            self.model, items, temperature=self.temperature, micro_batch_tokens=self.micro_batch_tokens
        )
        return lps, self.version

    def score_on_support(self, items, plain, k: int, min_version: int = 0) -> tuple:
        """Estimator ``topk_rkl`` (HF forward only): see ``pipeline.algorithm.logprobs.score_on_support``."""
        if self.version < min_version:
            raise WeightsLost(
                f"the teacher scorer holds weights v{self.version}, v{min_version} "
                f"were published: its process was restarted"
            )
        if self.engine is not None:
            raise NotImplementedError("scorer.engine=vllm cannot score at given token ids (method.estimator=topk_rkl)")
        from pipeline.algorithm.logprobs import score_on_support

        out = score_on_support(
            self.model, items, plain, k, temperature=self.temperature, micro_batch_tokens=self.micro_batch_tokens
        )
        return (*out, self.version)


class TeacherScorer(Restartable):
    """Driver-side handle: which rows, which prompts, and where their forward runs: ``actor``, a
    Ray handle of a ``TeacherScorerWorker`` (``scorer.placement=actor``), or, with ``actor=None``
    (``scorer.placement=engine``, a self-teacher), the rollout worker handed to ``score``, whose
    engine holds the policy already."""

    def __init__(
        self,
        actor,
        spec: TeacherSpec,
        prompts: TeacherPrompts,
        timeout_s: float = 0.0,
        noise_floor: bool = False,
        micro_batch_tokens: int | None = None,
    ):
        self._init_restartable(actor, "teacher scorer")
        self.spec, self.prompts = spec, prompts
        self.timeout_s = timeout_s  # scorer.timeout_s (0 = never)
        self.noise_floor = noise_floor  # also score each row on the student's own prompt
        self.micro_batch_tokens = micro_batch_tokens  # the engine route's forward budget

    @property
    def self_teacher(self) -> bool:
        """The teacher is the policy: its weights follow the learner (staleness is measured)."""
        return self.spec.source == "self"

    @property
    def on_engine(self) -> bool:
        return self.actor is None

    @property
    def wants_weights(self) -> bool:
        """Whether the learner must send it weights (an actor holding a copy of the policy)."""
        return self.self_teacher and not self.on_engine

    def _items(self, groups: list[EpisodeGroup]):
        """The rows to score and their (privileged prompt ids, response ids): the one place that
        decides which rows a teacher scores (the method's select part, then the provider, which
        has no privileged context for some rows)."""
        rows, items = [], []
        for g in groups:
            for ep in g.episodes:
                for row in ep.turns:
                    if not self.spec.selects(ep, row):
                        continue
                    ids = self.spec.provider.teacher_prompt(self.prompts, ep, row)
                    if ids is None:  # no privileged context for this row: nothing to teach
                        continue
                    rows.append(row)
                    items.append((ids, row.response_ids))
        return rows, items

    def needs_scoring(self, group: EpisodeGroup) -> bool:
        """Whether a row of ``group`` the teacher scores has no teacher log-probs yet. On the
        learner's path: the privileged prompts (``_items``) are built only when a selected row
        lacks log-probs, which is rare (most groups were scored as they completed)."""
        pending = any(
            row.teacher_logprobs is None for ep in group.episodes for row in ep.turns if self.spec.selects(ep, row)
        )
        return pending and any(row.teacher_logprobs is None for row in self._items([group])[0])

    async def score(
        self, groups: list[EpisodeGroup], step: int, min_version: int = 0, engine=None
    ) -> tuple[list[EpisodeGroup], dict]:
        """``min_version``: the last published weights (a self-teacher must hold them);
        ``engine``: the rollout worker (``actors.handles.RayRollout``) that scores on the engine
        route. A death raises ``ActorDied`` naming the actor that died."""
        t0 = time.time()
        rows, items = self._items(groups)
        floor = min_version if self.self_teacher else 0
        if self.on_engine and engine is None:
            raise ValueError("scorer.placement=engine: score() needs the rollout worker whose engine scores")
        if self.spec.support_k:  # topk_rkl: the student's forward gives the support (and the floor)
            plain = [(row.prompt_ids, row.response_ids) for row in rows]
            k, mbt = self.spec.support_k, self.micro_batch_tokens
            if self.on_engine:
                out = await engine.score_on_support(items, plain, k, floor, mbt, self.timeout_s)
            else:
                out = await self._call_within(
                    self.timeout_s, "scorer.timeout_s", "score_on_support", items, plain, k, floor
                )
            lpt, lps_plain, ids, at_ids, version = out
            lps = lpt + (lps_plain if self.noise_floor else [])
            for row, i, t in zip(rows, ids, at_ids):
                row.teacher_topk_ids, row.teacher_topk_logprobs = i, t
        else:
            plain = [(row.prompt_ids, row.response_ids) for row in rows] if self.noise_floor else []
            if self.on_engine:
                lps, version = await engine.score(items + plain, floor, self.micro_batch_tokens, self.timeout_s)
            else:
                lps, version = await self._call_within(
                    self.timeout_s, "scorer.timeout_s", "score", items + plain, floor
                )
        for row, lp in zip(rows, lps):
            row.teacher_logprobs, row.teacher_version = lp, version
        for row, lp in zip(rows, lps[len(rows) :]):  # one forward call: the same weights version
            row.plain_teacher_logprobs = lp
        lengths = [len(ids) for ids, _ in items]
        n_rows = sum(len(g.rows()) for g in groups)
        metrics = {
            "teacher/seconds": time.time() - t0,
            "teacher/rows_scored_frac": len(rows) / max(n_rows, 1),
            "teacher/prompt_tokens": sum(lengths) / max(len(lengths), 1),
            "teacher/prompt_tokens_sum": float(sum(lengths)),
        }
        if rows and self.self_teacher:
            metrics["teacher/staleness"] = sum(version - r.policy_version for r in rows) / len(rows)
        return groups, metrics
