"""The method comparison's controls on hand-built groups: the null baseline (a fixed negative
advantage) and the equal-information baseline (NLL on the hinted expert's demonstrations)."""

from __future__ import annotations

import pytest
import torch
from method_groups import build, episode, scored_groups, turn, unscored

from pipeline.algorithm.aux_losses import LossInputs, nll
from pipeline.algorithm.losses import policy_loss
from pipeline.orchestration.batches import build_train_batch, minibatch_bounds, rows_of


def test_null_baseline_is_grpo_shifted_by_minus_lam_gap_on_every_token():
    groups = unscored(scored_groups())
    grpo = build("grpo").credit(groups, 0)
    null = build("null_baseline", lam=0.1, gap=2.0).credit(groups, 0)
    assert [len(r) for r in null.advantages] == [len(r) for r in grpo.advantages]
    for a, b in zip(null.advantages, grpo.advantages):
        assert a == pytest.approx([x - 0.2 for x in b])
    assert null.metrics["null_baseline/advantage_shift"] == pytest.approx(-0.2)
    assert not null.aux_terms and not null.distill.present()
    assert build("null_baseline").teacher_spec() is None  # no scorer, no teacher


def test_null_baseline_rejects_a_gap_that_is_not_a_negative_advantage():
    with pytest.raises(ValueError, match="method.gap=0.0 must be > 0"):
        build("null_baseline", gap=0.0)


def with_demonstrations(groups):
    """Group a gets one hinted-expert episode of 2 turns, group b none (the expert lost)."""
    demo = episode([turn(0, [0.0, 0.0, 0.0]), turn(1, [0.0])], reward=10.0, won=True)
    groups[0].demonstrations = [demo]
    return groups


def test_imitation_trains_only_the_demonstrations_by_nll_and_keeps_them_out_of_the_statistics():
    plain = unscored(scored_groups())
    groups = with_demonstrations(unscored(scored_groups()))
    grpo = build("grpo").credit(plain, 0)
    method = build("hint_imitation", lam=0.5)
    assert method.wants_demonstrations(0) and not build("grpo").wants_demonstrations(0)
    credit = method.credit(groups, 0)
    rows = rows_of(groups)
    n_policy = sum(len(g.rows()) for g in groups)
    assert len(rows) == n_policy + 2 and len(credit.advantages) == len(rows)
    # group a's rows, then its 2 demonstration rows, then group b's: the statistics are GRPO's
    a_rows = len(groups[0].rows())
    policy_adv = credit.advantages[:a_rows] + credit.advantages[a_rows + 2 :]
    assert policy_adv == grpo.advantages
    assert credit.advantages[a_rows : a_rows + 2] == [[0.0] * 3, [0.0]]
    pmask, dmask = credit.distill.policy_mask, credit.distill.distill_mask
    assert [row[0] for row in pmask] == [1.0] * a_rows + [0.0, 0.0] + [1.0] * (n_policy - a_rows)
    assert [[1.0 - x for x in row] for row in pmask] == dmask
    [term] = credit.aux_terms
    n_all = sum(r.n_response for r in rows)
    assert term.kind == "nll" and term.coef == pytest.approx(0.5 * n_all / 4)  # 4 demonstration tokens
    # minibatches never split a group from its demonstrations
    assert minibatch_bounds(groups, 2) == [(0, a_rows + 2), (a_rows + 2, len(rows))]


def test_imitation_term_is_lam_times_the_mean_nll_per_demonstration_token_and_policy_loss_ignores_them():
    groups = with_demonstrations(unscored(scored_groups()))
    credit = build("hint_imitation", lam=0.5).credit(groups, 0)
    batch = build_train_batch(rows_of(groups), credit, pad_id=0, default_entropy_coef=0.0)
    lp = torch.full_like(batch.response_mask, -2.0) * batch.response_mask
    n_all = batch.response_mask.sum()
    x = LossInputs(
        logprobs=lp,
        mask=batch.response_mask,
        n_tokens_total=n_all,
        proximal_logprobs=lp,
        distill_mask=batch.distill.distill_mask,
    )
    loss, _ = nll(x)
    assert credit.aux_terms[0].coef * loss.item() == pytest.approx(0.5 * 2.0)  # lam x mean NLL (2.0)
    # the learner's policy term over the policy mask: the demonstrations' behaviour log-probs (0,
    # no behaviour) change nothing
    pmask = batch.response_mask * batch.distill.policy_mask
    n_policy = pmask.sum()
    pg, _ = policy_loss(lp, batch.behaviour_logprobs, batch.advantages, pmask, n_policy)
    keep = batch.distill.policy_mask[:, :].amax(dim=1) > 0
    pg_plain, _ = policy_loss(
        lp[keep],
        batch.behaviour_logprobs[keep],
        batch.advantages[keep],
        batch.response_mask[keep],
        batch.response_mask[keep].sum(),
    )
    assert pg.item() == pytest.approx(pg_plain.item())


def test_imitation_without_demonstrations_adds_no_term():
    credit = build("hint_imitation").credit(unscored(scored_groups()), 0)
    assert not credit.aux_terms and credit.distill.policy_mask is None
    assert credit.metrics["imit/demo_token_fraction"] == 0.0
