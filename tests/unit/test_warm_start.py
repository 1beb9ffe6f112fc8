"""The warm start's expert rows: ALFWorld's expert in the strict protocol, prompts from RL's own
builder, response ids as the model would emit them; the NLL term; the cache key."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from envs import make_env
from envs.actions import parse_think_action
from envs.alfworld.expert import expert_reason, planned_reason, successor
from pipeline.algorithm.aux_losses import LOSSES, LossInputs
from pipeline.context.student_prompts import StudentPrompts
from pipeline.core.chat_templates import stop_token_ids
from pipeline.core.config import EnvConfig
from pipeline.models import load_tokenizer, resolve_model
from pipeline.orchestration.warm_start import expert_rows, sft_batch

SMALL = {"max_receptacles": 6, "max_objects": 6, "n_tasks": 12, "max_turns": 20, "action_format": "tags"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model("smollm2_135m"))


@pytest.fixture(scope="module")
def env_cfg(tmp_path_factory):
    return EnvConfig(
        name="alfworld", history_length=1, options={**SMALL, "cache_dir": str(tmp_path_factory.mktemp("alf"))}
    )


@pytest.fixture(scope="module")
def rows(tok, env_cfg):
    return expert_rows(env_cfg, StudentPrompts(tok, max_prompt_tokens=1024, history_length=1), tasks=6)


def test_the_alfworld_expert_wins_every_task_in_the_strict_protocol(rows):
    assert rows.episodes == 6 and rows.won == 6 and len(rows.rows) == sum(rows.turns)
    for r in rows.rows:
        parsed = parse_think_action(r.response_text)
        assert parsed.valid_format and parsed.action == r.action and parsed.thinking


def test_expert_rows_are_the_prompts_rl_samples_from(tok, env_cfg, rows):
    """Replaying the expert's actions through a fresh env and the rollout's prompt builder gives
    the very prompt ids of every row."""
    prompts = StudentPrompts(tok, max_prompt_tokens=1024, history_length=1)
    env = make_env("alfworld", env_cfg.options, "train")
    obs, history = env.reset(0), []
    episode = [r for r in rows.rows][: rows.turns[0]]
    for turn, r in enumerate(episode):
        _, ids, _, _ = prompts.build(env, history, obs, turn)
        assert ids == r.prompt_ids
        res = env.step(r.response_text)
        history.append((obs.text, res.action))
        obs = res.observation
    assert res.won
    env.close()


def test_response_ids_end_with_the_end_of_turn_token_and_continue_the_prompt(tok, rows):
    stops = set(stop_token_ids(tok))
    for r in rows.rows[:5]:
        assert r.response_ids[-1] in stops and not stops & set(r.response_ids[:-1])
        assert tok.decode(r.response_ids, skip_special_tokens=True) == r.response_text
        whole = tok.apply_chat_template(
            [m.as_dict() for m in r.messages] + [{"role": "assistant", "content": r.response_text}], tokenize=False
        )
        assert (
            tok(whole, add_special_tokens=False)["input_ids"][: len(r.prompt_ids) + len(r.response_ids)]
            == r.prompt_ids + r.response_ids
        )


def test_expert_reasons_name_the_object():
    assert expert_reason("take mug 1 from shelf 2") == "the task needs the mug 1"
    assert expert_reason("go to shelf 2") == "the shelf 2 may have what the task needs"
    assert expert_reason("put mug 1 in/on desk 1") == "the mug 1 belongs there"
    assert expert_reason("inventory") == "this is the next step"


def test_the_search_goes_to_the_next_receptacle_in_alphabetical_order():
    assert successor("", ["shelf 2", "bed 1"]) == "bed 1"  # from the middle of the room: the first
    assert successor("drawer 1", ["countertop 1", "drawer 2", "garbagecan 1"]) == "drawer 2"
    assert successor("drawer 2", ["countertop 1", "drawer 1", "garbagecan 1"]) == "garbagecan 1"
    assert successor("towelholder 1", ["countertop 1", "drawer 1"]) == "countertop 1"  # wraps round
    assert successor("drawer 1", []) is None


def test_a_planned_go_to_says_what_it_goes_there_to_do():
    assert (
        planned_reason("go to microwave 1", "heat apple 1 with microwave 1")
        == "I go to the microwave 1 to heat apple 1 with microwave 1."
    )
    assert planned_reason("go to shelf 1", "go to shelf 2") == expert_reason("go to shelf 1")
    assert planned_reason("heat apple 1 with microwave 1", "") == "the apple 1 must be hot"


def test_each_search_step_reasons_from_what_its_prompt_shows(rows):
    """A search step's reasoning names where the current observation is and the next receptacle
    of the admissible ``go to`` list: a state the prompt shows, so the clone never has to
    remember where it has been (a clone that had to looped between two receptacles)."""
    step = re.compile(r"No (\w+) at (.+?)\. Next after \2: (.+?)\.")
    searched = 0
    for r in rows.rows:
        m = step.fullmatch(parse_think_action(r.response_text).thinking)
        if m is None:
            continue
        searched += 1
        prompt = r.messages[-1].content
        current, admissible = prompt.split("current observation is: ")[-1].split("Your admissible actions")
        assert m[2] in current
        assert m[3] == successor(m[2], re.findall(r"'go to (.+?)'", admissible))
        assert r.action == f"go to {m[3]}"
    assert searched >= 6


def test_the_sft_batch_turns_the_policy_term_off_and_names_one_nll_term(rows):
    b = sft_batch(rows.rows[:3], pad_id=0)
    assert b.policy_loss_coef == 0.0 and b.entropy_coef == 0.0
    assert [(t.kind, t.coef) for t in b.aux_terms] == [("nll", 1.0)]
    assert b.response_mask.sum() == sum(r.n_response for r in rows.rows[:3])


def test_nll_is_the_token_mean_of_minus_logprobs():
    lp = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -9.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    loss, m = LOSSES["nll"].fn(LossInputs(logprobs=lp, mask=mask, n_tokens_total=4.0, proximal_logprobs=lp.detach()))
    assert loss.item() == pytest.approx((1 + 2 + 0.5 + 3) / 4)
    loss.backward()
    assert torch.equal(lp.grad, -mask / 4)
    assert float(m["logprob_min"].value) == -3.0


def test_the_cache_key_follows_every_input(tmp_path):
    from pipeline.orchestration.warm_start import warm_start_dir
    from pipeline.tools.cli import compose

    cfg = compose(["warm_start.enabled=true", f"warm_start.cache_dir={tmp_path}"])
    model = resolve_model("smollm2_135m")
    base = warm_start_dir(cfg, model)
    assert base == warm_start_dir(compose(["warm_start.enabled=true", f"warm_start.cache_dir={tmp_path}"]), model)
    for change in (
        dict(warm_start=dataclasses.replace(cfg.warm_start, epochs=3)),
        dict(env=dataclasses.replace(cfg.env, history_length=2)),
    ):
        assert warm_start_dir(dataclasses.replace(cfg, **change), model) != base


def test_an_env_without_an_expert_fails_at_launch():
    from pipeline.core.config import ConfigError
    from pipeline.orchestration.launch import check_launch
    from pipeline.tools.cli import compose

    with pytest.raises(ConfigError, match="warm_start.enabled=true: env 'gym_text' has no expert"):
        check_launch(compose(["env=webshop", "env.name=gym_text", "warm_start.enabled=true"]))


def test_the_alfworld_hint_says_where_things_are_and_go():
    from envs.alfworld.expert import walkthrough_hint

    plan = ["go to shelf 3", "take watch 2 from shelf 3", "go to sidetable 1", "use floorlamp 1"]
    assert walkthrough_hint(plan) == "The watch 2 is in/on the shelf 3. The floorlamp 1 is in/on the sidetable 1."
    plan = [
        "go to countertop 1",
        "take mug 1 from countertop 1",
        "go to microwave 1",
        "heat mug 1 with microwave 1",
        "go to cabinet 2",
        "open cabinet 2",
        "move mug 1 to cabinet 2",
    ]
    assert walkthrough_hint(plan) == (
        "The mug 1 is in/on the countertop 1. Heat the mug 1 with the microwave 1. The mug 1 goes in/on the cabinet 2."
    )


def test_hinted_episodes_answer_from_the_hint_in_the_teachers_prompt(tok):
    """warm_start.hint_placement: each task is played twice, once by the searching expert as the
    student sees it, once by the expert that knows the hint (Search-QA: it answers at once), its
    prompt carrying the hint exactly where and as a hints teacher scores it."""
    from pipeline.context.placement import SKILL_HEADER
    from pipeline.context.prompts import TeacherPrompts

    env_cfg = EnvConfig(name="search_qa", history_length=4)
    prompts = StudentPrompts(tok, max_prompt_tokens=1024, history_length=4)
    plain = expert_rows(env_cfg, prompts, tasks=3)
    both = expert_rows(env_cfg, prompts, tasks=3, hint_placement="system")
    assert both.episodes == both.won == 6 and both.turns == [plain.turns[0], 1, plain.turns[1], 1, plain.turns[2], 1]
    teacher = TeacherPrompts(tok, max_total_tokens=4096)
    env = make_env("search_qa", {}, "train")
    k = 0
    for seed, n in enumerate(plain.turns):
        student = plain.rows[k : k + n]
        k += n
        assert [r.prompt_ids for r in both.rows[k + seed - n : k + seed]] == [r.prompt_ids for r in student]
        hinted = both.rows[k + seed]
        env.reset(seed)
        hint, gold = env.privileged_hint(), env.question.answers[0]
        assert hinted.turn_index == 0 and hinted.action == f"<answer>{gold}</answer>"
        assert hinted.prompt_ids == teacher.skills_ids(student[0], hint, "system")
        assert f"{SKILL_HEADER}\n{hint}" in tok.decode(hinted.prompt_ids)
        assert tok.decode(hinted.response_ids, skip_special_tokens=True) == hinted.response_text
    env.close()


def test_the_hinted_alfworld_expert_walks_the_walkthrough(tok, env_cfg, rows):
    both = expert_rows(
        env_cfg, StudentPrompts(tok, max_prompt_tokens=1024, history_length=1), tasks=6, hint_placement="user"
    )
    assert both.episodes == both.won == 12
    assert both.turns[0::2] == rows.turns  # the searching expert's episodes, unchanged
    env = make_env("alfworld", env_cfg.options, "train")
    for seed, n in enumerate(both.turns[1::2]):
        env.reset(seed)
        walk = env.game.walkthrough
        assert n == len(walk) <= rows.turns[seed]
        # its reasons read like the searching expert's planned steps: a go to says what for
        first = parse_think_action(env.hinted_expert_response())
        assert (first.action, first.thinking) == (walk[0], planned_reason(walk[0], walk[1]))
        assert first.thinking.startswith(f"I go to the {walk[0][6:]} to ")
    env.close()


def test_a_bad_hint_placement_fails_at_launch_naming_the_field():
    from pipeline.core.config import ConfigError
    from pipeline.tools.cli import compose

    with pytest.raises(ConfigError, match="warm_start.hint_placement='side'"):
        compose(["warm_start.enabled=true", "warm_start.hint_placement=side"])


ORPHAN_SCRIPT = """
import multiprocessing as mp, os, sys, time
from pipeline.orchestration.warm_start import die_with_parent


def clone():  # stands in for the warm start's _build: busy, never reading its pipe
    print(os.getpid(), flush=True)
    time.sleep(120)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    init = {"initializer": die_with_parent, "initargs": (os.getpid(),)} if sys.argv[1] == "guarded" else {}
    with ctx.Pool(1, **init) as pool:
        pool.apply(clone)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_clone_process_dies_with_the_run_that_was_killed_while_it_cloned(tmp_path, guarded):
    """The warm start clones in a spawned pool worker. Killed (SIGKILL: no handler runs), the run
    must not leave it training on as an orphan; without ``die_with_parent`` it does (the control
    shows the test can fail), and is then killed here."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "run.py"
    script.write_text(ORPHAN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(root)}
    parent = subprocess.Popen(
        [sys.executable, str(script), "guarded" if guarded else "plain"], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def alive() -> bool:
        try:
            return psutil.Process(child).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + (15 if guarded else 3)  # the control: still there after 3 s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = alive()
    if survived:
        psutil.Process(child).kill()
    assert survived != guarded


def test_a_build_killed_before_its_cleanup_leaves_no_staging_dir_behind(tmp_path):
    from pipeline.models.cache import build_lock

    target = tmp_path / "smollm2_135m-search_qa-abc"
    stale = tmp_path / ".smollm2_135m-search_qa-abc.ppr750p4"  # a killed build's stage
    other = tmp_path / ".smollm2_135m-keyword-def.x1"  # another target's: maybe being built now
    for d in (stale, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"0" * 64)
    with build_lock(target):
        assert not stale.exists() and other.exists()
        assert (tmp_path / ".smollm2_135m-search_qa-abc.lock").is_file()


def test_the_base_models_identity_ignores_how_it_was_converted(tmp_path):
    """The same base model converted twice (another conversion time, another loading flag) keys
    one cache; other weights or another field key another."""
    import json

    from pipeline.orchestration.warm_start import _model_identity

    def model(name, seconds, local, weights=b"w" * 64, n_params=1):
        d = tmp_path / name
        d.mkdir()
        (d / "model.safetensors").write_bytes(weights)
        (d / "privy_model.json").write_text(json.dumps({"name": "m", "n_params": n_params, "seconds": seconds}))
        (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8, "local_files_only": local}))
        return _model_identity(d)

    first = model("a", 20.5, True)
    assert model("b", 31.1, False) == first
    assert model("c", 20.5, True, weights=b"v" * 64) != first
    assert model("d", 20.5, True, n_params=2) != first
