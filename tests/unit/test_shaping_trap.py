"""The trap of a shaped advantage (issue 42, item 4; miles #2362): a term folded into the advantage
teaches only if it depends on the sampled token. On-policy, ``E_y~pi[c * grad log pi(y)] = c *
E[grad log pi] = 0`` for any c that is the same for every token the prefix can emit, such as an
expected divergence over the support: it adds variance and no direction.

Every signal that folds a term into the advantage is checked here on one fixed prefix: a
categorical student over V = 5 tokens (logits theta), a teacher distribution q, many tokens
sampled from the student, and the term computed by the project's own credit assignment (the
method built from its preset, ``Method.credit`` on episode groups whose rows carry the sampled
tokens' behaviour and teacher log-probs, exactly what a training step hands it), as the
advantage it produces minus GRPO's on the same groups. Its expected policy-gradient contribution
``E[term * grad_theta log pi(y)]`` (``grad log pi(y) = onehot(y) - pi`` for a softmax) is
estimated over the groups, each group one replicate (its tokens share the whitening statistics),
with its standard error:

- ADRS (``signal: shaping``, L2 as the paper codes it, L2 with the gate after the whitening, and
  L3 on GiGPO): non-zero by tens of standard errors when the teacher differs from the student,
  pointing along ``grad E_pi[log q]`` (its term is a whitened ``log q(y)``); exactly zero when the
  teacher has no preference (uniform q: every centred score is 0). When the teacher *is* the
  student (q = pi) it is not zero: a reward of ``log q = log pi`` pushes along ``grad E_pi[log pi]
  = -grad H(pi)``, i.e. it sharpens the student towards its own mode. Pinned here so that nobody
  reads ADRS's term as a divergence that vanishes at agreement: it does not.
- The null baseline (``signal: null``): a constant shift ``-lam * gap`` on every token, a
  control by design (arXiv 2608.31046's null baseline), not a teacher signal: its expected
  gradient is zero, and the test says so.
- The negative control, written here: ``-lam * KL(pi || q)`` over the whole support, placed in
  the advantage of every token: zero expected gradient, although the teacher differs; beside it
  the same divergence's sampled-token estimate ``-lam * (log pi(y) - log q(y))`` is non-zero (it
  is ``-lam * grad KL``). So the estimator tells a term that teaches from one that cannot, and
  this test fails for a shaping term that stops depending on the sampled token.
"""

from __future__ import annotations

import math

import pytest
import torch
from method_groups import build, episode, group, turn

V, LENGTH, GROUPS = 5, 32, 400  # tokens per row, groups of 2 rows (one won, one lost): 25,600 samples
STUDENT = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0], dtype=torch.float64).log_softmax(0)
TEACHERS = {
    "differs": torch.tensor([-1.0, -0.5, 0.0, 1.5, 0.5], dtype=torch.float64).log_softmax(0),
    "uniform": torch.full((V,), -math.log(V), dtype=torch.float64),
    "same": STUDENT,
}
PI = STUDENT.exp()
ADRS = {  # every form of the shaping signal a preset can take
    "L2 paper": {"level": "L2", "tva_apply": "paper"},
    "L2 after_whitening": {"level": "L2", "tva_apply": "after_whitening"},
    "L3 gigpo": {"level": "L3", "parts": {"advantage": "gigpo"}},
}
Z_TEACHES, Z_NOISE = 10.0, 4.0  # a term that teaches: > 10 standard errors; one that cannot: < 4


def sampled_groups(teacher: torch.Tensor, seed: int = 0):
    """GROUPS episode groups of 2 one-turn episodes (rewards 10 and 0, so every group carries an env
    signal and is shaped); each turn LENGTH tokens drawn from the student at the one prefix, with
    their behaviour and teacher log-probs. Returns the groups and the tokens ``# [G, 2, LENGTH]``."""
    gen = torch.Generator().manual_seed(seed)
    ys = torch.multinomial(PI, GROUPS * 2 * LENGTH, replacement=True, generator=gen).view(GROUPS, 2, LENGTH)
    groups = []
    for g in range(GROUPS):
        eps = []
        for e in range(2):
            y = ys[g, e]
            row = turn(0, STUDENT[y].tolist(), lpt=teacher[y].tolist(), anchor="the prefix")
            row.response_ids = y.tolist()
            eps.append(episode([row], reward=10.0 * (e == 0), won=e == 0))
        groups.append(group(f"g{g}", eps))
    return groups, ys


def folded_term(method: str, base: str, groups, **options) -> torch.Tensor:
    """What the method adds to the advantage of each sampled token ``# [G, 2, LENGTH]``: its credit
    minus that of its base advantage, on the same groups (step 0, the schedule on)."""
    shaped = build(method, **options).credit(groups, 0).advantages
    plain = build(base).credit(groups, 0).advantages
    return (torch.tensor(shaped, dtype=torch.float64) - torch.tensor(plain, dtype=torch.float64)).view(
        GROUPS, 2, LENGTH
    )


def expected_gradient(term: torch.Tensor, ys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``E[term * grad_theta log pi(y)]`` over the groups and its standard error, both ``# [V]``."""
    score = torch.nn.functional.one_hot(ys, V).double() - PI  # grad of log softmax(theta)[y]
    per_group = (term.unsqueeze(-1) * score).mean(dim=(1, 2))  # [G, V]
    return per_group.mean(0), per_group.std(0) / math.sqrt(GROUPS)


def direction_of(f: torch.Tensor) -> torch.Tensor:
    """``grad_theta E_pi[f(y)] = pi * (f - E_pi f)``: where a reward f(y) pushes the logits."""
    return PI * (f - (PI * f).sum())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("form", list(ADRS))
def test_adrs_shaping_pushes_along_the_teacher_where_it_differs_from_the_student(form):
    options = {"warmup_steps": 0, **ADRS[form]}  # the window on from the first step
    base = "gigpo" if ADRS[form]["level"] == "L3" else "grpo"
    groups, ys = sampled_groups(TEACHERS["differs"])
    grad, se = expected_gradient(folded_term("adrs", base, groups, **options), ys)
    assert (grad.abs() / se).max() > Z_TEACHES  # many standard errors from zero
    assert cosine(grad, direction_of(TEACHERS["differs"])) > 0.95  # along grad E_pi[log q]


@pytest.mark.parametrize("form", list(ADRS))
def test_adrs_shaping_is_exactly_zero_when_the_teacher_has_no_preference(form):
    base = "gigpo" if ADRS[form]["level"] == "L3" else "grpo"
    groups, _ = sampled_groups(TEACHERS["uniform"])
    assert folded_term("adrs", base, groups, warmup_steps=0, **ADRS[form]).abs().max() == 0.0


def test_adrs_shaping_with_the_teacher_equal_to_the_student_sharpens_the_student():
    groups, ys = sampled_groups(TEACHERS["same"])
    grad, se = expected_gradient(folded_term("adrs", "grpo", groups, warmup_steps=0), ys)
    # not zero at agreement: its reward log pi(y) pushes along grad E_pi[log pi] = -grad H(pi)
    assert (grad.abs() / se).max() > Z_TEACHES
    assert cosine(grad, direction_of(STUDENT)) > 0.95


def test_the_null_baseline_shift_is_a_constant_with_zero_expected_gradient():
    groups, ys = sampled_groups(TEACHERS["differs"])
    term = folded_term("null_baseline", "grpo", groups, lam=0.1, gap=1.0)
    assert torch.allclose(term, torch.full_like(term, -0.1))  # the same for every token: a control
    grad, se = expected_gradient(term, ys)
    assert (grad.abs() / se).max() < Z_NOISE


def test_a_divergence_over_the_support_in_the_advantage_cannot_teach_its_sampled_estimate_can():
    groups, ys = sampled_groups(TEACHERS["differs"])
    q = TEACHERS["differs"]
    kl = float((PI * (STUDENT - q)).sum())  # KL(pi || q) over the support: the same at every token
    assert kl > 0.5  # the teacher differs a lot
    constant, se = expected_gradient(torch.full(ys.shape, -0.1 * kl, dtype=torch.float64), ys)
    assert (constant.abs() / se).max() < Z_NOISE  # zero expected gradient: it cannot teach
    sampled, se = expected_gradient(-0.1 * (STUDENT - q)[ys], ys)  # the same divergence, per sampled token
    assert (sampled.abs() / se).max() > Z_TEACHES
    assert cosine(sampled, -direction_of(STUDENT - q)) > 0.99  # -grad KL(pi || q): towards the teacher


# Every signal kind, by whether it folds a term into the advantage (tested above) or adds a loss
# term / nothing (the advantage untouched). A new kind fails here until it is placed, and tested
# above if it folds.
FOLDS_INTO_ADVANTAGE = {"shaping", "null"}
LEAVES_THE_ADVANTAGE = {"none", "aux", "imitate", "entropy_gate"}


def test_every_signal_kind_is_classified_and_the_folding_ones_are_tested_here():
    from pipeline.methods.parts import PARTS, load_parts

    load_parts()
    assert set(PARTS["signal"]) == FOLDS_INTO_ADVANTAGE | LEAVES_THE_ADVANTAGE
    groups, _ = sampled_groups(TEACHERS["differs"])
    for name in ("grpo", "sdar", "hint_imitation"):  # signals none, aux and imitate leave GRPO's advantage as it is
        assert torch.equal(folded_term(name, "grpo", groups), torch.zeros(GROUPS, 2, LENGTH)), name
