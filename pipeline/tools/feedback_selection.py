"""Feedback selection for targeted guidance (docs/methods.md): keep only feedback strings that help.

For each criterion's candidate strings (``{criterion: [string, ...]}``, JSON or YAML), the base
policy plays the same N tasks (seeds ``0..N-1``, one episode each, the same sampling seeds) once
WITHOUT feedback and once WITH each string, the string appended to the last user message exactly
as the teacher prompt places it (``pipeline.context.placement.insert_feedback``). A string is adopted iff

    pass_rate_with(criterion)  >  pass_rate_without(criterion) + min_gain    and
    success_with               >= success_without                              (won rate)

An episode that ends without a verdict for the criterion counts as not passed. Outputs:
``adopted.json`` (``{criterion: [adopted strings]}``, every criterion present) and
``feedback_selection.md`` (criterion, string, pass rate with/without, success with/without, adopted).
``select`` takes the evaluation as a callback, so the rule is testable without a model;
``evaluate_with_worker`` is the callback over ``actors.rollout.RolloutWorker``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.context.providers import FeedbackView
from pipeline.core.types import Episode


@dataclass(frozen=True)
class Rates:
    """Pass rate per criterion and task success (won rate) over the evaluated episodes."""

    passed: dict[str, float]
    success: float
    n: int


@dataclass(frozen=True)
class Outcome:
    criterion: str
    feedback: str
    pass_with: float
    pass_without: float
    success_with: float
    success_without: float
    adopted: bool


def load_candidates(path: str | Path) -> dict[str, list[str]]:
    """``{criterion: [strings]}`` from a .json or .yaml/.yml file; ValueError on a bad shape."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v) for k, v in data.items()
    ):
        raise ValueError(f"{path}: expected a mapping {{criterion: [feedback strings]}}")
    return {k: list(v) for k, v in data.items()}


def rates(episodes: Sequence[Episode], criteria: Sequence[str]) -> Rates:
    n = len(episodes)
    if n == 0:
        return Rates({c: 0.0 for c in criteria}, 0.0, 0)
    passed = {c: sum(any(r.criterion == c and r.passed for r in ep.criteria) for ep in episodes) / n for c in criteria}
    return Rates(passed, sum(bool(ep.won) for ep in episodes) / n, n)


def adopt(
    pass_with: float, pass_without: float, success_with: float, success_without: float, min_gain: float = 0.0
) -> bool:
    """The adoption rule: the criterion's pass rate rises, task success does not fall."""
    return pass_with > pass_without + min_gain and success_with >= success_without


def select(
    candidates: dict[str, list[str]], evaluate: Callable[[str | None], Rates], min_gain: float = 0.0
) -> list[Outcome]:
    """Evaluate the baseline once (``evaluate(None)``) and every candidate string, apply ``adopt``."""
    base = evaluate(None)
    outcomes = []
    for criterion, strings in candidates.items():
        for feedback in strings:
            r = evaluate(feedback)
            pw, pwo = r.passed.get(criterion, 0.0), base.passed.get(criterion, 0.0)
            outcomes.append(
                Outcome(
                    criterion,
                    feedback,
                    pw,
                    pwo,
                    r.success,
                    base.success,
                    adopt(pw, pwo, r.success, base.success, min_gain),
                )
            )
    return outcomes


def adopted_map(candidates: dict[str, list[str]], outcomes: Sequence[Outcome]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {c: [] for c in candidates}
    for o in outcomes:
        if o.adopted:
            out.setdefault(o.criterion, []).append(o.feedback)
    return out


def markdown_table(outcomes: Sequence[Outcome], n_tasks: int | None = None) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = []
    if n_tasks is not None:
        lines += [f"Feedback selection over {n_tasks} tasks (one episode each).", ""]
    lines += [
        "| criterion | feedback | pass with | pass without | success with | success without | adopted |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {cell(o.criterion)} | {cell(o.feedback)} | {o.pass_with:.3f} | {o.pass_without:.3f} | "
            f"{o.success_with:.3f} | {o.success_without:.3f} | {'yes' if o.adopted else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(
    out_dir: str | Path, candidates: dict[str, list[str]], outcomes: Sequence[Outcome], n_tasks: int | None = None
) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    adopted_path, table_path = out / "adopted.json", out / "feedback_selection.md"
    adopted_path.write_text(json.dumps(adopted_map(candidates, outcomes), indent=2) + "\n")
    table_path.write_text(markdown_table(outcomes, n_tasks))
    (out / "outcomes.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return adopted_path, table_path


def feedback_view(feedback: str) -> FeedbackView:
    """The student view that puts ``feedback`` right before every response (as the teacher prompt
    of targeted guidance places it)."""
    return FeedbackView(feedback={0: [feedback]})


def evaluate_with_worker(
    worker,
    criteria: Sequence[str],
    n_tasks: int,
    *,
    split: str = "train",
    temperature: float = 0.0,
    sample_seed: int = 0,
) -> Callable[[str | None], Rates]:
    """The ``select`` callback: one episode (``group_size`` 1) per task seed ``0..n_tasks-1``."""

    def evaluate(feedback: str | None) -> Rates:
        view = None if feedback is None else feedback_view(feedback)
        episodes = []
        for seed in range(n_tasks):
            group = worker.run_group(
                task_seed=seed,
                split=split,
                group_size=1,
                temperature=temperature,
                sample_seed=sample_seed + seed,
                view=view,
            )
            episodes.extend(group.episodes)
        return rates(episodes, criteria)

    return evaluate


def run(
    *,
    env: str,
    candidates: dict[str, list[str]],
    n_tasks: int,
    model: str,
    out_dir: str | Path,
    env_options: dict | None = None,
    split: str = "train",
    temperature: float = 0.0,
    max_new_tokens: int = 48,
    history_length: int = 2,
    sample_seed: int = 0,
    min_gain: float = 0.0,
    precision: str = "auto",
    max_prompt_tokens: int = 1536,
    engine=None,
) -> list[Outcome]:
    """Build the HF engine + rollout worker, run the selection, write the outputs."""
    from pipeline.core.config import EnvConfig, RolloutConfig
    from pipeline.models import resolve_model
    from pipeline.orchestration.launch import local_rollout_worker

    path = str(resolve_model(model))
    rcfg = RolloutConfig(
        engine="hf",
        group_size=1,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        temperature=temperature,
        precision=precision,
    )
    ecfg = EnvConfig(name=env, history_length=history_length, options=dict(env_options or {}))
    worker = local_rollout_worker(rcfg, ecfg, path, engine=engine)  # engine=None: the HF engine at `precision`
    evaluate = evaluate_with_worker(
        worker, list(candidates), n_tasks, split=split, temperature=temperature, sample_seed=sample_seed
    )
    outcomes = select(candidates, evaluate, min_gain)
    write_outputs(out_dir, candidates, outcomes, n_tasks)
    return outcomes


__all__ = [
    "Outcome",
    "Rates",
    "adopt",
    "adopted_map",
    "evaluate_with_worker",
    "feedback_view",
    "load_candidates",
    "markdown_table",
    "rates",
    "run",
    "select",
    "write_outputs",
]
