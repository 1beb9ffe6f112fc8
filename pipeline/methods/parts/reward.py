"""``reward`` parts: the episode reward the advantages are computed from.

- ``env``: the env's episode reward (``Episode.reward``).
- ``criteria`` (targeted guidance): recomputed from the judge's verdicts and the win, the record
  itself unchanged::

      R = success_weight * won + criteria_weight * sum_c w_c * passed_c / sum_c w_c

  with ``w_c = criterion_weights.get(c, 1)`` (an episode without criteria gets only the first
  term). Ablation ``criterion_reward: false``: ``R = success_weight * won``. Metrics
  ``<prefix>/reward_mean`` and ``<prefix>/pass/<criterion>`` (pass rate).
"""

from __future__ import annotations

import dataclasses

from pipeline.core.types import Episode, EpisodeGroup, criterion_pass_rates
from pipeline.methods.options import require
from pipeline.methods.parts.base import Part


class Reward(Part, slot="reward"):
    """What the method asks of any reward part."""

    def episode_reward(self, episode: Episode) -> float:
        raise NotImplementedError

    def metrics(self, groups: list[EpisodeGroup]) -> dict[str, float]:
        return {}


class EnvReward(Reward, kind="env"):
    """The env's episode reward."""

    def episode_reward(self, episode: Episode) -> float:
        return episode.reward


class CriteriaReward(Reward, kind="criteria"):
    """The reward recomputed from the judge's verdicts and the win (targeted guidance)."""

    @dataclasses.dataclass
    class Options:
        criterion_reward: bool = True  # ablation false: RL reward from task success only
        success_weight: float = 1.0  # weight of task success (won) in the reward, >= 0
        criteria_weight: float = 1.0  # weight of the weighted criterion pass rate, >= 0
        criterion_weights: dict[str, float] = dataclasses.field(default_factory=dict)  # per criterion, default 1

        def validate(self, method: str) -> None:
            require(
                self.success_weight >= 0.0 and self.criteria_weight >= 0.0,
                f"method={method}: method.success_weight and method.criteria_weight must be >= 0",
            )
            bad = {k: v for k, v in dict(self.criterion_weights).items() if not isinstance(v, (int, float)) or v < 0}
            require(not bad, f"method={method}: method.criterion_weights {bad} must be numbers >= 0")

    def episode_reward(self, episode: Episode) -> float:
        o = self.opts
        reward = o.success_weight * float(episode.won)
        if o.criterion_reward and episode.criteria:
            weights = [float(o.criterion_weights.get(c.criterion, 1.0)) for c in episode.criteria]
            total = sum(weights)
            if total > 0:
                passed = sum(w for w, c in zip(weights, episode.criteria) if c.passed)
                reward += o.criteria_weight * passed / total
        return reward

    def metrics(self, groups: list[EpisodeGroup]) -> dict[str, float]:
        episodes = [e for g in groups for e in g.episodes]
        prefix = self.setting.prefix
        out = {f"{prefix}/reward_mean": sum(self.episode_reward(e) for e in episodes) / max(len(episodes), 1)}
        out.update({f"{prefix}/pass/{name}": rate for name, rate in criterion_pass_rates(episodes).items()})
        return out
