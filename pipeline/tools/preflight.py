"""Before anything starts: the config composed and checked, in one line when it is wrong.

Everything here runs before Hydra makes a run dir and before Ray starts, so that a mistake ends in
one line (``Refused``: its kind and message) instead of a trace after minutes:

- ``compose_points`` composes the config as ``hydra.main`` would (the same search path, the user's
  ``--config-dir``; every point of a ``-m`` sweep) and turns Hydra's multi-line errors into one
  line naming the key or group, the nearest valid names and a group's choices (``explain``).
  Hydra's advice for an unknown key ("To append to your config use +key=...") is not repeated: for
  a key of the typed schema it would be refused later, for a method option it is checked here.
- ``unknown_keys``: keys the schema does not have, also when written with ``+``.
- ``check_launch_config``: the launch checks of ``pipeline.orchestration.launch.check_launch``
  (env, splits, method, resources) as ``Refused``.

What this machine can run (engines, the model directory, Ray) is ``pipeline/tools/doctor.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.core.config import CONF_DIR, ConfigError, PrivyConfig, to_config
from pipeline.core.errors import first_line
from pipeline.methods import did_you_mean

ROOT = CONF_DIR.parent
OPEN_SECTIONS = ("method", "env.options")  # open dicts: their keys are checked by the method / the env


class Refused(Exception):
    """A run that cannot start as asked. ``kind``: config error | missing file | model error |
    engine error | cluster error; the message names the key, file or address and what to do."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message

    @property
    def line(self) -> str:
        return f"privy-rl: {self.kind}: {self.message}"


# ----- composing, as hydra.main would -------------------------------------------------------------


@dataclass
class Points:
    """The composed config of each run the command line starts: one, or every point of a sweep."""

    multirun: bool
    overrides: list[list[str]]  # per point: its overrides as Hydra's launcher passes them
    configs: list[Any]  # per point: the composed DictConfig (with its ``hydra`` node)


def hydra_app(task_function: Callable, config_dir: str | None):
    """Hydra's app object with ``hydra.main``'s search path for ``task_function`` (``conf/``, then
    the user's ``--config-dir`` in front of the schema, as Hydra puts it)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )
    from hydra.core.config_search_path import SearchPathQuery

    from pipeline.core.config import register_schema

    register_schema()  # conf/config.yaml's defaults start with the typed schema
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task_function)
    search_path = create_automatic_config_search_path(calling_file, calling_module, str(CONF_DIR))
    if config_dir is not None:
        path = Path(config_dir).resolve()
        if not path.is_dir():
            raise Refused("config error", f"--config-dir {config_dir}: no such directory")
        search_path.prepend(provider="command-line", path=f"file://{path}", anchor=SearchPathQuery(provider="schema"))
    return Hydra.create_main_hydra2(
        task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
    )


def compose_points(args, task_function: Callable) -> Points:
    """Compose what ``args`` (Hydra's parsed command line) would run; a Hydra error -> ``Refused``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    app = hydra_app(task_function, args.config_dir)
    name = args.config_name or "config"
    overrides = list(args.overrides)
    try:
        mode = app.get_mode(config_name=name, overrides=overrides)
        multirun = bool(args.multirun) or mode == RunMode.MULTIRUN
        if not multirun:
            return Points(False, [overrides], [app.compose_config(name, overrides, run_mode=RunMode.RUN)])
        master = app.compose_config(name, overrides, run_mode=RunMode.MULTIRUN)
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        parsed = OverridesParser.create().parse_overrides(list(master.hydra.overrides.task))
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        return Points(True, jobs, [app.config_loader.load_sweep_config(master, list(job)) for job in jobs])
    except Refused:
        raise
    except Exception as err:  # Hydra's and OmegaConf's errors, YAML's: one line
        raise Refused("config error", explain(err, app, name, overrides)) from err
    finally:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()  # hydra.main makes its own


def without_hydra(dcfg) -> dict:
    """The composed config as a plain dict, less Hydra's own node (its ``${hydra:...}`` values
    resolve only inside a Hydra run)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.masked_copy(dcfg, [k for k in dcfg if k != "hydra"]), resolve=True)


def explain(err: BaseException, app, config_name: str, overrides: list[str]) -> str:
    """One line for an error of Hydra's composition: the key or group, the nearest names."""
    from hydra.errors import MissingConfigException, OverrideParseException

    found = _yaml_error(err)
    if found:
        return found
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, choice = err.missing_cfg_file.rpartition("/")
        near = did_you_mean(choice, err.options)
        line = f"{group}={choice}: there is no {err.missing_cfg_file}.yaml"
        line += f"; did you mean {group}={near[0]}?" if near else ""
        return line + f" (the choices of {group}: {', '.join(err.options)})"
    if isinstance(err, OverrideParseException):
        return f"cannot read the override {err.override!r}: {first_line(err)} (Hydra's syntax: key=value)"
    msg = str(err)
    cause = err.__cause__
    if m := re.match(r"Could not override '([^']+)'\. No match in the defaults list", msg):
        given = _override_of(m.group(1), overrides)
        return f"{m.group(1)}: not chosen by conf/{config_name}.yaml's defaults; add it with +{given}"
    if m := re.match(r"Could not override '([^']+)'", msg):
        return _no_such_key(m.group(1), app, config_name, overrides)
    if m := re.match(r"Error merging override (.+)", msg):
        return f"{m.group(1)}: {first_line(cause) if cause is not None else first_line(err)}"
    if m := re.match(r"(\S+) appears more than once in the final defaults list", msg):
        group = m.group(1)
        return f"+{group}=...: conf/{config_name}.yaml chooses a {group} already; write {group}=<name>, without the +"
    return first_line(err) + (f" ({first_line(cause)})" if cause is not None else "")


def _yaml_error(err: BaseException | None) -> str | None:
    """``FILE line N, column M: problem`` for a YAML syntax error anywhere in the chain."""
    import yaml

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
            mark = err.problem_mark
            line = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}: {err.problem} (a YAML syntax error)"
            return line + (": indent with spaces, not tabs" if "'\\t'" in str(err.problem) else "")
        err = err.__cause__ or err.__context__
    return None


def _override_of(key: str, overrides: list[str]) -> str:
    """The command-line override that sets ``key`` (as typed, less a leading ``+``/``++``)."""
    for o in overrides:
        if o.lstrip("+~").split("=", 1)[0] == key:
            return o.lstrip("+~")
    return f"{key}=..."


def _no_such_key(key: str, app, config_name: str, overrides: list[str]) -> str:
    """``key=value`` names a key the config does not have: the nearest keys; in an open section
    (a method option, an env option) the verdict of the method or env itself."""
    from hydra.types import RunMode

    given = _override_of(key, overrides)
    rest = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != key]
    if key.startswith(tuple(s + "." for s in OPEN_SECTIONS)):
        try:  # the same override as an append: refused by the method or env with its nearest names
            check_launch_config(resolve(app.compose_config(config_name, [*rest, "+" + given], RunMode.RUN)))
        except Refused as e:
            return e.message
        except Exception:  # anything else: the nearest keys below
            pass
        else:
            return f"{key}: an option its preset file does not list; add it with +{given}"
    try:
        keys = flat_keys(without_hydra(app.compose_config(config_name, rest, RunMode.RUN)))
    except Exception:  # e.g. sweep values among the rest: the schema's keys
        keys = schema_keys()
    return f"{key}: no such key" + _nearest(key, keys)


def schema_keys() -> list[str]:
    """Every dotted key of the typed config (``pipeline/core/schema.py``)."""
    from omegaconf import OmegaConf

    return flat_keys(OmegaConf.to_container(OmegaConf.structured(PrivyConfig)))


def flat_keys(tree: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a nested dict (lists are leaves)."""
    out = []
    for k, v in tree.items():
        out.append(prefix + str(k))
        if isinstance(v, dict):
            out += flat_keys(v, f"{prefix}{k}.")
    return out


def _nearest(key: str, keys: list[str]) -> str:
    """``; did you mean X?`` (a sibling first, then any key), else the keys of its section."""
    parent = key.rpartition(".")[0]
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    near = did_you_mean(key, siblings) or did_you_mean(key, keys)
    if near:
        return f"; did you mean {near[0]}?"
    if siblings:
        return f" ({parent or 'the config'} has {', '.join(k.rpartition('.')[2] for k in siblings)})"
    return ""


def unknown_keys(plain: dict) -> None:
    """Refuse keys the schema lacks, also those added with ``+`` (Hydra accepts them; the typed
    config would refuse them later with only the key's last part). Open sections are the method's
    and the env's to check."""
    schema = schema_keys()
    known = set(schema)
    for key in flat_keys(plain):
        parent = key.rpartition(".")[0]
        if key in known or any(key.startswith(s + ".") for s in OPEN_SECTIONS):
            continue
        if parent and parent not in known:  # reported at its first unknown level
            continue
        raise Refused("config error", f"{key}: no such key" + _nearest(key, schema))


def sweep_names(points: Points) -> None:
    """Before a sweep's first point: the names every point uses (keys, method options), so that a
    misspelt swept key stops the sweep at once. Values stay each point's to check (a bad one fails
    its point, recorded in the sweep's summary, and the sweep goes on)."""
    from pipeline.methods import UnknownOption, build_method

    for overrides, dcfg in zip(points.overrides, points.configs):
        plain = without_hydra(dcfg)
        unknown_keys(plain)
        try:
            build_method(plain["method"], invalid_action_penalty=0.0, env_name=plain["env"]["name"])
        except UnknownOption as e:
            raise Refused("config error", f"{e} (sweep point {' '.join(overrides)})") from None
        except Exception:  # a bad value: that point's to report
            pass


def resolve(dcfg) -> PrivyConfig:
    """The typed, validated config of one composed point; ``Refused`` naming the key."""
    plain = without_hydra(dcfg)
    unknown_keys(plain)
    try:
        return to_config(plain)
    except ConfigError as e:
        raise Refused("config error", str(e)) from None


def check_launch_config(cfg: PrivyConfig):
    """``check_launch``'s verdict (env options, splits, method, resources) as ``Refused``; the method."""
    from pipeline.orchestration.launch import check_launch

    try:
        method, _ = check_launch(cfg)
    except ConfigError as e:
        raise Refused("config error", str(e) + _env_group_hint(cfg)) from None
    except FileNotFoundError as e:
        raise Refused("missing file", first_line(e)) from None
    except (RuntimeError, ImportError, OSError) as e:  # an env that cannot be built here (its package, its data)
        raise Refused("env error", f"env={cfg.env.name}: {first_line(e)}") from None
    return method


def _env_group_hint(cfg: PrivyConfig) -> str:
    """``env.name=X`` keeps the options of the env group chosen: when X has a group file whose
    options the config lacks, say that ``env=X`` selects it."""
    import yaml

    path = CONF_DIR / "env" / f"{cfg.env.name}.yaml"
    if not path.is_file():
        return ""
    own = (yaml.safe_load(path.read_text()) or {}).get("options") or {}
    if set(own) <= set(cfg.env.options):  # composed from that file (or as if): its group was chosen
        return ""
    return f" (env={cfg.env.name} selects conf/env/{cfg.env.name}.yaml with its options; env.name= keeps the others)"
