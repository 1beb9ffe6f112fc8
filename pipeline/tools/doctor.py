"""What this machine can run, checked before anything starts (``pipeline/tools/preflight.py`` checks
the config):

- ``check_run``: the engines importable in this venv (vLLM lives in ``.venv-vllm``), the launch
  checks, a cluster answering at ``cluster.address`` when one is set, and the model directory
  loadable (config, weights, tokenizer, chat template; no model load).
- ``check_report`` (``scripts/train.py --check``, ``make doctor``): all of the above without
  training, plus the venvs, every YAML file of the config dirs, Ray at ``cluster.address``, the
  CPU and the precision ``auto`` picks, and the actors a run would start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.core.errors import first_line
from pipeline.tools.preflight import (
    ROOT,
    Points,
    Refused,
    _yaml_error,
    check_launch_config,
    compose_points,
    explain,
    resolve,
    sweep_names,
    unknown_keys,
)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_engines(cfg: PrivyConfig) -> str:
    """The engines the run asks for import in this venv (found, not imported: vLLM takes seconds)."""
    if importlib.util.find_spec("deepspeed") is None:
        raise Refused(
            "engine error", f"the learner needs DeepSpeed, which this venv ({sys.prefix}) lacks: run make setup"
        )
    for key, engine in (("rollout.engine", cfg.rollout.engine), ("scorer.engine", cfg.scorer.engine)):
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            raise Refused(
                "engine error",
                f"{key}=vllm: vLLM is not installed in this venv ({sys.prefix}); it lives in .venv-vllm: "
                "run make train-vllm ARGS='...', or .venv-vllm/bin/python scripts/train.py ... "
                "(make setup-vllm builds that venv)",
            )
    return f"rollout {cfg.rollout.engine}, scorer {cfg.scorer.engine}, learner DeepSpeed: importable in {sys.prefix}"


def named_model_dir(cfg: PrivyConfig) -> Path | None:
    """Where the cache keeps a named model (``model.name``), built or not; None for a path."""
    from pipeline.models import SMOLLM2_DIRNAME, cache_root, tiny_model_dir
    from pipeline.models.gemma3 import GEMMA3_DIRNAME

    if cfg.model.path:
        return None
    root = cache_root(cfg.model.cache_dir) / "models"
    dirs = {
        "smollm2_135m": root / SMOLLM2_DIRNAME,
        "gemma3_270m": root / GEMMA3_DIRNAME,
        "tiny": tiny_model_dir("smollm2", 0, cfg.model.cache_dir),
        "tiny_bytes": tiny_model_dir("bytes", 0, cfg.model.cache_dir),
    }
    return dirs.get(cfg.model.name)


def model_path(cfg: PrivyConfig, prepare: bool) -> Path | None:
    """The model directory the run loads (a named model is prepared first when ``prepare``; None
    when it is not prepared and ``prepare`` is false)."""
    from pipeline.models import resolve_model
    from pipeline.models.cache import is_complete

    named = named_model_dir(cfg)
    if named is not None and not prepare and not is_complete(named):
        return None
    try:
        return Path(resolve_model(cfg.model.path or cfg.model.name, cache_dir=cfg.model.cache_dir))
    except FileNotFoundError as e:
        raise Refused("missing file", first_line(e)) from None
    except Exception as e:  # a named model that could not be prepared (no source, no PyPI)
        raise Refused("model error", f"model={cfg.model.name}: {first_line(e)}") from None


def check_model_dir(cfg: PrivyConfig, path: Path) -> str:
    """Config, weights (headers only), tokenizer and chat template of ``path``: what the actors
    load later, checked in about a second without loading a weight."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:
        raise Refused("model error", f"{path}/config.json does not load: {first_line(e)}") from None
    weights = _weight_files(path)
    try:
        from pipeline.orchestration.launch import check_model

        check_model(cfg, str(path))
    except ConfigError as e:
        raise Refused("config error", str(e)) from None
    except Exception as e:
        raise Refused("model error", f"the tokenizer of {path} does not load: {first_line(e)}") from None
    size = sum(f.stat().st_size for f in weights) / 1e6
    return f"{path}: {config.model_type}, {len(weights)} weight file(s) ({size:,.0f} MB), tokenizer + chat template ok"


def _weight_files(path: Path) -> list[Path]:
    """The weight files of an HF directory (an index's shards), each readable; ``Refused`` if none."""
    for name in WEIGHT_FILES:
        f = path / name
        if not f.is_file():
            continue
        if name.endswith(".index.json"):
            try:
                shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
            except (ValueError, KeyError) as e:
                raise Refused("model error", f"{f}: not a weight index ({first_line(e)})") from None
            files = [path / s for s in shards]
            missing = [s for s, p in zip(shards, files) if not p.is_file()]
            if missing:
                raise Refused("model error", f"{f} names shards that are missing: {', '.join(missing[:3])}")
        else:
            files = [f]
        for w in files:
            if w.suffix == ".safetensors":
                _safetensors_header(w)
        return files
    raise Refused("model error", f"{path} has a config.json but no weights (expected one of {', '.join(WEIGHT_FILES)})")


def _safetensors_header(path: Path) -> None:
    """Read the header and check that the file holds every byte it describes (a cut copy fails)."""
    import struct

    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise Refused("model error", f"{path}: not a readable safetensors file ({first_line(e)})") from None
    if path.stat().st_size < 8 + n + end:
        raise Refused("model error", f"{path}: cut short ({path.stat().st_size} bytes of {8 + n + end})")


def check_run(cfg: PrivyConfig, prepare_model: bool = True):
    """Everything a run can check before Hydra's run dir and Ray: ``Refused`` on the first problem;
    returns (method, model directory or None, one line per check)."""
    lines = [check_engines(cfg)]
    method = check_launch_config(cfg)
    if cfg.cluster.address is not None:  # a cluster to join: it must answer (a local Ray is started)
        lines.append(ray_reachable(cfg))
    path = model_path(cfg, prepare_model)
    if path is not None:
        lines.append(check_model_dir(cfg, path))
    return method, path, lines


# ----- the check command ---------------------------------------------------------------------------


def yaml_problems(dirs: list[Path]) -> list[str]:
    """``FILE line N: problem`` for each YAML file under ``dirs`` that does not parse."""
    import yaml

    out = []
    for d in dirs:
        for f in sorted(d.rglob("*.yaml")):
            try:
                with open(f, encoding="utf-8") as fh:  # a stream: its errors name the file
                    yaml.safe_load(fh)
            except yaml.YAMLError as e:
                out.append(_yaml_error(e) or f"{f}: {first_line(e)}")
    return out


def venvs() -> str:
    """This interpreter's venv, and whether the project's other venvs exist (vLLM in .venv-vllm)."""
    parts = [f"this python {sys.executable} ({sys.version.split()[0]})"]
    for name, module, make in ((".venv", "deepspeed", "make setup"), (".venv-vllm", "vllm", "make setup-vllm")):
        py = ROOT / name / "bin" / "python"
        if not py.exists():
            parts.append(f"{name}: absent ({make})")
            continue
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        ok = subprocess.run([str(py), "-c", code], capture_output=True, timeout=60).returncode == 0
        parts.append(f"{name}: {module} {'importable' if ok else 'MISSING (' + make + ')'}")
    return "; ".join(parts)


def cpu_and_precision(cfg: PrivyConfig) -> str:
    """The CPU, whether it has avx512_bf16 (as ``grep avx512_bf16 /proc/cpuinfo``), and what each
    actor's ``precision`` resolves to (``pipeline/core/hardware.py``)."""
    from pipeline.core.hardware import choose_precision

    model, flag = "unknown CPU", "unknown (no /proc/cpuinfo)"
    info = Path("/proc/cpuinfo")
    if info.exists():
        text = info.read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        model = m.group(1).strip() if m else model
        flag = "yes" if re.search(r"\bavx512_bf16\b", text) else "no"
    picks = []
    for who, asked, gpus in (
        ("learner", cfg.learner.precision, cfg.learner.num_gpus),
        ("rollout", cfg.rollout.precision, cfg.rollout.num_gpus),
        ("scorer", cfg.scorer.precision, cfg.scorer.num_gpus),
    ):
        choice = choose_precision(asked, "cuda" if gpus > 0 else "cpu")
        picks.append(f"{who} {asked} -> {choice.dtype}" + (f" (warning: {choice.warning})" if choice.warning else ""))
    return f"{model}, {os.cpu_count()} cores, avx512_bf16: {flag}; precision: {', '.join(picks)}"


def ray_reachable(cfg: PrivyConfig) -> str:
    """Where Ray will be: a local one, or a cluster at ``cluster.address`` that answers (its GCS
    port accepts a connection); ``Refused`` naming the address otherwise. Starts no Ray."""
    import socket

    address = cfg.cluster.address
    if address is None:
        return f"a local Ray on this machine ({cfg.cluster.num_cpus or os.cpu_count()} CPUs; cluster.address=null)"
    if address.startswith("ray://"):
        target = address[len("ray://") :]
    else:
        from ray._private.services import canonicalize_bootstrap_address_or_die

        try:
            target = canonicalize_bootstrap_address_or_die(address)
        except Exception as e:
            raise Refused("cluster error", f"cluster.address={address}: {first_line(e)}") from None
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise Refused("cluster error", f"cluster.address={address}: nothing answers at {target} ({e})") from None
    return f"a Ray cluster answers at {target} (cluster.address={address})"


def actors(cfg: PrivyConfig, method) -> str:
    """The actors a run starts, their Ray resources and torch threads."""
    from pipeline.distributed.placement import plan_placement
    from pipeline.orchestration.launch import scorer_actor
    from pipeline.orchestration.resources import actor_threads

    plan = plan_placement(cfg, with_scorer=scorer_actor(cfg, method))
    where = "placement none (Ray places each)" if plan.strategy is None else f"placement {cfg.cluster.placement}"
    return f"{plan.describe()}; {actor_threads(cfg)} torch threads per actor; {where}; method {method.name}"


def check_report(points: Points, config_dirs: list[Path], out=None) -> int:
    """``--check``: every check, one line each (``privy-rl: check: ...``), without training.
    Returns the exit status: 0 when a run would start, 2 when something refuses it."""
    out = out or sys.stderr
    problems: list[str] = []

    def say(what: str, fn: Callable[[], str]) -> None:
        try:
            print(f"privy-rl: check: {what}: {fn()}", file=out, flush=True)
        except Refused as e:
            problems.append(e.line)
            print(f"privy-rl: check: {what}: PROBLEM: {e.kind}: {e.message}", file=out, flush=True)

    say("venvs", venvs)
    for line in yaml_problems(config_dirs):
        problems.append(f"privy-rl: config error: {line}")
        print(f"privy-rl: check: config files: PROBLEM: {line}", file=out, flush=True)
    cfgs: list[PrivyConfig] = []

    def point(dcfg) -> str:
        cfg = resolve(dcfg)
        cfgs.append(cfg)
        method = check_launch_config(cfg)
        return f"method={method.name} env={cfg.env.name} model={cfg.model.path or cfg.model.name}: valid"

    for i, dcfg in enumerate(points.configs):
        label = f"point {i} ({' '.join(points.overrides[i]) or 'no overrides'})" if points.multirun else "config"
        say(label, lambda dcfg=dcfg: point(dcfg))
    if cfgs:  # the machine, for the first point (the points of a sweep share it)
        cfg = cfgs[0]
        say("engines", lambda: check_engines(cfg))
        say("model", lambda: _model_line(cfg))
        if cfg.warm_start.enabled:
            say("warm start", lambda: _warm_start_line(cfg))
        say("CPU", lambda: cpu_and_precision(cfg))
        say("Ray", lambda: ray_reachable(cfg))
        say("actors", lambda: actors(cfg, check_launch_config(cfg)))
    if problems:
        print(f"privy-rl: check: {len(problems)} problem(s); the first: {problems[0]}", file=out, flush=True)
        return 2
    runs = f"{len(points.configs)} sweep points" if points.multirun else "the run"
    print(f"privy-rl: check: ok: {runs} would start (nothing was trained)", file=out, flush=True)
    return 0


def _warm_start_line(cfg: PrivyConfig) -> str:
    from pipeline.models.cache import is_complete
    from pipeline.orchestration.warm_start import warm_start_dir

    path = model_path(cfg, prepare=False)
    if path is None:
        return "built before training, once the model is prepared (minutes; cached after)"
    target = warm_start_dir(cfg, path)
    if is_complete(target):
        return f"cached: the run starts from {target}"
    w = cfg.warm_start
    return f"built before training: {w.tasks} expert tasks x {w.epochs} epochs (minutes; then cached at {target})"


def _model_line(cfg: PrivyConfig) -> str:
    path = model_path(cfg, prepare=False)
    if path is None:
        return f"model={cfg.model.name} is not prepared yet: the run builds it first (or: make models)"
    return check_model_dir(cfg, path)


__all__ = [
    "Points",
    "Refused",
    "check_report",
    "check_run",
    "compose_points",
    "explain",
    "resolve",
    "sweep_names",
    "unknown_keys",
]
