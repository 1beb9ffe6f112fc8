"""The method registry, the conf/method presets (methods from parts), and the credit of the
GRPO-family and skill-teacher methods (gigpo, skill_grpo, sdar, opsd, grpo_opsd, skill_sd, adrs) on
hand-built groups."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from method_groups import PENALTY, build, scored_groups, unscored

from pipeline.algorithm.adrs import adrs_advantages
from pipeline.algorithm.advantages import gigpo_advantages, grpo_advantages, rows_from_groups
from pipeline.algorithm.aux_losses import LossInputs, aux_loss, loss_spec
from pipeline.methods import available_methods, build_method, load_preset
from pipeline.orchestration.batches import build_train_batch, rows_of

CONF = Path(__file__).resolve().parents[2] / "conf" / "method"
PAPERS = [
    "grpo",
    "gigpo",
    "skill_grpo",
    "sdar",
    "opsd",
    "grpo_opsd",
    "skill_sd",
    "retire_opd",
    "adrs",
    "targeted_guidance",
]
CONTROLS = ["null_baseline", "hint_imitation"]  # the method comparison's controls (docs/methods.md)
# Every preset is found where users put one (a new YAML needs no edit here); the papers' methods
# and the controls are named, so that losing one of them fails.
ALL = sorted(p.stem for p in CONF.glob("*.yaml"))


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def grpo_rows(groups) -> list[float]:
    return grpo_advantages(rows_from_groups(groups), invalid_penalty=PENALTY).advantages.tolist()


def per_row(groups, values: list[float]) -> list[list[float]]:
    return [[v] * r.n_response for v, r in zip(values, rows_of(groups))]


def assert_nested_close(got: list[list[float]], want: list[list[float]], tol: float = 1e-6) -> None:
    assert [len(r) for r in got] == [len(r) for r in want]
    for g_row, w_row in zip(got, want):
        assert g_row == pytest.approx(w_row, abs=tol)


# ----- registry and presets -------------------------------------------------------------------------


def test_registry_holds_every_preset_and_the_papers_and_controls_are_among_them():
    assert available_methods() == ALL
    assert set(PAPERS + CONTROLS) <= set(ALL)


def test_a_part_joins_the_registry_by_naming_its_kind_and_a_taken_kind_or_unknown_slot_fails():
    from pipeline.methods.parts import PARTS, Part, load_parts
    from pipeline.methods.parts.schedule import Constant, Schedule

    load_parts()
    assert PARTS["schedule"]["constant"] is Constant and Constant.slot == "schedule"

    class Tuned(Constant):  # names no kind: a variant of the part, not a new one
        pass

    assert Tuned.kind == "constant" and PARTS["schedule"]["constant"] is Constant
    with pytest.raises(ValueError, match="'schedule' / kind 'constant' invalid or taken"):

        class Again(Schedule, kind="constant"):
            pass

    with pytest.raises(ValueError, match="slot 'critic' is not one of"):

        class Critic(Part, slot="critic"):
            pass

    assert PARTS["schedule"]["constant"] is Constant and "critic" not in PARTS


@pytest.mark.parametrize("name", ALL)
def test_every_preset_yaml_holds_only_what_differs_from_its_parts_defaults(name):
    """A preset names the parts and option values that differ from the defaults (DEFAULT_KINDS, each
    part's Options), nothing else: a default changed in code changes every preset that uses it."""
    import dataclasses

    from pipeline.methods.parts import DEFAULT_KINDS
    from pipeline.tools.cli import compose

    raw = compose([f"method={name}", "env=alfworld"]).method  # skill_bank follows env.name
    method = build_method(raw, invalid_action_penalty=PENALTY)
    assert method.name == name
    preset = load_preset(name)  # the file's own values (interpolations such as ${env.name} left out)
    restated = [f"parts.{s}" for s, k in (preset.get("parts") or {}).items() if DEFAULT_KINDS[s] == k]
    assert preset.get("prefix") != name, "prefix defaults to the name"
    for part in method.parts.values():
        for f in dataclasses.fields(part.opts) if dataclasses.is_dataclass(part.opts) else ():
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if f.name in preset and preset[f.name] == default:
                restated.append(f.name)
    assert not restated, f"conf/method/{name}.yaml restates defaults: {restated}"
    for key, value in raw.items():
        if key not in ("name", "parts", "fixed", "prefix"):
            assert getattr(method.opts, key) == value, key


def test_every_yaml_starts_with_a_one_line_comment():
    for name in ALL:
        first = (CONF / f"{name}.yaml").read_text().splitlines()[0]
        assert first.startswith("# "), name


def test_paper_values_are_reachable_by_hydra_overrides():
    from pipeline.tools.cli import compose

    cfg = compose(["method=sdar", "method.beta=10", "method.lam=0.1"])
    sdar = build_method(cfg.method, invalid_action_penalty=PENALTY)
    assert (sdar.opts.beta, sdar.opts.lam) == (10, 0.1)
    cfg = compose(["method=retire_opd", "method.gamma=0.85", "method.delta=-0.05"])
    retire = build_method(cfg.method, invalid_action_penalty=PENALTY)
    assert (retire.opts.gamma, retire.opts.delta) == (0.85, -0.05)


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"name": "sdar", "beta": -1.0}, "method.beta=-1.0 must be"),
        ({"name": "sdar", "lam": "big"}, "method.lam='big' should be of type float"),
        ({"name": "sdar", "placement": "footer"}, "method.placement='footer'; choose one of"),
        ({"name": "skill_grpo", "skill_mode": "embedding"}, "method.skill_mode='embedding'; choose one of"),
        ({"name": "skill_grpo", "skill_top_k": 0}, "method.skill_top_k=0 must be >= 1"),
        ({"name": "gigpo", "gamma": 1.5}, "method.gamma=1.5 must be in [0, 1]"),
        ({"name": "gigpo", "similarity_threshold": 1.0}, "method.similarity_threshold=1.0 must be in (0, 1)"),
        ({"name": "grpo_opsd", "beta": 5.0}, "has no option(s) ['beta']"),
        ({"name": "skill_sd", "lam": -0.1}, "method.lam=-0.1 must be >= 0"),
        ({"name": "adrs", "level": "L1"}, "method.level='L1'; choose one of ['L2', 'L3']"),
        ({"name": "adrs", "tva_apply": "before"}, "method.tva_apply='before'"),
        ({"name": "adrs", "T": 0.0}, "method.T=0.0 must be > 0"),
        ({"name": "adrs", "active_steps": 0}, "method.active_steps=0 must be >= 1"),
        ({"name": "retire_opd", "window": 0}, "method.window=0 must be >= 1"),
        ({"name": "retire_opd", "teacher_success_rate": 1.5}, "method.teacher_success_rate=1.5 must be in [0, 1]"),
        ({"name": "retire_opd", "gamma": 0.0}, "method.gamma=0.0 must be > 0"),
        ({"name": "retire_opd", "window": 2.5}, "method.window=2.5 should be of type int"),
        ({"name": "targeted_guidance", "estimator": "exact"}, "method.estimator='exact'; choose one of"),
        ({"name": "adrs", "level": "L3"}, "method.level=L3 shapes a gigpo advantage; set method.parts.advantage=gigpo"),
        ({"name": "sdar", "parts": {"signal": "magic"}}, "parts.signal='magic'; choose one of"),
        ({"name": "targeted_guidance", "parts": {"teacher": "frozen"}}, "full_kl runs the teacher in the learner"),
        ({"name": "targeted_guidance", "criterion_weights": {"tests": -1}}, "criterion_weights {'tests': -1}"),
        ({"name": "nope"}, "method='nope' is unknown"),
    ],
)
def test_bad_options_raise_a_message_naming_the_option(raw, fragment):
    with pytest.raises(ValueError) as err:
        build_method(raw, invalid_action_penalty=PENALTY)
    assert fragment in str(err.value)


@pytest.mark.parametrize("name", ALL)
def test_every_method_credit_fits_the_train_batch_builder(name):
    class FakePrompts:  # targeted_guidance (full) asks the driver's prompts for teacher ids
        def feedback_ids(self, row, feedback):
            return [7] * (len(row.prompt_ids) + len(feedback))

        def plain_ids(self, row):
            return list(row.prompt_ids)

    groups = scored_groups()
    groups[0].episodes[1].criteria = [_failed("format", 1)]
    method = build(name)
    if method.teacher.needs_first_phase:  # a frozen teacher trained first: give it one instead
        method = build(name, teacher_path="/teacher", teacher_success_rate=0.5)
    method.attach(FakePrompts())
    spec = method.teacher_spec()
    k = spec.needs.support_k if spec is not None else 0
    if k:  # topk_rkl: the scorer also gives the student's support
        for r in rows_of(groups):
            r.teacher_topk_ids = [list(range(k)) for _ in r.response_ids]
            r.teacher_topk_logprobs = [[-2.0] * k for _ in r.response_ids]
    for c in spec.needs.channels if spec is not None else ():  # what else the signal asks of the teacher
        for r in rows_of(groups):
            r.teacher_channels = {**(r.teacher_channels or {}), c.name: [1.0] * r.n_response}
    step = 30  # inside ADRS's shaping window
    assert method.teacher_active(step) == (method.teacher_spec() is not None)
    credit = method.credit(groups, step)
    batch = build_train_batch(rows_of(groups), credit, pad_id=0, default_entropy_coef=0.001)
    assert batch.advantages.shape == batch.input_ids.shape
    needs = {
        "sampled_surrogate": {"teacher_logprobs"},
        "k3_is": {"teacher_logprobs"},
        "full_kl": {"distill_mask"},
        "topk_rkl": {"teacher_logprobs", "topk_ids", "topk_teacher_logprobs"},
    }
    for term in batch.aux_terms:
        assert needs[term.kind] <= set(batch.distill.present()), (name, term.kind)
        assert term.kind != "full_kl" or batch.teacher_input_ids is not None
        if not loss_spec(term.kind).needs_logits:  # the loss runs on the batch as the learner hands it over
            loss, _ = aux_loss(_inputs(batch, grad=True), term)
            assert torch.isfinite(loss)


def _inputs(batch, grad: bool = False) -> LossInputs:
    """The loss input as the learner fills it, with the current log-probs = the behaviour ones."""
    lp = batch.behaviour_logprobs.clone().requires_grad_(grad)
    return LossInputs(
        logprobs=lp,
        mask=batch.response_mask,
        n_tokens_total=batch.n_tokens,
        proximal_logprobs=batch.behaviour_logprobs,
        input_ids=batch.input_ids,
        teacher_logprobs=batch.distill.teacher_logprobs,
        distill_mask=batch.distill.distill_mask,
    )


def _failed(criterion: str, turn: int):
    from pipeline.core.types import CriterionResult

    return CriterionResult(criterion=criterion, passed=False, failing_turn=turn, feedback=f"fix {criterion}")


# ----- gigpo, skill_grpo -------------------------------------------------------------------------------


def test_gigpo_adds_the_weighted_anchor_step_advantage_to_each_row():
    groups = scored_groups()
    # both groups' first turns share the anchor "obs 0"; their discounted returns differ through the penalty
    groups[0].episodes[0].turns[1].step_reward = 10.0
    groups[1].episodes[0].turns[1].step_reward = 10.0
    credit = build("gigpo", gamma=0.5, step_weight=2.0).credit(groups, 0)
    want = gigpo_advantages(rows_from_groups(groups), invalid_penalty=PENALTY, gamma=0.5, step_weight=2.0)
    assert_nested_close(credit.advantages, per_row(groups, want.advantages.tolist()))
    # hand check, group a, anchor "obs 0": R = [0.5 * 10, -0.1, 0] (ep0 turn 0, ep1 turn 0 invalid, ep2)
    returns = [5.0, -0.1, 0.0]
    mu, sd = sum(returns) / 3, torch.tensor(returns).std().item()
    a_e = grpo_rows(groups)
    assert credit.advantages[0][0] == pytest.approx(a_e[0] + 2.0 * (5.0 - mu) / (sd + 1e-6), abs=1e-5)
    assert credit.distill.present() == {} and credit.aux_terms == [] and build("gigpo").teacher_spec() is None


def test_skill_grpo_gives_the_student_its_retrieval_options_and_plain_grpo_credit():
    method = build("skill_grpo", skill_mode="ucb", skill_top_k=3)
    assert method.skills_for_student() == {"bank": "alfworld", "mode": "ucb", "top_k": 3, "placement": "user_front"}
    assert build("skill_grpo").skills_for_student() == {
        "bank": "alfworld",
        "mode": "keyword",
        "top_k": 6,
        "placement": "user_front",
    }
    assert method.teacher_spec() is None
    groups = unscored(scored_groups())
    credit = method.credit(groups, 0)
    assert_nested_close(credit.advantages, per_row(groups, grpo_rows(groups)))
    assert credit.aux_terms == []
    for name in ("grpo", "sdar", "retire_opd", "adrs", "targeted_guidance"):
        assert build(name).skills_for_student() is None, name


@pytest.mark.parametrize(
    "name, follows_policy, placement",
    [
        ("sdar", True, "raw_prefix"),
        ("opsd", True, "raw_prefix"),
        ("grpo_opsd", True, "raw_prefix"),
        ("skill_sd", True, "raw_prefix"),
        ("adrs", True, "raw_prefix"),
        ("retire_opd", False, "user_front"),
    ],
)
def test_skill_teacher_methods_ask_for_a_skills_teacher_with_their_retrieval_options(name, follows_policy, placement):
    method = build(name, skill_mode="random")
    spec = method.teacher_spec()
    assert (spec.follows_policy, spec.context, spec.placement, spec.rows) == (
        follows_policy,
        "skills",
        placement,
        "all",
    )
    assert method.skills_for_teacher() == {"bank": "alfworld", "mode": "random", "top_k": 6, "placement": placement}


# ----- sdar and its baselines ---------------------------------------------------------------------------


def _gates(groups, beta: float) -> list[list[float]]:
    return [[_sig(beta * (t - o)) for t, o in zip(r.teacher_logprobs, r.behaviour_logprobs)] for r in rows_of(groups)]


def _learner_gate_mean(groups, credit) -> tuple[float, dict]:
    """Run the SDAR term as the learner would, with the current log-probs = behaviour log-probs."""
    batch = build_train_batch(rows_of(groups), credit, pad_id=0, default_entropy_coef=0.0)
    [term] = batch.aux_terms
    _, m = aux_loss(_inputs(batch), term)
    return float(m["gate_mean"].value), {k: v.value for k, v in m.items()}


def test_sdar_term_carries_beta_and_the_loss_gates_with_the_current_logprobs():
    groups = scored_groups()
    credit = build("sdar").credit(groups, 0)
    assert credit.distill.teacher_logprobs == [r.teacher_logprobs for r in rows_of(groups)]
    assert credit.distill.distill_mask is None  # no precomputed gate: it follows the learner's current policy
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef, term.gate_beta) == ("sdar", "sampled_surrogate", 0.01, 5.0)
    assert credit.policy_loss_coef == 1.0 and credit.entropy_coef is None
    assert_nested_close(credit.advantages, per_row(groups, grpo_rows(groups)))
    gates = [g for row in _gates(groups, 5.0) for g in row]
    gate_mean, m = _learner_gate_mean(groups, credit)
    assert gate_mean == pytest.approx(sum(gates) / len(gates), abs=1e-6)
    assert float(m["gate_active_ratio"]) == pytest.approx(sum(g > 0.5 for g in gates) / len(gates))


def test_sdar_paper_beta_and_lambda_reach_the_gate_and_the_coefficient():
    groups = scored_groups()
    credit = build("sdar", beta=10.0, lam=0.1).credit(groups, 0)
    assert credit.aux_terms[0].gate_beta == 10.0
    gates = [g for row in _gates(groups, 10.0) for g in row]
    assert _learner_gate_mean(groups, credit)[0] == pytest.approx(sum(gates) / len(gates), abs=1e-6)
    assert credit.aux_terms[0].coef == 0.1


def test_sdar_refuses_rows_the_scorer_did_not_score():
    groups = scored_groups()
    groups[1].episodes[0].turns[1].teacher_logprobs = None
    with pytest.raises(ValueError, match="has no teacher log-probs"):
        build("sdar").credit(groups, 0)


def test_opsd_is_the_sdar_term_without_the_policy_loss():
    groups = scored_groups()
    opsd, sdar = build("opsd").credit(groups, 0), build("sdar").credit(groups, 0)
    assert opsd.policy_loss_coef == 0.0
    assert opsd.distill == sdar.distill and opsd.aux_terms == sdar.aux_terms


def test_grpo_opsd_gate_is_one_half_on_every_token():
    groups = scored_groups()
    credit = build("grpo_opsd").credit(groups, 0)
    assert credit.aux_terms[0].gate_beta == 0.0
    gate_mean, m = _learner_gate_mean(groups, credit)
    assert gate_mean == pytest.approx(0.5) and float(m["gate_active_ratio"]) == 0.0
    assert credit.policy_loss_coef == 1.0
    assert (credit.aux_terms[0].kind, credit.aux_terms[0].coef) == ("sampled_surrogate", 0.01)


def test_skill_sd_adds_a_thousandth_of_k3_is_towards_the_skill_self_teacher():
    groups = scored_groups()
    credit = build("skill_sd").credit(groups, 0)
    [term] = credit.aux_terms
    assert (term.name, term.kind, term.coef) == ("skill_sd", "k3_is", 0.001)
    assert credit.distill.present() == {"teacher_logprobs": [r.teacher_logprobs for r in rows_of(groups)]}
    assert credit.policy_loss_coef == 1.0
    assert_nested_close(credit.advantages, per_row(groups, grpo_rows(groups)))


# ----- adrs ------------------------------------------------------------------------------------------------


def test_adrs_teacher_runs_only_during_training_steps_21_to_70():
    method = build("adrs")
    # the controller passes completed steps (0-based): training step n is step n - 1
    active = [step + 1 for step in range(100) if method.teacher_active(step)]
    assert active == list(range(21, 71))
    assert build("adrs", active_steps=None).teacher_active(500)
    assert not build("adrs", eta=0.0).teacher_active(30)


def test_adrs_entropy_coefficient_follows_the_shaping_schedule():
    method = build("adrs")
    groups = scored_groups()
    assert method.credit(groups, 19).entropy_coef == 0.001  # training step 20
    assert method.credit(groups, 20).entropy_coef == 0.01  # training step 21
    assert method.credit(groups, 69).entropy_coef == 0.01  # training step 70
    assert method.credit(unscored(groups), 70).entropy_coef == 0.001  # step 71: no teacher needed


def test_adrs_outside_the_window_is_the_base_advantage_without_a_teacher():
    groups = unscored(scored_groups())
    credit = build("adrs").credit(groups, 5)
    assert_nested_close(credit.advantages, per_row(groups, grpo_rows(groups)))
    assert credit.aux_terms == [] and credit.metrics["adrs/eta_s"] == 0.0


@pytest.mark.parametrize("level, tva_apply", [("L2", "paper"), ("L2", "after_whitening"), ("L3", "paper")])
def test_adrs_inside_the_window_shapes_per_token_advantages(level, tva_apply):
    groups = scored_groups()
    method = build(
        "adrs",
        level=level,
        tva_apply=tva_apply,
        std_mode="global",
        tau=1.0,
        clip=0.5,
        parts={"advantage": "gigpo" if level == "L3" else "grpo"},
    )
    credit = method.credit(groups, 40)
    rows = rows_from_groups(groups)
    base = (
        gigpo_advantages(rows, invalid_penalty=PENALTY)
        if level == "L3"
        else grpo_advantages(rows, invalid_penalty=PENALTY)
    )
    want, m = adrs_advantages(
        rows,
        [r.teacher_logprobs for r in rows_of(groups)],
        base,
        eta_s=0.02,
        level=level,
        tva_apply=tva_apply,
        std_mode="global",
        tau=1.0,
        clip=0.5,
        invalid_penalty=PENALTY,
    )
    assert_nested_close(credit.advantages, [t.tolist() for t in want])
    assert credit.advantages[0][0] != pytest.approx(credit.advantages[0][1], abs=1e-9)  # per token, not per row
    for key in ("adrs/tva_mean", "adrs/gate_mean", "adrs/shaping_abs_mean", "adrs/clip_fraction"):
        assert credit.metrics[key] == pytest.approx(m[key])
    assert credit.aux_terms == [] and credit.metrics["adrs/eta_s"] == 0.02


def test_method_options_are_independent_dataclass_instances():
    a, b = build("targeted_guidance"), build("targeted_guidance")
    a.opts.criterion_weights["x"] = 2.0
    assert b.opts.criterion_weights == {}
    assert dataclasses.is_dataclass(a.opts)


@pytest.mark.parametrize("name", ALL)
def test_describe_prints_every_part_with_its_formula_and_marks_what_the_preset_sets(name):
    import sys

    from pipeline.methods import describe_method
    from pipeline.methods.describe import formula

    raw = {"name": name, **({"teacher_path": "/teacher", "teacher_success_rate": 0.5} if "retire" in name else {})}
    text = describe_method(raw, env_name="alfworld")
    method = build(name, **{k: v for k, v in raw.items() if k != "name"})
    for slot, part in method.parts.items():
        assert f"\n{slot}: {part.kind}\n" in text
        text_of_kind = formula(part)
        doc = sys.modules[type(part).__module__].__doc__
        first = " ".join(doc.split("\n\n")[0].split())
        # its own bullet where the module lists kinds (a module of one part: its first paragraph)
        assert text_of_kind and (text_of_kind != first or "\n- ``" not in doc), (slot, part.kind)
    preset = load_preset(name)
    for key in preset:
        if key not in ("name", "parts", "fixed", "prefix"):
            assert f"  * {key} = " in text, key
