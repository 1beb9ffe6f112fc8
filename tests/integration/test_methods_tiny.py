"""Every method trains end to end: real Ray actors (rollout, learner, teacher scorer), a real
DeepSpeed engine, the tiny model, the keyword env (whose rubric feeds targeted guidance)."""

import math

import pytest

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose

pytestmark = pytest.mark.integration

BASE = [
    "model=tiny",
    "env=keyword",
    "rollout.max_new_tokens=10",
    "rollout.group_size=3",
    "trainer.groups_per_step=2",
    "trainer.val_every=0",
    "trainer.ckpt_every=0",
    "logger.progress=false",
    "learner.lr=1e-4",
]

TEACHER_METHODS = ["sdar", "opsd", "grpo_opsd", "skill_sd"]


@pytest.mark.parametrize("method", ["grpo", "gigpo", "skill_grpo", *TEACHER_METHODS])
def test_method_trains_two_steps(ray_local, tmp_path, method):
    history = run_training(compose(BASE + [f"method={method}", "trainer.total_steps=2"]), tmp_path)
    assert len(history) == 2
    last = history[-1]
    assert last["learner/loss"] == last["learner/loss"]  # finite, not NaN
    if method in TEACHER_METHODS:
        assert last["teacher/rows_scored_frac"] == 1.0
        assert last["teacher/staleness"] == 0.0  # lag 0: the teacher holds the behaviour weights
        term = "skill_sd" if method == "skill_sd" else "sdar"
        assert f"{term}/loss" in last
        # the noise floor: the same teacher on the student's own prompt, scored beside it
        assert "noise/gap_abs_mean" in last and "teacher/gap_abs_mean" in last


def test_sdar_scored_on_the_rollout_engine_needs_no_scorer_actor_and_matches_the_actor_route(ray_local, tmp_path):
    """scorer.placement=engine: the rollout worker's engine scores the self-teacher (no scorer
    actor, no weights sent to one); the same seeded fp32 run with the scorer actor gives the same
    teacher gaps (the same forward on the same weights), and the noise floor is measured on both."""
    import json

    base = [
        *BASE,
        "method=sdar",
        "trainer.total_steps=2",
        "rollout.precision=fp32",
        "scorer.precision=fp32",
        "learner.precision=fp32",
    ]
    actor = run_training(compose(base), tmp_path / "actor")
    engine = run_training(compose([*base, "scorer.placement=engine"]), tmp_path / "engine")
    assert "scorer" in json.loads((tmp_path / "actor" / "hardware.json").read_text())
    assert "scorer" not in json.loads((tmp_path / "engine" / "hardware.json").read_text())
    for a, e in zip(actor, engine, strict=True):
        assert e["teacher/rows_scored_frac"] == 1.0 and e["teacher/staleness"] == 0.0
        assert e["rollout/reward"] == a["rollout/reward"]  # the same episodes on both routes
        for key in ("teacher/gap_mean", "teacher/gap_abs_mean", "noise/gap_abs_mean"):
            assert e[key] == pytest.approx(a[key], abs=1e-4), key


def test_the_top_k_reverse_kl_trains_with_the_teacher_on_the_rollout_engine_or_the_scorer_actor(ray_local, tmp_path):
    """hint_distill_topk: the teacher's log-probs at the student's top-k ids, scored by the scorer
    actor or by the rollout worker's engine (no learner-side teacher forward); the same seeded
    fp32 run gives the same episodes and the same term on both routes."""
    base = [
        *BASE,
        "method=hint_distill_topk",
        "method.topk=8",
        "trainer.total_steps=2",
        "rollout.precision=fp32",
        "scorer.precision=fp32",
        "learner.precision=fp32",
    ]
    actor = run_training(compose(base), tmp_path / "actor")
    engine = run_training(compose([*base, "scorer.placement=engine"]), tmp_path / "engine")
    for a, e in zip(actor, engine, strict=True):
        assert a["teacher/rows_scored_frac"] == 1.0 and e["teacher/rows_scored_frac"] == 1.0
        assert e["rollout/reward"] == a["rollout/reward"]
        assert 0.0 < e["sd/support_mass"] <= e["sd/selected_fraction"] + 1e-6
        for key in ("sd/kl", "sd/support_mass", "noise/gap_abs_mean"):
            assert e[key] == pytest.approx(a[key], abs=1e-4), key


def test_a_teacher_whose_noise_floor_is_too_high_stops_the_run_before_any_update(ray_local, tmp_path):
    """A deliberately mismatched precision (bf16 rollout engine, fp32 scorer): on the tiny model
    its floor is about 0.001 per token against a signal of about 0.11 (0.9%; 0 when both are
    fp32), so a threshold of 0.5% refuses it at the first scored step, naming both numbers,
    while the matched run passes the same threshold."""
    from pipeline.core.config import ConfigError

    base = [*BASE, "method=sdar", "trainer.total_steps=1", "learner.precision=fp32", "scorer.precision=fp32"]
    base.append("scorer.max_noise_ratio=0.005")
    with pytest.raises(ConfigError, match=r"noise floor.*rollout\.precision=bf16, teacher: scorer\.precision=fp32"):
        run_training(compose([*base, "rollout.precision=bf16"]), tmp_path / "bf16")
    assert not (tmp_path / "bf16" / "metrics.jsonl").exists() or not (tmp_path / "bf16" / "metrics.jsonl").read_text()
    [step] = run_training(compose([*base, "rollout.precision=fp32"]), tmp_path / "fp32")
    assert step["noise/gap_abs_mean"] <= 0.005 * step["teacher/gap_abs_mean"]


def test_the_controls_train_without_a_teacher(ray_local, tmp_path):
    """The null baseline shifts every advantage; the equal-information baseline trains NLL on the
    hinted expert's reply to each training task (the keyword env's answer block), outside the
    policy term."""
    null = run_training(compose(BASE + ["method=null_baseline", "trainer.total_steps=1"]), tmp_path / "null")[-1]
    assert null["null_baseline/advantage_shift"] == pytest.approx(-0.1) and "teacher/seconds" not in null
    imit = run_training(compose(BASE + ["method=hint_imitation", "trainer.total_steps=2"]), tmp_path / "imit")[-1]
    # one demonstration per group (2 groups of 3 episodes + 1): its tokens join the batch
    assert 0.0 < imit["imit/demo_token_fraction"] < 0.5
    assert imit["imit/loss"] > 0.0 and "teacher/seconds" not in imit
    assert imit["learner/loss"] == imit["learner/loss"]


def test_adrs_scores_only_inside_its_schedule(ray_local, tmp_path):
    cfg = compose(BASE + ["method=adrs", "trainer.total_steps=3", "method.warmup_steps=1", "method.active_steps=1"])
    history = run_training(cfg, tmp_path)
    scored = ["teacher/seconds" in h for h in history]
    assert scored == [False, True, False]


@pytest.mark.parametrize("estimator", ["full_kl", "k3_is"])
def test_targeted_guidance_distils_on_failed_turns(ray_local, tmp_path, estimator):
    cfg = compose(BASE + ["method=targeted_guidance", f"method.estimator={estimator}", "trainer.total_steps=2"])
    history = run_training(cfg, tmp_path)
    last = history[-1]
    # A random tiny model fails the rubric, so every one-turn episode has a failed turn.
    assert last["tg/failed_turn_fraction"] == 1.0
    assert "tg/loss" in last


@pytest.mark.parametrize("estimator", ["full_kl", "k3_is"])
def test_targeted_guidance_on_code_edit_with_tool_messages_distils_failed_turns(ray_local, tmp_path, estimator):
    # tool_role=tool (Qwen-style templates): prompts after turn 0 end with a tool message, and the
    # feedback must go right before the response there too (a user turn after the tool result).
    cfg = compose(
        BASE
        + [
            "env=code_edit",
            "+env.options.tool_role=tool",
            "+env.options.max_turns=2",
            "rollout.max_prompt_tokens=2048",
            "rollout.group_size=2",
            "trainer.groups_per_step=1",
            "method=targeted_guidance",
            f"method.estimator={estimator}",
            "trainer.total_steps=1",
        ]
    )
    history = run_training(cfg, tmp_path)
    last = history[-1]
    assert last["rollout/turns_per_episode"] == 2.0  # the tiny model never finishes: two turns each
    assert last["tg/failed_turn_fraction"] > 0 and "tg/loss" in last


RETIRING = [
    "method.window=1",
    "trainer.val_every=1",
    "trainer.val_tasks=2",
    "rollout.val_temperatures=[0.4]",
    "method.gamma=0.01",
    "method.delta=-1000.0",
    "trainer.total_steps=3",
]


def test_gated_retire_opd_yaml_only_trains_its_teacher_then_a_gated_opd_term(ray_local, tmp_path):
    history = run_training(
        compose(BASE + ["method=gated_retire_opd", "method.phase1_steps=2", *RETIRING]), tmp_path / "run"
    )
    assert (tmp_path / "run" / "phase1_teacher" / "metrics.jsonl").exists()
    first = history[0]
    assert "opd/gate_mean" in first and "opd/rho_mean" in first  # K3-IS weighted by SDAR's gate
    # windows of one step: rho exists from window 2, whose validation retires the teacher
    assert [h["opd/retired"] for h in history] == [0.0, 1.0, 1.0]
    assert ["teacher/seconds" in h for h in history] == [True, True, False]


def test_retiring_targeted_guidance_yaml_only_measures_its_teacher_and_retires(ray_local, tmp_path):
    history = run_training(compose(BASE + ["method=retiring_targeted_guidance", *RETIRING]), tmp_path)
    first = history[0]
    assert "tg/kl" in first and "val/privileged_success" in first  # SR_T: the feedback in context
    assert [h["tg/retired"] for h in history] == [0.0, 1.0, 1.0]
    assert "tg/kl" not in history[2]  # retired: no learner-side teacher forward any more


def test_retire_opd_trains_its_teacher_retires_it_and_stays_retired_after_resume(ray_local, tmp_path):
    over = BASE + [
        "method=retire_opd",
        "method.phase1_steps=2",
        "method.window=1",
        "trainer.val_every=1",
        "trainer.val_tasks=2",
        "method.gamma=0.01",
        "method.delta=-1000.0",
        "rollout.val_temperatures=[0.4]",
        "trainer.ckpt_every=3",
        "trainer.keep_checkpoints=5",
    ]
    history = run_training(compose(over + ["trainer.total_steps=4"]), tmp_path / "run")
    assert (tmp_path / "run" / "phase1_teacher" / "metrics.jsonl").exists()
    retired = [h.get("opd/retired", 0.0) for h in history]
    # Windows of one step: rho and eta exist from window 2, so retirement comes at step 2 (the
    # tiny teacher never wins, SR_T = 0 makes eta infinite, and delta = -1000 admits any rho).
    assert retired == [0.0, 1.0, 1.0, 1.0]
    assert ["teacher/seconds" in h for h in history] == [True, True, False, False]
    ckpt = tmp_path / "run" / "checkpoints" / "step_000003"
    resumed = run_training(compose(over + ["trainer.total_steps=4", f"trainer.resume={ckpt}"]), tmp_path / "resumed")
    assert len(resumed) == 1
    assert resumed[0]["opd/retired"] == 1.0 and "teacher/seconds" not in resumed[0]


def test_sdar_with_alfworld_hints_scores_every_row_and_logs_the_privilege_gap(ray_local, tmp_path):
    # context: hints is a YAML choice: the env writes its privileged state (where the task's
    # objects are), the teacher reads it from the episode, the privileged validation from the env.
    cfg = compose(
        BASE
        + [
            "env=alfworld",
            "env.options.max_receptacles=6",
            "env.options.max_objects=6",
            "env.options.n_tasks=4",
            "env.options.max_turns=2",
            f"+env.options.cache_dir={tmp_path / 'games'}",
            "method=sdar_hints",
            "trainer.total_steps=1",
            "rollout.group_size=2",
            "trainer.groups_per_step=1",
            "trainer.val_every=1",
            "trainer.val_tasks=2",
            "rollout.val_temperatures=[0.0]",
        ]
    )
    last = run_training(cfg, tmp_path)[-1]
    assert last["teacher/rows_scored_frac"] == 1.0 and "sdar/loss" in last
    assert "val/privileged_success" in last and "val/privilege_gap" in last
    # the noise floor: the same scorer on the student's own prompt, its gaps beside the teacher's
    for prefix in ("teacher", "noise"):
        assert 0.0 <= last[f"{prefix}/negative_gap_fraction"] <= 1.0 and last[f"{prefix}/gap_std"] >= 0.0
    # same weights (lag 0), same prompt: only the two engines' numerics differ
    assert last["noise/gap_abs_mean"] < 0.5


def test_hint_distill_runs_its_hinted_teacher_in_the_learner_on_every_row(ray_local, tmp_path):
    # full_kl with context: hints: the learner builds each row's teacher prompt from the episode's
    # hint (the keyword env's graded answer block); no scorer runs.
    history = run_training(compose(BASE + ["method=hint_distill", "trainer.total_steps=2"]), tmp_path)
    last = history[-1]
    assert last["sd/selected_fraction"] == 1.0 and last["sd/loss"] > 0.0
    assert "teacher/seconds" not in last


@pytest.mark.parametrize("placement", ["actor", "engine"])
def test_a_signal_that_needs_the_teachers_entropy_trains_a_step_on_both_scoring_routes(ray_local, tmp_path, placement):
    """conf/method/entropy_gated_hints.yaml (signal entropy_gate, docs/extending.md): the scorer
    actor and the rollout engine both compute the channel it asks for, and the learner trains the
    gated term."""
    over = ["method=entropy_gated_hints", "trainer.total_steps=1", f"scorer.placement={placement}"]
    [m] = run_training(compose(BASE + over), tmp_path)
    assert m["teacher/rows_scored_frac"] == 1.0 and m["teacher/staleness"] == 0.0
    assert 0.0 < m["eg/teacher_entropy_mean"] <= math.log(49152)  # nats, over the tiny model's vocabulary
    assert 0.0 < m["eg/entropy_gate_mean"] < 1.0
    assert math.isfinite(m["eg/loss"]) and math.isfinite(m["learner/loss"])
