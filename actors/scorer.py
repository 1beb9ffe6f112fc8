"""The teacher scorer: what a signal needs of the teacher at the sampled response tokens, under a
privileged prompt.

``TeacherScorerWorker`` (plain class; ``ray.remote`` makes it an actor) holds teacher weights of
its own: the policy, kept in sync like a rollout worker, or a frozen checkpoint. ``score`` runs ONE
no-grad forward per micro-batch (token budget) over ``privileged prompt + response`` and returns
the teacher's log-prob of every response token at the rollout temperature (with the LM head
applied only at response positions), and whatever else the signal's ``TeacherNeeds`` ask.

``TeacherScorer`` is the driver-side handle the controller awaits: it asks the method's
``TeacherSpec`` which rows to score and its context provider for their privileged prompts
(``pipeline.context.providers``; one provider on the driver, so UCB statistics are central),
hands them to its route (``ActorRoute``: such an actor; ``EngineRoute``: the rollout engine that
played them), and fills the records (``TurnRecord.teacher_logprobs``, ``teacher_version``, ...).
"""

from __future__ import annotations

import time

import torch

from actors.handles import Restartable
from pipeline.algorithm.logprobs import score_teacher
from pipeline.context.prompts import TeacherPrompts
from pipeline.context.providers import TeacherSpec
from pipeline.core.errors import WeightsLost
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.types import EpisodeGroup, TeacherNeeds, TeacherOutput
from pipeline.distributed.collective_sync import WeightGroupMember
from pipeline.distributed.weight_sync import WeightPacket, load_into, verify


class TeacherScorerWorker(WeightGroupMember):
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
            length = v.max_model_len or min(int(positions), 8192)
            # One in-process engine that never sleeps, whatever the rollout's engines do.
            single = {"in_process": True, "tensor_parallel_size": 1, "enable_sleep_mode": False}
            self.engine = VLLMEngine.from_options(
                model_path, v, dtype=self.precision.dtype, max_model_len=length, chat_template=chat_template, **single
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
            load_into(self.model, state_dict)  # strict on names; a tied head may be left out
        self.version = version

    def hardware(self) -> dict:
        return hardware_info(self.precision, self.threads)

    def set_weights(self, packet: WeightPacket) -> int:
        verify(packet)
        self._load(packet.state_dict, packet.version)
        return self.version

    # Collective route: ``init_weight_group`` (WeightGroupMember) and ``receive_weights``, same
    # contract as set_weights.
    def receive_weights(self, version: int) -> int:
        """Receive, check (raises WeightSyncError, loading nothing), then load."""
        self._load(self._receive_weights_dict(version, "the teacher scorer"), version)
        return self.version

    def score(self, items, plain, needs: TeacherNeeds, min_version: int = 0) -> TeacherOutput:
        """``items`` = (privileged prompt ids, response ids), ``plain`` the same responses after the
        student's prompts (or none); all the signal ``needs`` of the teacher, with the weights
        version that scored it. Raises WeightsLost below ``min_version`` (a self-teacher Ray
        restarted: it holds the initial weights)."""
        if self.version < min_version:
            raise WeightsLost(
                f"the teacher scorer holds weights v{self.version}, v{min_version} "
                f"were published: its process was restarted"
            )
        kw = {"temperature": self.temperature, "micro_batch_tokens": self.micro_batch_tokens}
        if self.engine is not None:
            out = self.engine.score_teacher(items, plain, needs, **kw)
        else:
            out = score_teacher(self.model, items, plain, needs, **kw)
        out.version = self.version
        return out


class ActorRoute(Restartable):
    """The teacher's forward on a ``TeacherScorerWorker`` actor with weights of its own
    (``scorer.placement=actor``): a frozen checkpoint, or the policy synced like a rollout
    worker (then a weight consumer: ``wants_weights``)."""

    def __init__(self, actor, *, follows_policy: bool, precision: str, timeout_s: float = 0.0):
        self._init_restartable(actor, "teacher scorer")
        self.wants_weights = follows_policy
        self.where = f"scorer.precision={precision}"
        self.timeout_s = timeout_s  # scorer.timeout_s (0 = never)

    async def score(self, items, plain, needs: TeacherNeeds, min_version: int, worker=None) -> TeacherOutput:
        timeout = self.timeout_s
        return await self._call_within(timeout, "scorer.timeout_s", "score", items, plain, needs, min_version)


class EngineRoute:
    """The teacher's forward on the engine of the rollout worker that played the group
    (``scorer.placement=engine``): a self-teacher there holds the live weights, with no third copy
    and no sync of its own. A death is the worker's (``ActorDied`` names it)."""

    actor = None  # no actor of its own: nothing to restart, no weights to send
    wants_weights = False
    where = "rollout engine"

    def __init__(self, *, micro_batch_tokens: int | None, timeout_s: float = 0.0):
        self.micro_batch_tokens, self.timeout_s = micro_batch_tokens, timeout_s

    async def score(self, items, plain, needs: TeacherNeeds, min_version: int, worker=None) -> TeacherOutput:
        if worker is None:
            raise ValueError("scorer.placement=engine: score() needs the rollout worker whose engine scores")
        return await worker.score(items, plain, needs, min_version, self.micro_batch_tokens, self.timeout_s)


class TeacherScorer:
    """Driver-side handle: which rows, which prompts (the method's ``TeacherSpec``), and where
    their forward runs (``route``: ``ActorRoute`` or ``EngineRoute``; nothing else here asks
    which). ``noise_floor``: also score each row on the student's own prompt."""

    def __init__(self, route, spec: TeacherSpec, prompts: TeacherPrompts, noise_floor: bool = False):
        self.route, self.spec, self.prompts, self.noise_floor = route, spec, prompts, noise_floor

    @property
    def follows_policy(self) -> bool:
        """The teacher's weights are the policy's (their staleness is measured)."""
        return self.spec.follows_policy

    @property
    def where(self) -> str:
        """Where the teacher's forward runs, for messages about its precision."""
        return self.route.where

    @property
    def consumer(self):
        """The weight consumer the learner publishes to besides the rollout workers, or None."""
        return self.route if self.route.wants_weights else None

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
        self, groups: list[EpisodeGroup], step: int, min_version: int = 0, worker=None
    ) -> tuple[list[EpisodeGroup], dict]:
        """``min_version``: the last published weights (a teacher that follows the policy must hold
        them); ``worker``: the rollout worker (``actors.handles.RayRollout``) that played the
        groups, for a route that scores on its engine. A death raises ``ActorDied`` naming the
        actor that died."""
        t0 = time.time()
        rows, items = self._items(groups)
        needs = self.spec.needs
        plain = [(row.prompt_ids, row.response_ids) for row in rows] if self.noise_floor or needs.support_k else []
        floor = min_version if self.follows_policy else 0
        out = await self.route.score(items, plain, needs, floor, worker)
        for i, row in enumerate(rows):
            row.teacher_logprobs, row.teacher_version = out.logprobs[i], out.version
            if self.noise_floor:  # one forward call: the same weights version
                row.plain_teacher_logprobs = out.plain_logprobs[i]
            if needs.support_k:
                row.teacher_topk_ids, row.teacher_topk_logprobs = out.topk_ids[i], out.topk_logprobs[i]
            if out.channels:
                row.teacher_channels = {name: values[i] for name, values in out.channels.items()}
        lengths = [len(ids) for ids, _ in items]
        n_rows = sum(len(g.rows()) for g in groups)
        metrics = {
            "teacher/seconds": time.time() - t0,
            "teacher/rows_scored_frac": len(rows) / max(n_rows, 1),
            "teacher/prompt_tokens": sum(lengths) / max(len(lengths), 1),
            "teacher/prompt_tokens_sum": float(sum(lengths)),
        }
        if rows and self.follows_policy:
            metrics["teacher/staleness"] = sum(out.version - r.policy_version for r in rows) / len(rows)
        return groups, metrics
