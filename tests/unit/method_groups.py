"""Hand-built episode groups for the method tests (not a test module)."""

from __future__ import annotations

from pipeline.core.types import CriterionResult, Episode, EpisodeGroup, Message, TurnRecord
from pipeline.methods import build_method

PENALTY = 0.1


def turn(
    index: int,
    old: list[float],
    *,
    lpt: list[float] | None = None,
    valid: bool = True,
    anchor: str = "",
    step_reward: float = 0.0,
    thinking_len: int = 0,
) -> TurnRecord:
    n = len(old)
    return TurnRecord(
        prompt_ids=[1, 2, 3 + index],
        response_ids=list(range(10, 10 + n)),
        behaviour_logprobs=list(old),
        policy_version=0,
        turn_index=index,
        messages=[Message(role="user", content=f"obs {index}")],
        action_valid=valid,
        anchor_obs=anchor or f"obs {index}",
        step_reward=step_reward,
        thinking_len=thinking_len,
        teacher_logprobs=None if lpt is None else list(lpt),
    )


def episode(
    turns: list[TurnRecord], reward: float = 0.0, *, won: bool = False, criteria: list[CriterionResult] | None = None
) -> Episode:
    return Episode(
        task_id="t", env_name="test", seed=0, turns=turns, reward=reward, won=won, criteria=list(criteria or [])
    )


def group(task_id: str, episodes: list[Episode]) -> EpisodeGroup:
    return EpisodeGroup(task_id=task_id, seed=0, episodes=episodes)


def scored_groups() -> list[EpisodeGroup]:
    """2 groups x 3 / 2 episodes, every row scored by a teacher (lpT given by hand)."""
    g1 = group(
        "a",
        [
            episode(
                [turn(0, [-1.0, -2.0], lpt=[-0.5, -2.5]), turn(1, [-0.2, -0.3, -0.4], lpt=[-0.2, -1.0, 0.0])],
                reward=10.0,
                won=True,
            ),
            episode([turn(0, [-1.5, -0.1], lpt=[-1.0, -0.6], valid=False), turn(1, [-0.7], lpt=[-0.3])], reward=0.0),
            episode([turn(0, [-0.9, -0.8, -0.6], lpt=[-1.9, -0.8, -0.1])], reward=0.0),
        ],
    )
    g2 = group(
        "b",
        [
            episode([turn(0, [-0.4, -1.2], lpt=[-0.4, -0.2]), turn(1, [-2.0], lpt=[-3.0])], reward=10.0, won=True),
            episode([turn(0, [-0.3, -0.5], lpt=[-0.1, -1.5])], reward=10.0, won=True),
        ],
    )
    return [g1, g2]


def unscored(groups: list[EpisodeGroup]) -> list[EpisodeGroup]:
    for g in groups:
        for r in g.rows():
            r.teacher_logprobs = None
    return groups


def build(name: str, **options):
    return build_method({"name": name, **options}, invalid_action_penalty=PENALTY)
