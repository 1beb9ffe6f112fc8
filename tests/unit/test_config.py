"""Config composition and launch-time validation."""

import pytest

from pipeline.core.config import ConfigError, PrivyConfig
from pipeline.tools.cli import compose

# Top-level keys are part of the user-facing surface: adding one must be a deliberate change.
EXPECTED_TOP_LEVEL = {
    "model",
    "env",
    "rollout",
    "learner",
    "scorer",
    "trainer",
    "cluster",
    "logger",
    "method",
    "experiment",
    "sweep",
    "warm_start",
}


def test_top_level_config_keys_are_frozen():
    assert set(PrivyConfig.__dataclass_fields__) == EXPECTED_TOP_LEVEL


def test_default_config_composes_and_validates():
    cfg = compose([])
    assert cfg.method["name"] == "grpo" and cfg.model.name == "smollm2_135m"
    assert cfg.env.name == "alfworld"


@pytest.mark.parametrize(
    "override, words",
    [
        ("rollout.temperature=0", "rollout.temperature"),
        ("learner.zero_stage=5", "learner.zero_stage"),
        ("learner.correction=foo", "learner.correction"),
        ("learner.mini_batches=3", "learner.mini_batches"),
        ("trainer.max_policy_lag=-1", "trainer.max_policy_lag"),
        ("learner.dual_clip=0.5", "learner.dual_clip"),
        ("trainer.time_limit_s=0", "trainer.time_limit_s"),
        ("trainer.privileged_val=sometimes", "trainer.privileged_val='sometimes': use every or ends"),
        ("env.prompt_format=chatml", "env.prompt_format='chatml': choose one of"),
        ("learner.head_chunk_tokens=-1", "learner.head_chunk_tokens must be >= 0"),
        ("learner.optimizer_chunk_mb=-1", "learner.optimizer_chunk_mb must be >= 0"),
    ],
)
def test_bad_values_fail_at_launch_naming_the_key(override, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        compose([override])


def test_a_vllm_teacher_away_from_temperature_1_fails_at_launch():
    """vLLM's prompt log-probs skip the sampler (temperature 1): scoring there at 0.7 would train
    against another distribution than the scorer actor's, so it is refused, naming the fix."""
    engine = ["rollout=vllm", "method=sdar", "scorer.placement=engine"]
    with pytest.raises(ConfigError, match=r"set rollout\.temperature=1\.0"):
        compose([*engine, "rollout.temperature=0.7"])
    assert compose([*engine, "rollout.temperature=1.0"]).scorer.placement == "engine"
    assert compose(["rollout=vllm", "method=sdar", "rollout.temperature=0.7"]).scorer.placement == "actor"


def test_unknown_key_fails_at_composition():
    with pytest.raises(Exception, match="learner.not_a_key|not_a_key"):
        compose(["+learner.not_a_key=1"])


def test_lag_without_correction_is_rejected():
    with pytest.raises(ConfigError, match="correction"):
        compose(["trainer.max_policy_lag=1", "learner.correction=none"])


def test_unknown_method_option_names_the_valid_ones():
    from pipeline.methods import build_method

    with pytest.raises(ValueError, match="norm_std"):
        build_method({"name": "grpo", "bogus": 1}, invalid_action_penalty=0.1)


def test_unknown_method_lists_available_methods():
    from pipeline.methods import build_method

    with pytest.raises(ValueError, match="grpo"):
        build_method({"name": "nope"}, invalid_action_penalty=0.1)


def test_every_experiment_recipe_composes_and_validates():
    from pathlib import Path

    recipes = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "experiment").glob("*.yaml"))
    assert recipes
    for name in recipes:
        cfg = compose(
            [f"+experiment={name}", "model.path=/models/any"] if name.endswith("paper") else [f"+experiment={name}"]
        )
        assert cfg.experiment == name


@pytest.mark.parametrize(
    "override, words",
    [
        ("trainer.final_val_splits=[valid_unseen,valid_sean]", "trainer.final_val_splits='valid_sean'"),
        ("env.val_split=dev", "env.val_split='dev'"),
    ],
)
def test_a_split_the_env_does_not_have_fails_at_launch_naming_the_field(override, words):
    from pipeline.orchestration.launch import check_launch

    check_launch(compose(["trainer.final_val_splits=[valid_unseen]"]))  # ALFWorld's third split
    with pytest.raises(ConfigError, match=words):
        check_launch(compose([override]))


def test_a_top_k_teacher_on_a_vllm_engine_fails_at_launch():
    """vLLM returns the teacher's own top-k, not its log-probs at the student's ids (topk_rkl)."""
    from pipeline.orchestration.launch import check_launch

    base = ["env=keyword", "model=tiny", "method=hint_distill_topk", "rollout.temperature=1.0"]
    check_launch(compose(base))  # the HF scorer actor
    check_launch(compose([*base, "scorer.placement=engine"]))  # the HF rollout engine
    for over in (["rollout=vllm", "scorer.placement=engine"], ["scorer.engine=vllm"]):
        with pytest.raises(ConfigError, match="topk_rkl .* score with HF"):
            check_launch(compose([*base, *over]))


def test_zero_steps_evaluate_only_and_need_something_to_evaluate():
    assert compose(["trainer.total_steps=0", "trainer.val_at_start=true"]).trainer.total_steps == 0
    assert compose(["trainer.total_steps=0", "trainer.final_val_splits=[valid_unseen]"]).trainer.total_steps == 0
    with pytest.raises(ConfigError, match="trainer.total_steps=0 evaluates only"):
        compose(["trainer.total_steps=0"])
    with pytest.raises(ConfigError, match="trainer.total_steps must be >= 0"):
        compose(["trainer.total_steps=-1"])


def test_truncated_sampling_for_training_fails_at_launch_naming_the_field():
    """Under top_p < 1 the engines report log-probs renormalised over the nucleus (their tests:
    test_top_p_*), while the learner's are over the whole vocabulary: the PPO ratio at lag 0 would
    be 1/kept-mass, not 1 (TRL #6789). So training refuses it, naming the field; an evaluate-only
    run (no learner step) may sample from a nucleus."""
    with pytest.raises(ConfigError, match=r"rollout\.top_p=0\.9.*1\.0"):
        compose(["rollout.top_p=0.9"])
    assert compose(["rollout.top_p=1.0"]).rollout.top_p == 1.0
    assert compose(["rollout.top_p=0.9", "trainer.total_steps=0", "trainer.val_at_start=true"]).rollout.top_p == 0.9


def test_gradient_checkpointing_runs_with_every_micro_batch_cut():
    compose(["learner.gradient_checkpointing=true"])  # the shared-prefix forward's own, layer by layer
    compose(["learner.gradient_checkpointing=true", "learner.shared_tokens=0"])
    compose(["learner.gradient_checkpointing=true", "learner.unpadded=false"])
