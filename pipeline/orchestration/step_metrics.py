"""What a training step and a validation report about their groups: rollout outcomes, the
teacher's work, and the teacher's per-token gap beside the noise floor."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pipeline.core.types import EpisodeGroup, StopReason, criterion_pass_rates


def teacher_metrics(groups: list[EpisodeGroup], follows_policy: bool) -> dict[str, float]:
    """The scorer's work on the step's groups (done while they completed, off the learner's path)."""
    rows = [r for g in groups for r in g.rows()]
    scored = [r for r in rows if r.teacher_logprobs is not None]
    out = {
        "teacher/seconds": sum(g.teacher_seconds for g in groups),
        "teacher/rows_scored_frac": len(scored) / max(len(rows), 1),
        "teacher/prompt_tokens": sum(g.teacher_prompt_tokens for g in groups) / max(len(scored), 1),
    }
    if scored and follows_policy:
        out["teacher/staleness"] = sum(r.teacher_version - r.policy_version for r in scored) / len(scored)
    out.update(gap_statistics("teacher", [(r.teacher_logprobs, r.behaviour_logprobs) for r in scored]))
    out.update(
        gap_statistics(
            "noise",
            [(r.plain_teacher_logprobs, r.behaviour_logprobs) for r in scored if r.plain_teacher_logprobs is not None],
        )
    )
    return out


def gap_statistics(prefix: str, pairs: list[tuple[list[float], list[float]]]) -> dict[str, float]:
    """Per-token gap ``lpT - lp_behaviour`` over every token of ``pairs``: mean, std, mean |gap| and
    the fraction below 0. With ``noise`` (the teacher on the student's own prompt) beside
    ``teacher`` (on the privileged one), what the privileged context adds stands against what
    two forwards of the same weights differ by anyway."""
    gaps = [t - b for lpt, lpb in pairs for t, b in zip(lpt, lpb)]
    if not gaps:
        return {}
    n = len(gaps)
    mean = sum(gaps) / n
    absolute = sorted(abs(g) for g in gaps)
    return {
        f"{prefix}/gap_mean": mean,
        f"{prefix}/gap_std": (sum((g - mean) ** 2 for g in gaps) / max(n - 1, 1)) ** 0.5,
        f"{prefix}/gap_abs_mean": sum(absolute) / n,
        f"{prefix}/gap_abs_p99": absolute[min(n - 1, int(0.99 * n))],
        f"{prefix}/negative_gap_fraction": sum(g < 0 for g in gaps) / n,
    }


def check_noise_floor(metrics: dict[str, float], max_ratio: float | None, precisions: str) -> None:
    """Refuse a teacher whose noise floor (``noise/gap_abs_mean``: the same teacher on the
    student's own prompt against the behaviour log-probs) is above ``max_ratio`` x its signal
    (``teacher/gap_abs_mean``, with the privileged context): what it would teach is mostly the
    numerics of two engines, not the context (slime #714, SkyRL's pre-flight test)."""
    floor, signal = metrics.get("noise/gap_abs_mean"), metrics.get("teacher/gap_abs_mean")
    if max_ratio is None or floor is None or signal is None or floor <= max_ratio * signal:
        return
    from pipeline.core.config import ConfigError

    raise ConfigError(
        f"scorer.max_noise_ratio={max_ratio:g}: the teacher's noise floor, mean |lpT - lp| per token on the "
        f"student's own prompt, is {floor:.4f} (p99 {metrics.get('noise/gap_abs_p99', float('nan')):.4f}), "
        f"{floor / max(signal, 1e-12):.2f}x its signal with the privileged context ({signal:.4f}): it would "
        f"teach the engines' numerics. Match the precisions ({precisions}), score on the rollout engine "
        "(scorer.placement=engine), or raise scorer.max_noise_ratio (null: never refuse)"
    )


def rollout_metrics(groups: list[EpisodeGroup], invalid_penalty: float) -> dict[str, float]:
    """Reward, success (overall and per task type), valid-action rate, turns, response length, and
    each rubric criterion's pass rate over the episodes judged on it (a criterion moves long before
    task success, which needs all of them)."""
    eps = [e for g in groups for e in g.episodes]
    rows = [t for e in eps for t in e.turns]
    n_eps, n_rows = max(len(eps), 1), max(len(rows), 1)
    out: dict[str, Any] = {
        "rollout/reward": sum(e.reward for e in eps) / n_eps,
        "rollout/success": sum(e.won for e in eps) / n_eps,
        "rollout/valid_action_rate": sum(t.action_valid for t in rows) / n_rows,
        "rollout/turns_per_episode": len(rows) / n_eps,
        "rollout/response_tokens": sum(t.n_response for t in rows) / n_rows,
        "rollout/prompt_truncated_frac": sum(t.truncated_prompt for t in rows) / n_rows,
        "rollout/row_score": sum(_row_score(e.reward, t.action_valid, invalid_penalty) for e in eps for t in e.turns)
        / n_rows,
        "rollout/env_errors": float(sum(bool(e.error) for e in eps)),
        # env.prompt_format=chat: episodes whose conversation outgrew rollout.max_prompt_tokens
        "rollout/context_full_frac": sum(e.stop_reason is StopReason.CONTEXT for e in eps) / n_eps,
    }
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in eps:
        if e.task_type:
            by_type[e.task_type].append(e.won)
    for tt, wins in by_type.items():
        out[f"rollout/success/{tt}"] = sum(wins) / len(wins)
    out.update({f"rollout/criteria/{name}": rate for name, rate in criterion_pass_rates(eps).items()})
    return out


def _row_score(reward: float, valid: bool, penalty: float) -> float:
    return reward - (0.0 if valid else penalty)
