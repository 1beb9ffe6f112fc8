"""Typed records that flow rollout -> scorer -> learner.

Shape convention (used across the project, see also ``pipeline/algorithm/losses.py``): list fields carry a
shape comment such as ``# [n_response]``; tensors carry ``# [B, T]`` comments where B = rows
(assistant turns) of a batch and T = padded sequence length.

This module imports nothing heavy so every Ray process can unpickle records cheaply; the one
torch-typed record (TrainBatch) only names torch in annotations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    import torch


class StopReason(StrEnum):
    """Why an episode ended."""

    WON = "won"
    DONE = "done"  # the env ended it without a win (e.g. WebShop buy, Search-R1 answer)
    MAX_TURNS = "max_turns"
    ERROR = "error"  # the env raised or hung (Episode.error says which and why)
    CONTEXT = "context"  # env.prompt_format=chat: the conversation outgrew rollout.max_prompt_tokens


class Placement(StrEnum):
    """Where a teacher's privileged text goes in the student's prompt (pipeline/context/placement.py)."""

    RAW_PREFIX = "raw_prefix"
    SYSTEM = "system"
    USER = "user"
    USER_FRONT = "user_front"


@dataclass(kw_only=True, slots=True)
class Message:
    """One chat message, as handed to the tokenizer's chat template."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(kw_only=True, slots=True)
class CriterionResult:
    """The judge's verdict on one rubric criterion of an episode."""

    criterion: str
    passed: bool
    failing_turn: int | None = None  # turn index where it failed (None if passed or unknown)
    feedback: str = ""  # static feedback string for the criterion (privileged context)


def criterion_pass_rates(episodes: "list[Episode]") -> dict[str, float]:
    """Each criterion's pass rate over the episodes that have a verdict on it."""
    verdicts: dict[str, list[bool]] = {}
    for e in episodes:
        for c in e.criteria:
            verdicts.setdefault(c.criterion, []).append(c.passed)
    return {name: sum(v) / len(v) for name, v in verdicts.items()}


@dataclass(kw_only=True, slots=True)
class TurnRecord:
    """One assistant turn = one training row.

    ``prompt_ids`` is the chat-templated prompt (system + task + the last ``history_length`` turns
    + current observation, with the generation prompt); ``response_ids`` are exactly the token ids
    the engine sampled (never re-tokenised), ending with EOS when the model stopped by itself.
    """

    prompt_ids: list[int]  # [n_prompt]
    response_ids: list[int]  # [n_response]
    behaviour_logprobs: list[float]  # [n_response] log-prob under the distribution actually sampled
    policy_version: int  # weights version that sampled this turn
    turn_index: int
    messages: list[Message]  # the chat messages rendered into prompt_ids (the scorer rebuilds from these)
    response_text: str = ""
    action: str = ""  # the parsed action ("" if none could be parsed)
    step_reward: float = 0.0  # env reward of this step (before the invalid-action penalty)
    action_valid: bool = True
    anchor_obs: str = ""  # the current observation text: GiGPO anchor key
    thinking_len: int = 0  # number of leading response tokens that belong to <think>...</think>
    truncated_prompt: bool = False  # history had to be cut to fit the prompt budget
    teacher_logprobs: list[float] | None = None  # [n_response], filled by the scorer
    teacher_version: int | None = None  # weights version of the teacher that scored this row
    # [n_response] the same teacher with empty privileged context (the student's own prompt): the
    # noise floor of teacher_logprobs (scorer.noise_floor)
    plain_teacher_logprobs: list[float] | None = None
    # [n_response][k] the student's top-k token ids at each position and the teacher's log-probs
    # there (estimator topk_rkl, TeacherNeeds.support_k)
    teacher_topk_ids: list[list[int]] | None = None
    teacher_topk_logprobs: list[list[float]] | None = None
    # [name][n_response] the quantities of the teacher's distribution a signal asked for
    # (TeacherNeeds.channels, e.g. its entropy at each position)
    teacher_channels: dict[str, list[float]] | None = None

    @property
    def n_response(self) -> int:
        return len(self.response_ids)


@dataclass(kw_only=True, slots=True)
class Episode:
    """The turns of one rollout of one task."""

    task_id: str
    env_name: str
    seed: int
    task_type: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0  # episode reward used for GRPO (e.g. 10 * won for ALFWorld)
    won: bool = False
    stop_reason: StopReason = StopReason.MAX_TURNS
    criteria: list[CriterionResult] = field(default_factory=list)
    task_text: str = ""
    context_ids: list[str] = field(default_factory=list)  # privileged context offered (skill ids): UCB
    privileged_hint: str = ""  # the env's privileged state as text (TextEnv.privileged_hint), for a hints teacher
    error: str = ""  # why the episode was cut short by its env (reset or step raised, or timed out)

    @property
    def n_turns(self) -> int:
        return len(self.turns)


@dataclass(kw_only=True, slots=True)
class EpisodeGroup:
    """The G episodes of one task under one seed: the unit of GRPO statistics.

    Only complete groups travel from rollout to the buffer.
    """

    task_id: str
    seed: int
    episodes: list[Episode]
    worker_id: int = 0
    rollout_seconds: float = 0.0
    n_generated_tokens: int = 0
    teacher_seconds: float = 0.0  # the scorer's time on this group
    teacher_prompt_tokens: int = 0  # tokens of its privileged prompts (all scored rows)
    # Episodes no policy played, trained by imitation only (the equal-information baseline's hinted
    # expert): never in the group's statistics, after the group's own rows in the learner's batch.
    demonstrations: list[Episode] = field(default_factory=list)

    @property
    def min_version(self) -> int:
        return min((t.policy_version for e in self.episodes for t in e.turns), default=0)

    @property
    def max_version(self) -> int:
        return max((t.policy_version for e in self.episodes for t in e.turns), default=0)

    def rows(self) -> list[TurnRecord]:
        """The policy's rows: the unit of the group's statistics."""
        return [t for e in self.episodes for t in e.turns]

    def train_rows(self) -> list[TurnRecord]:
        """What the learner's batch holds for this group: its rows, then its demonstrations' rows."""
        return self.rows() + [t for e in self.demonstrations for t in e.turns]


@dataclass(frozen=True)
class TeacherChannel:
    """A per-token quantity of the teacher's predictive distribution that a signal asks the
    scorer for, beside the log-prob of the sampled token (``TeacherNeeds.channels``).

    ``fn`` maps the temperature-scaled log-softmax at a row's response positions, ``[n, V]``
    float32, to one value per position, ``[n]``. It must be a module-level function: the need
    travels to the scorer's process by reference, which imports the function's module there.
    """

    name: str
    fn: Callable


@dataclass(frozen=True)
class TeacherNeeds:
    """What a signal needs from one teacher forward, per response token of a scored row: the
    log-prob of the sampled token always; ``support_k`` > 0: also the teacher's log-probs at the
    student's top-k ids (the same weights on the student's prompt give them: a self-teacher);
    ``channels``: quantities of the whole distribution."""

    support_k: int = 0
    channels: tuple[TeacherChannel, ...] = ()
    asked_by: str = ""  # what asks for it, for messages (e.g. "method.estimator=topk_rkl")

    @property
    def whole_distribution(self) -> bool:
        """Whether the scoring needs the teacher's logits over the vocabulary (not only the log-prob
        of a given token, all that vLLM's prompt log-probs give)."""
        return bool(self.support_k or self.channels)


@dataclass(kw_only=True, slots=True)
class TeacherOutput:
    """One scoring call's answer, per item (privileged prompt ids, response ids), in item order."""

    logprobs: list[list[float]]  # [items][n_response] lpT of each sampled token
    version: int = 0  # the weights version that scored every item
    # [items][n_response] the same weights on the student's own prompt (the ``plain`` items):
    # the noise floor, and the student whose top-k is the support
    plain_logprobs: list[list[float]] | None = None
    topk_ids: list[list[list[int]]] | None = None  # [items][n_response][k] (TeacherNeeds.support_k)
    topk_logprobs: list[list[list[float]]] | None = None  # [items][n_response][k] lpT at topk_ids
    channels: dict[str, list[list[float]]] = field(default_factory=dict)  # name -> [items][n_response]


@dataclass(kw_only=True, slots=True, frozen=True)
class AuxTerm:
    """One auxiliary loss component the learner adds as ``coef * component``.

    The learner looks ``kind`` up in the loss specs (``pipeline.algorithm.aux_losses.LOSSES``, where
    an unknown kind is refused); it never knows which method asked for it.
    """

    name: str  # metric prefix, e.g. "sdar"
    kind: str  # the name of a loss spec (a signal's estimator, or "nll")
    coef: float
    gate_beta: float | None = None  # SDAR's gate sharpness (gated losses only); None = no gate


T = TypeVar("T")


@dataclass(kw_only=True, slots=True)
class Distill(Generic[T]):
    """The per-token inputs of the auxiliary loss terms, one typed field each (None: absent).

    In a ``Credit`` a field holds one list per row, ``[B][n_response]`` (the top-k fields
    ``[B][n_response][k]``); in a ``TrainBatch`` the same field is a tensor aligned with
    ``input_ids``, ``[B, T]`` (``[B, T, k]``), float32 except where the field's metadata says
    ``dtype: int64``.
    """

    # 1 on the policy's rows, 0 on demonstrations: no behaviour sampled those, so the policy term,
    # the entropy bonus and the reference KL leave them out (sum and denominator alike)
    policy_mask: T | None = None
    distill_mask: T | None = None  # the tokens the terms touch, as weights in [0, 1]; None: every one
    teacher_logprobs: T | None = None  # lpT of the sampled token (the scorer's)
    topk_ids: T | None = field(default=None, metadata={"dtype": "int64"})  # the student's top-k ids
    topk_teacher_logprobs: T | None = None  # lpT at those ids

    def present(self) -> dict[str, T]:
        """The fields that are set, by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def map(self, fn: Callable[[T], Any]) -> "Distill":
        """The same record with ``fn`` applied to every field that is set."""
        return Distill(**{k: fn(v) for k, v in self.present().items()})


def distill_dtype(name: str) -> str:
    """The tensor dtype of a ``Distill`` field in a batch: "int64" or "float32"."""
    return next(f.metadata.get("dtype", "float32") for f in fields(Distill) if f.name == name)


@dataclass(kw_only=True, slots=True)
class Credit:
    """A method's output for one batch of rows (row order = the groups' rows, concatenated)."""

    advantages: list[list[float]]  # [B][n_response] per-token advantage of each row
    distill: Distill[list] = field(default_factory=Distill)  # the aux terms' per-token inputs, per row
    aux_terms: list[AuxTerm] = field(default_factory=list)
    entropy_coef: float | None = None  # None = learner.entropy_coef
    policy_loss_coef: float = 1.0
    # Privileged prompts for learner-side teacher forwards (estimator "full"): [B][n_prompt'].
    teacher_prompt_ids: list[list[int]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class TrainBatch:
    """Padded tensors for the learner, built from groups after credit assignment.

    Positions are aligned with ``input_ids``: a value at position t describes the token at t
    (predicted from position t-1). Only positions with ``response_mask`` carry loss.
    """

    input_ids: "torch.Tensor"  # [B, T] long, prompt + response, right-padded
    attention_mask: "torch.Tensor"  # [B, T] long
    response_mask: "torch.Tensor"  # [B, T] float, 1 on sampled response tokens
    behaviour_logprobs: "torch.Tensor"  # [B, T] float
    advantages: "torch.Tensor"  # [B, T] float
    distill: "Distill[torch.Tensor]" = field(default_factory=Distill)  # the aux terms' inputs, [B, T(, k)]
    aux_terms: list[AuxTerm] = field(default_factory=list)
    # Privileged inputs for learner-side teacher forwards (estimator "full"): [B, T'] each.
    teacher_input_ids: "torch.Tensor | None" = None
    teacher_attention_mask: "torch.Tensor | None" = None
    teacher_response_mask: "torch.Tensor | None" = None
    policy_loss_coef: float = 1.0
    entropy_coef: float = 0.0
    versions: list[int] = field(default_factory=list)  # [B] behaviour version of each row
    # Response tokens of rows left out because their loss is exactly 0 (``drop_silent_rows``):
    # token_mean's denominator still counts them, so the gradient is that of the full batch.
    extra_loss_tokens: float = 0.0

    @property
    def n_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.response_mask.sum().item())
