"""Where a run's actors go: one Ray placement group with a bundle per actor (or per colocated pair).

Planning is pure (``plan_placement``, ``check_gpus``): from the config it lists the bundles of the
learner ranks, the rollout engines and the teacher scorer, and raises ``ConfigError`` for a
combination that cannot work, saying what to change. ``reserve`` is the only part that talks to
Ray: it creates the placement group, waits for it, and hands back each actor's ``.options()``.

- ``cluster.placement=none``: no placement group; Ray places each actor on its own (CPU default).
- ``pack`` / ``spread``: bundles of ``{CPU: num_cpus, GPU: num_gpus}``, M learner bundles then N
  rollout bundles, and one scorer bundle when the method has a teacher scorer that asks for CPUs
  or GPUs (``scorer.num_cpus`` / ``num_gpus``; Ray refuses an empty bundle, and a scorer with no
  reservation needs none). PACK
  keeps the bundles on as few nodes as possible (the learners' NCCL traffic stays local), SPREAD
  puts them on as many as possible.
- ``colocate=true``: learner rank i and rollout engine i share bundle i, which reserves one whole
  GPU, so that no two pairs ever land on the same GPU (NCCL refuses two ranks of one group on one
  device). With ``pack`` the group is STRICT_PACK (all pairs on one node, or a clear failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.config import ConfigError, PrivyConfig

EPS = 1e-9


class PlacementError(ConfigError):
    """The cluster cannot host what the run asks for; the message says what was asked and had."""


@dataclass(frozen=True)
class ActorPlacement:
    num_cpus: float
    num_gpus: float
    bundle: int | None  # index into PlacementPlan.bundles; None = outside the placement group


@dataclass
class PlacementPlan:
    strategy: str | None  # PACK | SPREAD | STRICT_PACK; None = no placement group
    bundles: list[dict[str, float]] = field(default_factory=list)
    learners: list[ActorPlacement] = field(default_factory=list)
    rollouts: list[ActorPlacement] = field(default_factory=list)
    scorer: ActorPlacement | None = None

    @property
    def gpus(self) -> float:
        """GPUs the run reserves: the bundles' when grouped, else the actors' own requests."""
        if self.strategy is not None:
            return sum(b.get("GPU", 0.0) for b in self.bundles)
        actors = [*self.learners, *self.rollouts, *([self.scorer] if self.scorer else [])]
        return sum(a.num_gpus for a in actors)

    def describe(self) -> str:
        parts = []
        for name, actors in (
            ("learner", self.learners),
            ("rollout", self.rollouts),
            ("scorer", [self.scorer] if self.scorer else []),
        ):
            if actors:
                a = actors[0]
                parts.append(f"{len(actors)} {name} x {{CPU: {a.num_cpus:g}, GPU: {a.num_gpus:g}}}")
        text = ", ".join(parts)
        if self.strategy is not None:
            text += f"; {len(self.bundles)} bundles {_fmt_bundles(self.bundles)}, strategy {self.strategy}"
        return text


def _fmt_bundles(bundles: list[dict[str, float]]) -> str:
    """``[{CPU: 1, GPU: 1} x 4, {CPU: 0.5} x 2]`` (runs of equal bundles collapsed)."""
    runs: list[list] = []
    for b in bundles:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    items = ["{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}" + (f" x {n}" if n > 1 else "") for b, n in runs]
    return "[" + ", ".join(items) + "]"


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {k: float(v) for k, v in (("CPU", cpus), ("GPU", gpus)) if v > EPS}


def plan_placement(cfg: PrivyConfig, *, with_scorer: bool) -> PlacementPlan:
    """Bundles and per-actor resources for ``cfg``; raises ConfigError for what cannot work."""
    lr, ro, c = cfg.learner, cfg.rollout, cfg.cluster
    m, n = lr.num_learners, ro.num_workers
    lc, lg, rc, rg = lr.num_cpus, lr.num_gpus, ro.num_cpus, ro.num_gpus
    tp = ro.vllm.tensor_parallel_size
    _check_gpu_requests(cfg)

    if c.placement == "none":
        return PlacementPlan(
            strategy=None,
            learners=[ActorPlacement(lc, lg, None) for _ in range(m)],
            rollouts=[ActorPlacement(rc, rg, None) for _ in range(n)],
            scorer=ActorPlacement(cfg.scorer.num_cpus, cfg.scorer.num_gpus, None) if with_scorer else None,
        )

    bundles: list[dict[str, float]] = []
    if c.colocate:
        if m != n:
            raise ConfigError(
                f"cluster.colocate=true pairs learner rank i with rollout engine i: set "
                f"learner.num_learners = rollout.num_workers (got {m} and {n})"
            )
        if lg + rg > 1 + EPS:
            raise ConfigError(
                f"cluster.colocate=true: a learner rank and a rollout engine share one GPU, "
                f"but learner.num_gpus + rollout.num_gpus = {lg:g} + {rg:g} > 1: set "
                "e.g. learner.num_gpus=0.5 rollout.num_gpus=0.5, or cluster.colocate=false"
            )
        if tp > 1:
            raise ConfigError(
                f"cluster.colocate=true: a colocated engine has one GPU, but "
                f"rollout.vllm.tensor_parallel_size={tp}: set it to 1, or cluster.colocate=false"
            )
        # The pair's bundle reserves a whole GPU whatever the fractions: two bundles of 0.5 could
        # otherwise share one GPU, putting two learner ranks of one NCCL group on one device.
        pair = _bundle(lc + rc, 1.0 if lg + rg > EPS else 0.0)
        _require_nonempty(pair, "a colocated learner + rollout pair", "learner.num_cpus / rollout.num_cpus")
        bundles = [dict(pair) for _ in range(m)]
        learners = [ActorPlacement(lc, lg, i) for i in range(m)]
        rollouts = [ActorPlacement(rc, rg, i) for i in range(n)]
    else:
        lb, rb = _bundle(lc, lg), _bundle(rc, rg)
        _require_nonempty(lb, "a learner rank", "learner.num_cpus")
        _require_nonempty(rb, "a rollout engine", "rollout.num_cpus")
        bundles = [dict(lb) for _ in range(m)] + [dict(rb) for _ in range(n)]
        learners = [ActorPlacement(lc, lg, i) for i in range(m)]
        rollouts = [ActorPlacement(rc, rg, m + i) for i in range(n)]
    scorer = _place_scorer(cfg, bundles) if with_scorer else None
    if c.placement == "spread":
        strategy = "SPREAD"
    else:
        strategy = "STRICT_PACK" if c.colocate else "PACK"
    return PlacementPlan(strategy=strategy, bundles=bundles, learners=learners, rollouts=rollouts, scorer=scorer)


def _place_scorer(cfg: PrivyConfig, bundles: list[dict[str, float]]) -> ActorPlacement:
    """The scorer's bundle (appended to ``bundles``) when it reserves CPUs or GPUs; none when it
    reserves nothing (Ray refuses an empty bundle)."""
    sc, sg = cfg.scorer.num_cpus, cfg.scorer.num_gpus
    if not (bundle := _bundle(sc, sg)):
        return ActorPlacement(0.0, 0.0, None)
    bundles.append(bundle)
    return ActorPlacement(sc, sg, len(bundles) - 1)


def _require_nonempty(bundle: dict[str, float], what: str, key: str) -> None:
    if not bundle:
        raise ConfigError(
            f"cluster.placement: {what} asks for no CPU and no GPU, and Ray refuses an "
            f"empty bundle: give it a fraction of a CPU ({key}=0.5) or cluster.placement=none"
        )


def _check_gpu_requests(cfg: PrivyConfig) -> None:
    """Per-actor GPU requests that no placement can make work."""
    lr, ro, c = cfg.learner, cfg.rollout, cfg.cluster
    lg, rg, tp = lr.num_gpus, ro.num_gpus, ro.vllm.tensor_parallel_size
    if lg > 1 + EPS:
        raise ConfigError(
            f"learner.num_gpus={lg:g}: a learner rank drives one GPU; for more GPUs raise "
            "learner.num_learners (one rank per GPU) and set learner.num_gpus=1"
        )
    if lr.num_learners > 1 and EPS < lg < 1 - EPS and not c.colocate:
        raise ConfigError(
            f"learner.num_gpus={lg:g} with learner.num_learners={lr.num_learners}: Ray may "
            "put two ranks on one GPU, which NCCL refuses (Duplicate GPU detected): set "
            "learner.num_gpus=1, or cluster.colocate=true to share each GPU with a rollout engine"
        )
    if ro.engine == "vllm" and rg > EPS:
        if rg < 1 - EPS and tp > 1:
            raise ConfigError(
                f"rollout.vllm.tensor_parallel_size={tp} needs {tp} whole GPUs per engine: "
                f"set rollout.num_gpus={tp} (got {rg:g})"
            )
        if rg >= 1 - EPS and abs(rg - tp) > EPS:
            raise ConfigError(
                f"rollout.num_gpus={rg:g} but rollout.vllm.tensor_parallel_size={tp}: vLLM "
                f"uses the GPUs Ray gives the engine, one per tensor-parallel rank; set "
                f"rollout.num_gpus={tp}"
            )


def check_gpus(plan: PlacementPlan, have: float, where: str) -> None:
    """Raise PlacementError when the plan asks for more GPUs than ``where`` has in total."""
    need = plan.gpus
    if need > have + EPS:
        hint = (
            "set learner.num_gpus=0 rollout.num_gpus=0 scorer.num_gpus=0 to run on CPUs, "
            "or join a GPU cluster (cluster=existing or a conf/cluster/gpu_* config)"
            if have <= EPS
            else "lower learner.num_learners / rollout.num_workers or their num_gpus, or add nodes"
        )
        raise PlacementError(f"the run asks for {need:g} GPUs ({plan.describe()}) but {where} has {have:g}: {hint}")


def cluster_gpus(cfg: PrivyConfig) -> tuple[float, str] | None:
    """Total GPUs of the Ray the run uses and a name for it, or None when that is not known yet
    (joining a cluster this process is not connected to)."""
    import ray

    if ray.is_initialized():
        where = "the Ray cluster" if cfg.cluster.address is not None else "the local Ray"
        return float(ray.cluster_resources().get("GPU", 0.0)), where
    if cfg.cluster.address is None:
        import torch

        # ray.init(address="local") detects this machine's GPUs as torch does (CUDA_VISIBLE_DEVICES).
        return float(torch.cuda.device_count()), "the local Ray (this machine)"
    return None


def check_launch_gpus(cfg: PrivyConfig, plan: PlacementPlan) -> None:
    """The GPUs asked for exist (in total) in the Ray the run uses, as far as it is known now."""
    if plan.gpus <= EPS:
        return
    known = cluster_gpus(cfg)
    if known is not None:
        check_gpus(plan, *known)


class Reservation:
    """A reserved plan: per-actor ``.options()`` keyword arguments, and ``remove()``."""

    def __init__(self, plan: PlacementPlan, pg=None):
        self.plan = plan
        self.pg = pg

    def _options(self, a: ActorPlacement) -> dict:
        opts: dict = {"num_cpus": a.num_cpus}
        if a.num_gpus > EPS:
            opts["num_gpus"] = a.num_gpus
        if self.pg is not None and a.bundle is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=a.bundle
            )
        return opts

    def learner(self, rank: int) -> dict:
        return self._options(self.plan.learners[rank])

    def rollout(self, i: int) -> dict:
        return self._options(self.plan.rollouts[i])

    def scorer(self) -> dict:
        return self._options(self.plan.scorer or ActorPlacement(0.0, 0.0, None))

    def remove(self) -> None:
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.pg)
            except Exception:  # already gone with its job
                pass
            self.pg = None


def reserve(plan: PlacementPlan, timeout_s: float) -> Reservation:
    """Create the plan's placement group and wait for it; PlacementError (asked vs. the cluster's
    resources) when it cannot be placed within ``timeout_s``."""
    if plan.strategy is None:
        return Reservation(plan)
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(plan.bundles, strategy=plan.strategy)
    if not pg.wait(timeout_seconds=timeout_s):
        total, free = ray.cluster_resources(), ray.available_resources()
        remove_placement_group(pg)
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        per_node = ", ".join(
            "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(r.items()) if k in ("CPU", "GPU")) + "}" for r in nodes
        )
        raise PlacementError(
            f"the placement group could not be placed within {timeout_s:g} s: asked {plan.describe()}; "
            f"the cluster has {_fmt_res(total)} (free now {_fmt_res(free)}; per node {per_node}). "
            "Lower the actors' num_cpus / num_gpus or their counts, use cluster.placement=spread "
            "(or pack without colocate) when no single node fits, wait for other jobs to finish, or "
            "raise cluster.placement_timeout_s"
        )
    return Reservation(plan, pg)


def _fmt_res(res: dict) -> str:
    return "{" + ", ".join(f"{k}: {res[k]:g}" for k in ("CPU", "GPU") if k in res) + "}"


__all__ = [
    "ActorPlacement",
    "Reservation",
    "PlacementError",
    "PlacementPlan",
    "check_gpus",
    "check_launch_gpus",
    "cluster_gpus",
    "plan_placement",
    "reserve",
]
