"""Every numeric field of the schema, given a value outside its range, fails ``validate`` with a
ConfigError that names the field (issue 13 item 6). The walk reads the dataclasses themselves, so
a field added later without a range check fails here until it gets one (or is listed below with
the reason it takes any value)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from pipeline.core.config import ConfigError, PrivyConfig, validate

# Fields where every number is meaningful.
ANY_VALUE = {
    "trainer.seed": "any integer seeds the run",
    "warm_start.seed": "any integer shuffles the rows",
}
# A field whose bad value is not -1 (default probe) : the probe to use instead.
PROBES: dict[str, list] = {
    "learner.zero_stage": [4, -1],
    "rollout.top_p": [1.5, 0.0, math.nan],
    "rollout.vllm.gpu_memory_utilization": [1.5, 0.0, math.nan],
    "learner.dual_clip": [1.0, math.nan],
    "learner.behaviour_cap": [0.5, math.nan],
    "rollout.max_prompt_tokens": [63, -1],
    "learner.micro_batch_tokens": [63, -1],
    "scorer.micro_batch_tokens": [63, -1],
    "rollout.val_temperatures": [[-1.0], [math.nan]],
    "learner.betas": [[0.9, 1.0], [0.9], [math.nan, 0.9]],
    "rollout.min_workers": [0, 2],  # above rollout.num_workers=1 too
}


def _numeric(tp) -> bool:
    """int, float, or an optional one (``int | None``); lists of numbers too."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        return bool(args) and args[0] in (int, float)
    return tp in (int, float) or (
        bool(args) and all(a in (int, float, type(None)) for a in args) and any(a in (int, float) for a in args)
    )


def _fields(obj, prefix: str = ""):
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _fields(value, key + ".")
        elif _numeric(hints[f.name]):
            floats = float in typing.get_args(hints[f.name]) or hints[f.name] is float
            yield key, PROBES.get(key, [-1] + ([math.nan] if floats else []))


FIELDS = [(k, probes) for k, probes in _fields(PrivyConfig()) if k not in ANY_VALUE]


def _set(cfg, key: str, value) -> None:
    *path, last = key.split(".")
    obj = cfg
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, last, value)


def test_the_walk_covers_the_whole_schema():
    keys = {k for k, _ in FIELDS}
    assert (
        len(keys) > 50
        and {
            "learner.lr",
            "rollout.vllm.kv_cache_gb",
            "cluster.max_restarts",
            "warm_start.batch_rows",
            "trainer.max_skipped_steps",
        }
        <= keys
    )


@pytest.mark.parametrize("key,probes", FIELDS, ids=[k for k, _ in FIELDS])
def test_an_out_of_range_value_names_its_field(key, probes):
    for bad in probes:
        cfg = PrivyConfig()
        _set(cfg, key, bad)
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        assert key in str(err.value), f"{key}={bad}: the message does not name the field: {err.value}"


def test_the_defaults_validate():
    validate(PrivyConfig())


# ----- method options: every preset, every numeric option it leaves free -------------------------
METHOD_ANY_VALUE = {
    "delta": "RetireOPD's retirement margin: any finite number (negative retires earlier)",
}


def _method_options():
    from pipeline.methods import available_methods, build_method, load_preset

    out = []
    for name in available_methods():
        method = build_method({"name": name}, invalid_action_penalty=0.1)
        fixed = set((load_preset(name).get("fixed") or {}))
        for part in method.parts.values():
            hints = typing.get_type_hints(type(part.opts))
            for f in dataclasses.fields(part.opts):
                if f.name in fixed or f.name in METHOD_ANY_VALUE or not _numeric(hints[f.name]):
                    continue
                if typing.get_origin(hints[f.name]) is list:
                    continue
                out.append((name, f.name))
    return sorted(set(out))


METHOD_OPTIONS = _method_options()


def test_the_method_walk_covers_the_papers_knobs():
    keys = {k for _, k in METHOD_OPTIONS}
    assert {"lam", "beta", "gamma", "eta", "tau", "window", "phase1_steps"} <= keys, keys


@pytest.mark.parametrize("name,key", METHOD_OPTIONS, ids=[f"{n}.{k}" for n, k in METHOD_OPTIONS])
def test_an_out_of_range_method_option_names_it(name, key):
    from pipeline.methods import build_method

    for bad in (-1, math.nan):
        with pytest.raises(ValueError) as err:
            build_method({"name": name, key: bad}, invalid_action_penalty=0.1)
        assert f"method.{key}" in str(err.value), f"method={name} {key}={bad}: {err.value}"
