"""Expert warm start: behaviour cloning of the env's expert before RL, cached like a converted model.

1. **Rows.** The env's expert (``TextEnv.expert_response``: e.g. ALFWorld's searching expert, in the
   strict ``<think>..</think><action>..</action>`` protocol) plays train tasks 0..tasks-1 through
   the real env. Each expert turn becomes a row whose prompt is built by the rollout's own
   ``StudentPrompts`` from the same history RL keeps, so a cloned row is exactly what RL samples
   from at that state; its response ids end with the template's end-of-turn token, so the model
   also learns to stop. Episodes the expert does not win are left out (counted). With
   ``warm_start.hint_placement`` each task is also played by the expert that knows the env's
   privileged hint, the hint in its prompts where a ``hints`` teacher puts it, so the policy
   learns to act on a hint (a self-teacher's headroom, docs/learning.md).
2. **Cloning.** The same DeepSpeed ``LearnerWorker`` as RL, method-blind: a batch whose policy
   term is off (``policy_loss_coef=0``) and whose one aux term is ``nll``. It runs in a spawned
   process of its own (its DeepSpeed process group and threads never touch the driver's).
3. **Cache.** The HF checkpoint lands in ``$PRIVY_CACHE/warm_start/<model>-<env>-<hash>``; the
   hash covers the base model's files, the env and prompt settings, the warm-start settings and
   the precision, so any change rebuilds it and a rerun (or a resumed run, or RetireOPD's first
   phase) reuses it. ``privy_model.json`` there records rows, tokens, the loss per epoch and the
   seconds it took.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.context.expert import expert_episode
from pipeline.core.config import EnvConfig, PrivyConfig, WarmStartConfig
from pipeline.core.types import TurnRecord

EXPERT_VERSION = 5  # bump when the expert's responses, the row format or a split change: rebuilds every cache


@dataclasses.dataclass
class ExpertRows:
    rows: list[TurnRecord]
    episodes: int  # expert episodes played
    won: int  # of them won (only those give rows)
    turns: list[int]  # turns of each won episode


def expert_rows(
    env_cfg: EnvConfig, prompts, tasks: int, max_turns: int | None = None, hint_placement: str | None = None
) -> ExpertRows:
    """Play the expert on train tasks ``0..tasks-1`` and return the turns of the episodes it won.

    With ``hint_placement``, each task is played a second time by the expert that knows the env's
    privileged hint (``TextEnv.hinted_expert_response``: Search-QA's answers at once, ALFWorld's
    walks straight to the objects), each prompt carrying the hint at that placement exactly as a
    ``hints`` teacher scores it (the hint inserted into the student's ids, never cut). The clone
    then acts on a hint when it has one, so a hints teacher knows better than the student."""
    from pipeline.context.prompts import TeacherPrompts

    out = ExpertRows([], 0, 0, [])
    hinted = (TeacherPrompts(prompts.tokenizer, max_total_tokens=1 << 30), hint_placement) if hint_placement else None
    for seed in range(tasks):
        _play(env_cfg, prompts, seed, max_turns, None, out)
        if hinted is not None:
            _play(env_cfg, prompts, seed, max_turns, hinted, out)
    return out


def _play(env_cfg: EnvConfig, prompts, seed: int, max_turns: int | None, hinted, out: ExpertRows) -> None:
    """One expert episode; its rows join ``out`` if it is won. ``hinted``: (teacher prompts, placement)."""
    from pipeline.orchestration.launch import local_env

    env = local_env(env_cfg, env_cfg.train_split)
    try:
        played = expert_episode(env, prompts, seed, max_turns, hinted_reply=hinted is not None, hint_prompt=hinted)
    finally:
        env.close()
    if played is None:
        return  # no hint for this task: nothing to learn to read
    rows, won = played
    out.episodes += 1
    if won:
        out.won += 1
        out.turns.append(len(rows))
        out.rows.extend(rows)


# ----- the cache ---------------------------------------------------------------------------------


# Fields of the base model's JSON files that say how it was made, not what it is: the
# conversion's seconds (privy_model.json), a loading flag the converter wrote (tokenizer_config).
# They made the same base model, converted twice, key two caches (a 4-min clone again, its
# weights byte-identical to the first).
VOLATILE = {"privy_model.json": ("seconds",), "tokenizer_config.json": ("local_files_only",)}


def _model_identity(model_path: Path) -> dict[str, Any]:
    """The base model's files by name, size and the first MiB's hash (weights change -> new key);
    the JSON files of ``VOLATILE`` by their content without those fields."""
    out = {}
    for p in sorted(model_path.iterdir()):
        if not p.is_file() or p.name.startswith("."):
            continue
        if p.name in VOLATILE:
            data = {k: v for k, v in json.loads(p.read_text()).items() if k not in VOLATILE[p.name]}
            text = json.dumps(data, sort_keys=True).encode()
            out[p.name] = [len(text), hashlib.sha1(text).hexdigest()[:12]]
            continue
        with open(p, "rb") as f:
            out[p.name] = [p.stat().st_size, hashlib.sha1(f.read(1 << 20)).hexdigest()[:12]]
    return out


def cache_key(cfg: PrivyConfig, model_path: Path) -> dict[str, Any]:
    from pipeline.core.hardware import choose_precision

    env = cfg.env
    return {
        "expert_version": EXPERT_VERSION,
        "model": _model_identity(model_path),
        "chat_template": cfg.model.chat_template,
        "env": {
            "name": env.name,
            "options": dict(env.options or {}),
            "history_length": env.history_length,
            "train_split": env.train_split,
            # only where it is not the default: the caches made before the option keep their keys
            **({"prompt_format": env.prompt_format} if env.prompt_format != "template" else {}),
        },
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
        "micro_batch_tokens": cfg.learner.micro_batch_tokens,
        "warm_start": {k: v for k, v in dataclasses.asdict(cfg.warm_start).items() if k != "cache_dir"},
        "dtype": choose_precision(cfg.warm_start.precision, "cpu").dtype,
    }


def warm_start_dir(cfg: PrivyConfig, model_path: Path) -> Path:
    from pipeline.models.cache import cache_root

    key = json.dumps(cache_key(cfg, model_path), sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    root = (
        Path(cfg.warm_start.cache_dir) if cfg.warm_start.cache_dir else cache_root(cfg.model.cache_dir) / "warm_start"
    )
    return root / f"{cfg.model.name}-{cfg.env.name}-{digest}"


def ensure_warm_start(cfg: PrivyConfig, model_path: str | Path) -> Path:
    """The warm-started HF checkpoint for this config: from the cache, or built now (minutes)."""
    from pipeline.models.cache import build_lock, is_complete, publish

    model_path = Path(model_path)
    target = warm_start_dir(cfg, model_path)
    if is_complete(target):
        return target
    with build_lock(target):
        if is_complete(target):
            return target
        print(
            f"privy-rl: warm start: cloning the {cfg.env.name} expert on {cfg.warm_start.tasks} train tasks "
            f"into {target} (once; cached)...",  # "...": the console says it is still going
            file=sys.stderr,
            flush=True,
        )
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")  # DeepSpeed's process group and torch threads stay out of the driver
            with ctx.Pool(1, initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
                report = pool.apply(_build, (cfg, str(model_path), str(stage)))
            publish(
                stage,
                target,
                {"kind": "warm_start", "base": str(model_path), "key": cache_key(cfg, model_path), **report},
            )
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    r = json.loads((target / "privy_model.json").read_text())
    print(
        f"privy-rl: warm start: {r['rows']} rows of {r['won']}/{r['episodes']} expert episodes, NLL per epoch "
        f"{[round(x, 3) for x in r['loss_per_epoch']]}, {r['seconds']:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return target


# ----- cloning (in the spawned process) ----------------------------------------------------------


def die_with_parent(parent_pid: int) -> None:
    """Pool initializer: the clone dies with the run that started it. A run killed while cloning
    (SIGTERM before the controller starts, SIGKILL) otherwise left its pool worker training for
    minutes, an orphan holding the cores, and failing at the end to send its result."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)


def _learner_config(cfg: PrivyConfig):
    w = cfg.warm_start
    return dataclasses.replace(
        cfg.learner,
        lr=w.lr,
        lr_schedule=w.lr_schedule,
        warmup_steps=0,
        mini_batches=1,
        num_learners=1,
        zero_stage=0,
        kl_coef=0.0,
        entropy_coef=0.0,
        precision=w.precision,
        offload_optimizer=False,
        offload_params=False,
    )


def sft_batch(rows: list[TurnRecord], pad_id: int):
    """The learner's batch for expert rows: no policy term, one ``nll`` aux term."""
    from pipeline.core.types import AuxTerm, Credit
    from pipeline.orchestration.batches import build_train_batch

    credit = Credit(
        advantages=[[0.0] * r.n_response for r in rows],
        policy_loss_coef=0.0,
        entropy_coef=0.0,
        aux_terms=[AuxTerm(name="sft", kind="nll", coef=1.0)],
    )
    return build_train_batch(rows, credit, pad_id=pad_id, default_entropy_coef=0.0)


def _build(cfg: PrivyConfig, model_path: str, out: str) -> dict[str, Any]:
    import os

    from pipeline.context.student_prompts import StudentPrompts
    from pipeline.core.hardware import set_threads
    from pipeline.models import load_tokenizer
    from pipeline.orchestration.launch import local_learner, save_local_learner

    t0 = time.time()
    set_threads(os.cpu_count() or 1)
    tok = load_tokenizer(model_path, cfg.model.chat_template)
    prompts = StudentPrompts(
        tok,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        history_length=cfg.env.history_length,
        prompt_format=cfg.env.prompt_format,
    )
    w: WarmStartConfig = cfg.warm_start
    ex = expert_rows(cfg.env, prompts, w.tasks, hint_placement=w.hint_placement)
    if not ex.rows:
        raise RuntimeError(f"warm start: the expert won none of {w.tasks} {cfg.env.name} train tasks")
    t_rows = time.time() - t0
    steps_per_epoch = -(-len(ex.rows) // w.batch_rows)
    learner = local_learner(_learner_config(cfg), model_path, total_steps=steps_per_epoch * w.epochs, seed=w.seed)
    rng = random.Random(w.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    losses = []
    for _ in range(w.epochs):
        order = list(range(len(ex.rows)))
        rng.shuffle(order)
        total, n = 0.0, 0
        for s in range(steps_per_epoch):
            chunk = [ex.rows[i] for i in order[s * w.batch_rows : (s + 1) * w.batch_rows]]
            m = learner.train_step([sft_batch(chunk, pad)])
            tokens = sum(r.n_response for r in chunk)
            total += m["sft/loss"][0] * tokens
            n += tokens
        losses.append(total / n)
        print(
            f"privy-rl: warm start: epoch {len(losses)}/{w.epochs}: NLL {losses[-1]:.3f} per token "
            f"({time.time() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    save_local_learner(learner, out, model_path)
    n_prompt = [len(r.prompt_ids) for r in ex.rows]
    return {
        "rows": len(ex.rows),
        "episodes": ex.episodes,
        "won": ex.won,
        "expert_turns": ex.turns,
        "prompt_tokens_mean": sum(n_prompt) / len(n_prompt),
        "response_tokens": sum(r.n_response for r in ex.rows),
        "loss_per_epoch": losses,
        "optimizer_steps": steps_per_epoch * w.epochs,
        "dtype": learner.precision.dtype,
        "seconds_rows": t_rows,
        "seconds": time.time() - t0,
    }
