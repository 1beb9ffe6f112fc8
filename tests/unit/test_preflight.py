"""The pre-flight checks in-process (``pipeline/tools/preflight.py``, ``pipeline/tools/cli.py``):
each mistake becomes one line naming the key, group, file or address, with the nearest valid
names; the console is kept in ``cli.log``; a run dir that never trained is removed.

The same inputs through ``scripts/train.py`` (exit status, no Ray, no run dir) are in
``tests/integration/test_cli_errors.py``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from hydra._internal.utils import get_args_parser

from pipeline.core.config import CONF_DIR
from pipeline.tools.cli import Console, compose, discard_untrained, train_from_hydra
from pipeline.tools.doctor import check_engines, check_model_dir, check_report, ray_reachable, yaml_problems
from pipeline.tools.preflight import Refused, compose_points, resolve, sweep_names

TAB_PRESET = "name: mine\nparts: {teacher: none}\n\tbeta: 1\n"


def refused(*argv: str) -> str:
    """The one line the command line ``argv`` is refused with (composing, the typed config, the
    launch checks that need no model), or fail."""
    args = get_args_parser().parse_args(list(argv))
    with pytest.raises(Refused) as err:
        points = compose_points(args, train_from_hydra)
        if points.multirun:
            sweep_names(points)
        else:
            from pipeline.tools.preflight import check_launch_config

            check_launch_config(resolve(points.configs[0]))
    line = err.value.line
    assert "\n" not in line, line
    return line


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["method=grpoo"], "config error: method=grpoo: there is no method/grpoo.yaml; did you mean method=grpo?"),
        (["env=alfworldd"], "env=alfworldd: there is no env/alfworldd.yaml; did you mean env=alfworld?"),
        (["+experiment=nope"], "experiment=nope: there is no experiment/nope.yaml"),
        (["trainer.total_step=3"], "trainer.total_step: no such key; did you mean trainer.total_steps?"),
        (["+trainer.total_step=3"], "trainer.total_step: no such key; did you mean trainer.total_steps?"),
        (["trainr.total_steps=3"], "trainr.total_steps: no such key; did you mean trainer.total_steps?"),
        (["rollout.vllm.kv_cache=3"], "did you mean rollout.vllm.kv_cache_gb?"),
        (["trainer.total_steps=abc"], "trainer.total_steps=abc: Value 'abc' of type 'str' could not be converted"),
        (["learner.lr=abc"], "learner.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
        (["experiment=sdar_cpu"], "experiment: not chosen by conf/config.yaml's defaults; add it with +experiment="),
        (["+method=grpo"], "conf/config.yaml chooses a method already; write method=<name>, without the +"),
        (["foo"], "cannot read the override 'foo'"),
    ],
)
def test_a_hydra_mistake_is_one_line_naming_the_key_and_the_nearest_names(argv, expected):
    line = refused(*argv)
    assert line.startswith("privy-rl: config error: ") and expected in line, line
    assert "HYDRA_FULL_ERROR" not in line and "To append to your config use" not in line


def test_an_unknown_group_choice_lists_the_groups_choices():
    line = refused("env=alfworldd")
    assert "(the choices of env: alfworld, alfworld_real, code_edit, keyword, search_qa, webshop, webshop_real)" in line


@pytest.mark.parametrize(
    "argv, expected",
    [
        # written as an override of the preset (Hydra refuses it) or appended: the same refusal
        (["method=sdar", "+method.betaa=3"], "method=sdar has no option(s) ['betaa']: did you mean method.beta?"),
        (["method=sdar", "method.betaa=3"], "method=sdar has no option(s) ['betaa']: did you mean method.beta?"),
        (["+method.lamda=0.5"], "method=grpo has no option(s) ['lamda']: did you mean lam? (an option of "),
        (["method=grpo", "method.lam=-1"], "method=grpo has no option(s) ['lam']: methods with lam: "),
        (["method=gigpo", "+method.advantage.gammaa=1"], "advantage part has no option 'gammaa': did you mean "),
    ],
)
def test_a_method_option_the_method_lacks_is_refused_either_way_it_is_written(argv, expected):
    line = refused(*argv)
    assert line.startswith("privy-rl: config error: ") and expected in line, line


def test_an_option_of_other_methods_names_the_presets_that_have_it():
    line = refused("method=grpo", "method.lam=-1")
    named = line.split("methods with lam: ")[1].split(";")[0].split(", ")
    assert "sdar" in named and "grpo" not in named and "gigpo" not in named


def test_an_option_the_method_has_but_its_preset_does_not_list_is_told_to_be_appended(tmp_path):
    # Hydra refuses to override a key the preset's YAML lacks; here its advice (+key) is right.
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "bare_gigpo.yaml").write_text("name: bare_gigpo\nparts: {advantage: gigpo}\n")
    line = refused("--config-dir", str(tmp_path), "method=bare_gigpo", "env=keyword", "method.gamma=0.9")
    assert line.endswith("method.gamma: an option its preset file does not list; add it with +method.gamma=0.9")


def test_a_sweep_over_a_misspelt_option_stops_before_its_first_point():
    line = refused("-m", "method=sdar", "+method.betaa=1,10")
    assert "did you mean method.beta?" in line and "sweep point" in line


def test_a_sweep_with_one_bad_value_goes_on_to_its_points():
    # A value out of range is the point's own failure (recorded in the sweep summary), not the sweep's.
    args = get_args_parser().parse_args(["-m", "model=tiny", "env=keyword", "learner.lr=-1,1e-5"])
    points = compose_points(args, train_from_hydra)
    assert len(points.configs) == 2
    sweep_names(points)  # no Refused
    with pytest.raises(Refused, match="learner.lr=-1"):
        resolve(points.configs[0])
    assert resolve(points.configs[1]).learner.lr == 1e-5


def test_a_tab_in_the_users_preset_names_its_file_and_line(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "mine.yaml").write_text(TAB_PRESET)
    line = refused("--config-dir", str(tmp_path), "method=mine")
    assert f"{tmp_path}/method/mine.yaml line 3, column 1" in line and "indent with spaces, not tabs" in line
    assert yaml_problems([tmp_path]) == [line.removeprefix("privy-rl: config error: ")]


def test_a_missing_config_dir_is_named(tmp_path):
    assert "--config-dir" in refused("--config-dir", str(tmp_path / "nope"), "method=grpo")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv")
def test_vllm_outside_its_venv_says_which_venv_has_it():
    cfg = compose(["rollout.engine=vllm"])
    with pytest.raises(Refused) as err:
        check_engines(cfg)
    assert err.value.kind == "engine error"
    assert "rollout.engine=vllm" in err.value.message and "make train-vllm" in err.value.message
    assert ".venv-vllm" in err.value.message


def test_env_name_of_an_env_with_its_own_file_points_to_the_group_choice():
    # env.name= keeps the chosen group's options (ALFWorld's generator's), which alfworld_real refuses
    line = refused("env.name=alfworld_real")
    assert "unknown alfworld_real option(s)" in line and line.endswith(
        "(env=alfworld_real selects conf/env/alfworld_real.yaml with its options; env.name= keeps the others)"
    )
    assert "selects conf/env" not in refused("env=keyword", "+env.options.bogus=1")  # its own group: no hint


def test_every_env_the_docs_name_is_a_group_choice():
    text = (CONF_DIR.parent / "docs" / "envs.md").read_text()
    import re

    named = set(re.findall(r"`env=(\w+)`", text)) | {
        n for row in re.findall(r"^\| (`\w+`(?: / `\w+`)*) \|", text, re.M) for n in re.findall(r"`(\w+)`", row)
    }
    assert named and named <= {p.stem for p in (CONF_DIR / "env").glob("*.yaml")}, named


# ----- the model directory -------------------------------------------------------------------------


@pytest.fixture
def model_copy(tiny_bytes_model_dir, tmp_path):
    dest = tmp_path / "model"
    shutil.copytree(tiny_bytes_model_dir, dest)
    return dest


def _model_refusal(path: Path) -> Refused:
    cfg = compose(["model=hf_path", f"model.path={path}", "env=keyword"])
    with pytest.raises(Refused) as err:
        check_model_dir(cfg, path)
    return err.value


def test_a_whole_model_dir_passes(model_copy):
    cfg = compose(["model=hf_path", f"model.path={model_copy}", "env=keyword"])
    assert "tokenizer + chat template ok" in check_model_dir(cfg, model_copy)


def test_a_model_dir_without_weights_is_refused(model_copy):
    (model_copy / "model.safetensors").unlink()
    err = _model_refusal(model_copy)
    assert err.kind == "model error" and f"{model_copy} has a config.json but no weights" in err.message


def test_a_cut_weights_file_is_refused(model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    assert "cut short" in _model_refusal(model_copy).message


def test_a_missing_shard_is_refused(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "model-00002-of-00002.safetensors" in _model_refusal(model_copy).message


def test_a_broken_tokenizer_is_refused(model_copy):
    tok = model_copy / "tokenizer.json"
    if not tok.exists():  # the byte tokenizer may be saved in another form: break what is there
        tok = next(p for p in model_copy.iterdir() if p.name.startswith("tokenizer"))
    tok.write_text(tok.read_text()[:100])
    err = _model_refusal(model_copy)
    assert err.kind == "model error" and f"the tokenizer of {model_copy} does not load" in err.message


# ----- Ray, the report --------------------------------------------------------------------------------


def test_an_unreachable_cluster_address_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cfg = compose([f"cluster.address=127.0.0.1:{port}"])
    with pytest.raises(Refused) as err:
        ray_reachable(cfg)
    assert err.value.kind == "cluster error" and f"127.0.0.1:{port}" in err.value.message


def test_the_check_report_says_what_a_run_would_start(tiny_model_dir):
    args = get_args_parser().parse_args(["model=tiny", "env=keyword", "rollout.num_workers=2", "rollout.num_cpus=0.5"])
    out = io.StringIO()
    status = check_report(compose_points(args, train_from_hydra), [CONF_DIR], out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "privy-rl: check: actors: 1 learner x {CPU: 1, GPU: 0}, 2 rollout x {CPU: 0.5, GPU: 0}" in text
    assert "avx512_bf16: " in text and "precision: learner auto -> " in text
    assert "a local Ray on this machine" in text and text.rstrip().endswith("(nothing was trained)")


def test_the_check_report_ends_with_the_first_problem():
    args = get_args_parser().parse_args(["env=keyword", "learner.zero_stage=7"])
    out = io.StringIO()
    assert check_report(compose_points(args, train_from_hydra), [CONF_DIR], out=out) == 2
    last = out.getvalue().strip().splitlines()[-1]
    assert "learner.zero_stage=7" in last and last.startswith("privy-rl: check: 1 problem(s)")


# ----- the console and the run dir --------------------------------------------------------------------


def test_the_console_keeps_every_line_and_a_bars_last_state(tmp_path, capsys):
    log = tmp_path / "run" / "cli.log"
    with Console(log, every_s=60):
        print("privy-rl: a message")
        print("\x1b[36m(Actor pid=1)\x1b[0m a line from an actor", file=sys.stderr)
        sys.stderr.write("\rtrain:  50%|#    | 1/2\rtrain: 100%|#####| 2/2")
        sys.stderr.write("\n")
        print("privy-rl: done: 2 steps", file=sys.stderr)
        sys.stdout.write("no newline at the end")
    assert log.read_text().splitlines() == [
        "privy-rl: a message",
        "(Actor pid=1) a line from an actor",
        "train: 100%|#####| 2/2",
        "privy-rl: done: 2 steps",
        "no newline at the end",
    ]
    assert "privy-rl: a message" in capsys.readouterr().out  # the terminal still gets it


def test_a_long_phase_gets_a_line_while_it_runs_and_none_after(tmp_path, capsys):
    log = tmp_path / "cli.log"
    with Console(log, every_s=0.2):
        print("privy-rl: validating step 4 on valid_seen: 8 tasks x 2 temperatures...", file=sys.stderr)
        time.sleep(0.75)
        print("privy-rl: step 4: val/success 0.5", file=sys.stderr)
        time.sleep(0.5)
    beats = [x for x in log.read_text().splitlines() if x.startswith("privy-rl: still ")]
    assert 2 <= len(beats) <= 4, beats
    assert beats[0].startswith("privy-rl: still validating step 4 on valid_seen: 8 tasks x 2 temperatures: 0m0")
    assert log.read_text().splitlines()[-1] == "privy-rl: step 4: val/success 0.5"  # no beat once it ended


def test_an_untrained_run_dir_is_removed_with_its_empty_date_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    untrained = tmp_path / "runs" / "2026-01-01" / "10-00-00_grpo_keyword"
    (untrained / ".hydra").mkdir(parents=True)
    (untrained / "cli.log").write_text("privy-rl: config error: ...\n")
    (untrained / "config.yaml").write_text("{}\n")
    trained = tmp_path / "runs" / "2026-01-02" / "10-00-00_grpo_keyword"
    (trained / ".hydra").mkdir(parents=True)
    (trained / "metrics.jsonl").write_text('{"step": 1}\n')
    discard_untrained([untrained, trained])
    assert not (tmp_path / "runs" / "2026-01-01").exists()
    assert (trained / "metrics.jsonl").exists()
