"""Each mistake of issue 43 through ``scripts/train.py`` as users type it: exit status 2 within
seconds, the last line ``privy-rl: <kind>: ...`` naming the key, file or address, no traceback,
no Ray started, no run dir left behind. Also ``--check``, and ``env=alfworld_real`` (a group
choice the docs name) training a step.

The messages themselves are checked in-process in ``tests/unit/test_preflight.py``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = ["model=tiny", "env=keyword", "logger.progress=false"]
RAY_STARTED = "Started a local Ray instance"


def train(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_refused(r: subprocess.CompletedProcess, cwd: Path, *needles: str, status: int = 2) -> str:
    """The one-line refusal: its status, its last line, and nothing started or left behind."""
    out = r.stdout + r.stderr
    assert r.returncode == status, out[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("privy-rl: ") and all(n in last for n in needles), last
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out[-3000:]
    assert RAY_STARTED not in out
    assert not (cwd / "runs").exists() and not (cwd / "multirun").exists(), list(cwd.rglob("*"))
    return last


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir  # built once, before the subprocesses look for it


@pytest.mark.parametrize(
    "args, needles",
    [
        (["method=grpoo"], ["config error: method=grpoo", "did you mean method=grpo?", "the choices of method:"]),
        (["env=alfworldd"], ["config error: env=alfworldd", "did you mean env=alfworld?"]),
        (["+experiment=nope"], ["config error: experiment=nope", "the choices of experiment:"]),
        (["trainer.total_step=3"], ["config error: trainer.total_step: no such key; did you mean trainer.total_steps"]),
        (["+trainer.total_step=3"], ["trainer.total_step: no such key; did you mean trainer.total_steps?"]),
        (["method=grpo", "method.lam=-1"], ["method=grpo has no option(s) ['lam']: methods with lam:", "sdar"]),
        (["trainer.total_steps=abc"], ["config error: trainer.total_steps=abc:", "Integer"]),
        (["learner.lr=abc"], ["config error: learner.lr=abc:", "Float"]),
        (["method=sdar", "+method.betaa=3"], ["method=sdar has no option(s) ['betaa']: did you mean method.beta?"]),
        (["+method.lamda=0.5"], ["method=grpo has no option(s) ['lamda']: did you mean lam?"]),
        (["method.lamda=0.5"], ["method=grpo has no option(s) ['lamda']: did you mean lam?"]),
        (["-m", "trainer.total_step=1,2"], ["trainer.total_step: no such key; did you mean trainer.total_steps?"]),
        (["-m", "method=sdar", "+method.betaa=1,10"], ["did you mean method.beta?", "sweep point"]),
    ],
)
def test_a_config_mistake_ends_in_one_line_before_anything_starts(tmp_path, tiny, args, needles):
    t0 = time.time()
    flags = [a for a in args if a == "-m"]  # Hydra's flags go before the overrides (argparse)
    r = train([*flags, *BASE, *[a for a in args if a != "-m"]], tmp_path)
    assert_refused(r, tmp_path, *needles)
    assert time.time() - t0 < 60  # seconds, not a Ray start (about 10 s on 2 loaded cores)


def test_a_tab_in_a_preset_of_the_users_config_dir_names_the_file_and_line(tmp_path, tiny):
    conf = tmp_path / "conf" / "method"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("name: mine\nparts: {teacher: none}\n\tbeta: 1\n")
    r = train(["--config-dir", str(tmp_path / "conf"), *BASE, "method=mine"], tmp_path)
    assert_refused(r, tmp_path, f"{conf / 'mine.yaml'} line 3, column 1", "tabs")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv")
def test_vllm_in_the_main_venv_is_refused_before_ray_starts(tmp_path, tiny):
    r = train([*BASE, "rollout.engine=vllm"], tmp_path)
    assert_refused(r, tmp_path, "engine error: rollout.engine=vllm", ".venv-vllm", "make train-vllm")


@pytest.mark.parametrize("broken", ["weights", "tokenizer"])
def test_a_model_dir_that_would_not_load_is_refused_before_ray_starts(tmp_path, tiny, broken):
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    if broken == "weights":
        (model / "model.safetensors").unlink()
        needles = ["model error:", f"{model} has a config.json but no weights"]
    else:
        (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text()[:100])
        needles = ["model error:", f"the tokenizer of {model} does not load"]
    r = train(["model=hf_path", f"model.path={model}", *BASE[1:]], tmp_path)
    assert_refused(r, tmp_path, *needles)


def test_an_env_without_its_data_is_refused_naming_where_it_looked(tmp_path, tiny):
    r = train([*BASE, "env=alfworld_real", f"env.options.data_dir={tmp_path / 'none'}"], tmp_path)
    assert_refused(r, tmp_path, "missing file:", str(tmp_path / "none"))


@pytest.mark.skipif(importlib.util.find_spec("web_agent_site") is not None, reason="WebShop is installed here")
def test_env_webshop_real_without_webshop_says_how_to_install_it(tmp_path, tiny):
    r = train([*BASE, "env=webshop_real"], tmp_path)
    assert_refused(r, tmp_path, "env error: env=webshop_real:", "web_agent_site", "env.options.webshop_path")


def test_a_run_that_fails_after_hydra_made_its_dir_leaves_none(tmp_path, tiny):
    # trainer.resume is read by run_training (a checkpoint to load), past every pre-flight check:
    # the run dir Hydra made for it is gone again, with its empty date dir.
    r = train([*BASE, f"trainer.resume={tmp_path / 'no_such_run'}"], tmp_path)
    assert_refused(r, tmp_path, "config error:", str(tmp_path / "no_such_run"))


def test_a_cluster_address_where_nothing_answers_is_refused_before_the_run_dir(tmp_path, tiny):
    from local_ray import free_ports

    [port] = free_ports(1)  # closed again: nothing listens there
    r = train([*BASE, "cluster=existing", f"cluster.address=127.0.0.1:{port}"], tmp_path)
    assert_refused(r, tmp_path, f"cluster error: cluster.address=127.0.0.1:{port}: nothing answers")


def test_check_says_what_a_run_would_start_and_trains_nothing(tmp_path, tiny):
    r = train(["--check", *BASE, "rollout.num_workers=2", "rollout.num_cpus=0.5"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for needle in (
        "privy-rl: check: venvs: this python",
        "privy-rl: check: config: method=grpo env=keyword model=tiny: valid",
        "privy-rl: check: engines:",
        "tokenizer + chat template ok",
        "avx512_bf16: ",
        "precision: learner auto -> ",
        "privy-rl: check: Ray: a local Ray on this machine",
        "1 learner x {CPU: 1, GPU: 0}, 2 rollout x {CPU: 0.5, GPU: 0}",
    ):
        assert needle in r.stderr, (needle, r.stderr[-3000:])
    assert r.stderr.strip().splitlines()[-1] == "privy-rl: check: ok: the run would start (nothing was trained)"
    assert RAY_STARTED not in r.stdout + r.stderr and not (tmp_path / "runs").exists()


def test_check_names_an_unreachable_cluster_and_fails(tmp_path, tiny):
    r = train(["--check", *BASE, "cluster.address=127.0.0.1:1"], tmp_path)
    assert_refused(r, tmp_path, "problem(s)", "cluster error: cluster.address=127.0.0.1:1")


# ----- every env the docs name trains a step -----------------------------------------------------------


def _alfworld_data(root: Path) -> Path:
    """A ``$ALFWORLD_DATA/json_2.1.1`` tree of the released layout, from generated games (the
    released files cannot be downloaded here): two train games, one valid_seen game."""
    from envs.alfworld.generator import SceneLimits, get_game

    limits, cache = SceneLimits(max_receptacles=6, max_objects=6), str(root / "gen-cache")
    base = root / "json_2.1.1"
    games = [("train", "pick_and_place_simple"), ("train", "look_at_obj_in_light")]
    for i, (split, task_type) in enumerate([*games, ("valid_seen", "pick_and_place_simple")]):
        record = get_game(limits, split, task_type, 0, cache)
        shutil.copytree(Path(record.path).parent, base / split / f"{task_type}-x-{i}" / "trial_T0001")
    (base / "valid_unseen").mkdir()
    return base


@pytest.mark.integration
def test_env_alfworld_real_is_a_group_choice_that_trains_a_step(tmp_path, tiny):
    data = _alfworld_data(tmp_path)
    run_dir = tmp_path / "run"
    args = ["model=tiny", "env=alfworld_real", f"env.options.data_dir={data}", "env.options.max_turns=2"]
    args += ["trainer.total_steps=1", "trainer.val_every=0", "trainer.ckpt_every=0", "rollout.max_new_tokens=8"]
    args += ["rollout.group_size=2", "trainer.groups_per_step=1", "logger.progress=false", f"trainer.run_dir={run_dir}"]
    r = train(args, tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    [step] = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and 1 <= step["rollout/turns_per_episode"] <= 2  # env.options.max_turns=2
    log = (run_dir / "cli.log").read_text()  # the console is kept with the run, its last line too
    assert "privy-rl: precision: " in log and log.strip().splitlines()[-1].startswith("privy-rl: done: 1 steps")
