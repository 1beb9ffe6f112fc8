"""pipeline.algorithm.advantages: GRPO, GiGPO and ADRS by hand and against slow loop references."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from pipeline.algorithm.adrs import adrs_advantages, adrs_centred_scores, adrs_schedule, tva_per_row
from pipeline.algorithm.advantages import (
    RowAdvantages,
    RowInput,
    anchor_groups,
    discounted_returns,
    gigpo_advantages,
    grpo_advantages,
    rows_from_groups,
)
from pipeline.core.types import Episode, EpisodeGroup, TurnRecord

EPS = 1e-6


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def row(group, episode, turn, reward, *, step=0.0, valid=True, anchor=""):
    return RowInput(
        group=group,
        episode=episode,
        turn=turn,
        episode_reward=reward,
        step_reward=step,
        action_valid=valid,
        anchor=anchor,
    )


# ----- slow references ----------------------------------------------------------------------------


def ref_normalise(value, stats, norm_std=True):
    if len(stats) < 2:
        return 0.0
    mu, sd = statistics.mean(stats), statistics.stdev(stats)
    denom = (sd + EPS if sd >= EPS else 1.0) if norm_std else 1.0
    return (value - mu) / denom


def ref_grpo(rows, pen, across_rows=True, norm_std=True):
    scores = [r.episode_reward - pen * (not r.action_valid) for r in rows]
    out = []
    for i, r in enumerate(rows):
        if across_rows:
            stats = [scores[j] for j, o in enumerate(rows) if o.group == r.group]
        else:
            episodes = {}
            for o in rows:
                if o.group == r.group:
                    episodes.setdefault(o.episode, o.episode_reward)
            stats = list(episodes.values())
        out.append(ref_normalise(scores[i], stats, norm_std))
    return out


def ref_returns(rows, gamma, pen):
    """verl-agent's order: discount the env rewards, then subtract the penalty from the invalid row."""
    out = []
    for r in rows:
        later = [o for o in rows if (o.group, o.episode) == (r.group, r.episode) and o.turn >= r.turn]
        out.append(sum(gamma ** (o.turn - r.turn) * o.step_reward for o in later) - pen * (not r.action_valid))
    return out


def ref_gigpo(rows, pen, gamma, w=1.0):
    a_e = ref_grpo(rows, pen)
    ret = ref_returns(rows, gamma, pen)
    out = []
    for i, r in enumerate(rows):
        stats = [ret[j] for j, o in enumerate(rows) if (o.group, o.anchor) == (r.group, r.anchor)]
        out.append(a_e[i] + w * ref_normalise(ret[i], stats))
    return out


def ref_adrs(rows, lps, base, strength, *, eta_s, level, tva_apply, std_mode, pen, gamma, tau=2.0, clip=0.2):
    n = len(rows)
    lbar = [sum(x) / len(x) for x in lps]
    q = [[v - lbar[i] for v in x] for i, x in enumerate(lps)]
    if std_mode == "per_seq":
        qhat = [[v / (math.sqrt(sum(u * u for u in qi) / len(qi)) + 1e-8) for v in qi] for qi in q]
    else:
        sd = statistics.stdev([v for qi in q for v in qi])
        qhat = [[v / (sd + 1e-8) for v in qi] for qi in q]
    mean_lbar = sum(lbar) / n
    alpha = [_sig(lbar[i] - mean_lbar) for i in range(n)]
    if level == "L2":
        reward = [r.episode_reward - pen * (not r.action_valid) for r in rows]
        key = [r.group for r in rows]
    else:
        reward = ref_returns(rows, gamma, pen)
        key = [(r.group, r.anchor) for r in rows]
    gate = []
    for i in range(n):
        members = [j for j in range(n) if key[j] == key[i]]
        tva = 0.0
        if len(members) >= 2:
            a = sum(alpha[j] * reward[j] for j in members) / (sum(alpha[j] for j in members) + 1e-8)
            d = sum((1 - alpha[j]) * reward[j] for j in members) / (sum(1 - alpha[j] for j in members) + 1e-8)
            tva = a - d
        gate.append(_sig(tau * tva))
    groups = sorted({r.group for r in rows}, key=str)
    shaped = {
        g: sum(r.group == g for r in rows) >= 2 and strength[[r.group for r in rows].index(g)] >= EPS for g in groups
    }

    # The reference's median: every group with an env signal, a single-row group counting as
    # std 1 (verl's std of one score); zero-std groups left out.
    def median_strength(g):
        return 1.0 if sum(r.group == g for r in rows) < 2 else strength[[r.group for r in rows].index(g)]

    good = sorted(median_strength(g) for g in groups if median_strength(g) >= EPS)
    median = good[(len(good) - 1) // 2] if good else None
    out = [[base[i]] * len(lps[i]) for i in range(n)]
    for g in groups:
        if not shaped[g]:
            continue
        members = [i for i in range(n) if rows[i].group == g]
        sig = {i: [(gate[i] if tva_apply == "paper" else 1.0) * v for v in qhat[i]] for i in members}
        flat = [v for i in members for v in sig[i]]
        mu, var = statistics.mean(flat), statistics.variance(flat)
        c = clip * min(strength[members[0]] / (median + EPS), 1.0)
        for i in members:
            for t, v in enumerate(sig[i]):
                z = (v - mu) / math.sqrt(var + 1e-8)
                if tva_apply == "after_whitening":
                    z *= gate[i]
                out[i][t] = base[i] + max(-c, min(c, eta_s * z))
    return out


def random_rows(seed: int):
    rng = random.Random(seed)
    rows = []
    for g in range(4):
        flat = g == 3  # one group whose episodes all score the same
        for e in range(rng.randint(2, 4)):
            reward = 5.0 if flat else rng.choice([0.0, 10.0, rng.uniform(-1, 3)])
            for t in range(rng.randint(1, 4)):
                rows.append(
                    row(
                        g,
                        e,
                        t,
                        reward,
                        step=rng.choice([0.0, 0.0, 1.0, 10.0]),
                        valid=flat or rng.random() > 0.2,
                        anchor=rng.choice("abc"),
                    )
                )
    rng.shuffle(rows)
    lps = [[-rng.uniform(0.01, 4.0) for _ in range(rng.randint(1, 5))] for _ in rows]
    return rows, lps


# ----- GRPO ---------------------------------------------------------------------------------------


def test_grpo_normalises_row_scores_over_all_turn_rows_of_the_group_with_unbiased_std():
    rows = [row(0, 0, 0, 10.0), row(0, 0, 1, 10.0, valid=False), row(0, 1, 0, 0.0), row(0, 1, 1, 0.0)]
    adv = grpo_advantages(rows, invalid_penalty=0.1)
    scores = [10.0, 9.9, 0.0, 0.0]
    mean = 19.9 / 4
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / 3)
    assert adv.advantages.tolist() == pytest.approx([(s - mean) / (std + EPS) for s in scores], rel=1e-6)
    assert adv.strength.tolist() == pytest.approx([std] * 4, rel=1e-6)


def test_grpo_two_rows_one_and_three_give_plus_minus_one_over_root_two():
    adv = grpo_advantages([row("t", 0, 0, 1.0), row("t", 1, 0, 3.0)]).advantages
    assert adv.tolist() == pytest.approx([-1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)])


def test_grpo_over_episodes_uses_episode_rewards_and_keeps_each_rows_invalid_penalty():
    rows = [row(0, "a", 0, 1.0), row(0, "a", 1, 1.0, valid=False), row(0, "b", 0, 3.0)]
    adv = grpo_advantages(rows, invalid_penalty=0.5, mean_std_across_rows=False).advantages
    d = math.sqrt(2) + EPS  # stats over the episode rewards [1, 3]
    assert adv.tolist() == pytest.approx([-1 / d, -1.5 / d, 1 / d])


def test_dr_grpo_without_std_normalisation_only_subtracts_the_group_mean():
    rows = [row(0, 0, 0, 1.0), row(0, 1, 0, 3.0), row(0, 2, 0, 8.0)]
    adv = grpo_advantages(rows, norm_std=False).advantages
    assert adv.tolist() == pytest.approx([-3.0, -1.0, 4.0])


def test_grpo_single_row_group_gets_zero_advantage():
    adv = grpo_advantages([row(0, 0, 0, 10.0), row(1, 0, 0, 3.0), row(1, 1, 0, 5.0)])
    assert adv.advantages[0].item() == 0.0 and adv.strength[0].item() == 0.0
    assert adv.group_rows.tolist() == [1, 2, 2]


def test_grpo_over_episodes_with_a_single_episode_gives_zero_even_on_invalid_rows():
    rows = [row(0, 0, 0, 1.0), row(0, 0, 1, 1.0, valid=False)]
    adv = grpo_advantages(rows, invalid_penalty=0.1, mean_std_across_rows=False)
    assert adv.advantages.tolist() == [0.0, 0.0] and adv.strength.tolist() == [0.0, 0.0]


def test_grpo_zero_std_group_gives_zero_advantage_over_rows():
    adv = grpo_advantages([row(0, e, 0, 4.0) for e in range(3)]).advantages
    assert torch.all(adv == 0)


def test_grpo_zero_std_over_episodes_keeps_the_invalid_penalty_finite():
    rows = [row(0, 0, 0, 1.0), row(0, 0, 1, 1.0, valid=False), row(0, 1, 0, 1.0)]
    adv = grpo_advantages(rows, invalid_penalty=0.1, mean_std_across_rows=False).advantages
    assert adv.tolist() == pytest.approx([0.0, -0.1, 0.0])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("across_rows,norm_std", [(True, True), (False, True), (True, False)])
def test_grpo_matches_a_slow_loop_reference(seed, across_rows, norm_std):
    rows, _ = random_rows(seed)
    got = grpo_advantages(rows, invalid_penalty=0.1, mean_std_across_rows=across_rows, norm_std=norm_std)
    assert got.advantages.tolist() == pytest.approx(ref_grpo(rows, 0.1, across_rows, norm_std), abs=1e-5)


# ----- GiGPO --------------------------------------------------------------------------------------


def test_discounted_returns_follow_turn_order_and_penalise_only_the_invalid_row():
    rows = [row(0, 0, 2, 10.0, step=10.0), row(0, 0, 0, 10.0), row(0, 0, 1, 10.0, valid=False)]
    got = discounted_returns(rows, gamma=0.95, invalid_penalty=0.1)
    assert got.tolist() == pytest.approx([10.0, 0.95**2 * 10.0, 0.95 * 10.0 - 0.1])


def test_gigpo_invalid_penalty_is_not_discounted_into_earlier_turns():
    # The group: episode 0 = [valid a, INVALID b], episode 1 = [valid a, valid b], rewards
    # 0, penalty 0.1, gamma 0.95. verl-agent: step returns [0, -0.1, 0, 0].
    rows = [
        row(0, 0, 0, 0.0, anchor="a"),
        row(0, 0, 1, 0.0, valid=False, anchor="b"),
        row(0, 1, 0, 0.0, anchor="a"),
        row(0, 1, 1, 0.0, anchor="b"),
    ]
    assert discounted_returns(rows, gamma=0.95, invalid_penalty=0.1).tolist() == pytest.approx([0, -0.1, 0, 0])
    got = gigpo_advantages(rows, invalid_penalty=0.1, gamma=0.95).advantages.tolist()
    assert got == pytest.approx([0.5, -2.2071, 0.5, 1.2071], abs=1e-4)


def test_anchor_groups_join_identical_observations_within_but_never_across_episode_groups():
    rows = [
        row(0, 0, 0, 0, anchor="kitchen"),
        row(0, 1, 0, 0, anchor="kitchen"),
        row(0, 1, 1, 0, anchor="hall"),
        row(1, 0, 0, 0, anchor="kitchen"),
    ]
    ids = anchor_groups(rows).tolist()
    assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3]}) == 3


def test_similarity_threshold_joins_near_identical_observations():
    a = "You are in the middle of a room. You see a countertop 1, a mug 1 and a fridge 1."
    b = a.replace("mug 1", "mug 2")
    rows = [row(0, 0, 0, 0, anchor=a), row(0, 1, 0, 0, anchor=b), row(0, 2, 0, 0, anchor="You see nothing.")]
    exact = anchor_groups(rows).tolist()
    similar = anchor_groups(rows, similarity_threshold=0.95).tolist()
    assert len(set(exact)) == 3
    assert similar[0] == similar[1] != similar[2]


def test_gigpo_adds_anchor_step_advantages_to_episode_advantages_and_zero_for_singletons():
    rows = [
        row(0, 0, 0, 10.0, anchor="s"),
        row(0, 0, 1, 10.0, step=10.0, anchor="t"),
        row(0, 1, 0, 0.0, anchor="s"),
        row(0, 1, 1, 0.0, anchor="u"),
    ]
    got = gigpo_advantages(rows, gamma=0.95)
    a_e = grpo_advantages(rows).advantages.tolist()
    r_s = [9.5, 0.0]  # returns of the two rows anchored at "s"
    a_s = (r_s[0] - 4.75) / (statistics.stdev(r_s) + EPS)
    assert got.advantages.tolist() == pytest.approx([a_e[0] + a_s, a_e[1], a_e[2] - a_s, a_e[3]], rel=1e-6)
    assert got.strength.tolist() == pytest.approx([max(abs(a) for a in got.advantages.tolist())] * 4)
    assert got.metrics["gigpo/singleton_anchor_fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(6))
def test_gigpo_matches_a_slow_loop_reference(seed):
    rows, _ = random_rows(seed)
    got = gigpo_advantages(rows, invalid_penalty=0.1, gamma=0.9, step_weight=0.5)
    assert got.advantages.tolist() == pytest.approx(ref_gigpo(rows, 0.1, 0.9, 0.5), abs=1e-5)
    assert discounted_returns(rows, gamma=0.9, invalid_penalty=0.1).tolist() == pytest.approx(
        ref_returns(rows, 0.9, 0.1)
    )


def test_rows_from_groups_flattens_records_in_row_order():
    def turn(i, valid=True):
        return TurnRecord(
            prompt_ids=[1],
            response_ids=[2],
            behaviour_logprobs=[-0.1],
            policy_version=0,
            turn_index=i,
            messages=[],
            step_reward=float(i),
            action_valid=valid,
            anchor_obs=f"o{i}",
        )

    group = EpisodeGroup(
        task_id="t",
        seed=0,
        episodes=[
            Episode(task_id="t", env_name="e", seed=0, turns=[turn(0), turn(1, valid=False)], reward=10.0),
            Episode(task_id="t", env_name="e", seed=0, turns=[turn(0)], reward=0.0),
        ],
    )
    rows = rows_from_groups([group, group])
    assert len(rows) == 6
    assert rows[1] == row(0, 0, 1, 10.0, step=1.0, valid=False, anchor="o1")
    assert rows[5] == row(1, 1, 0, 0.0, step=0.0, anchor="o0")


# ----- ADRS ---------------------------------------------------------------------------------------


def test_adrs_centring_per_sequence_uses_the_row_mean_and_population_std():
    qhat = adrs_centred_scores([[-1.0, -3.0], [-2.0]], std_mode="per_seq")
    assert qhat[0].tolist() == pytest.approx([1.0, -1.0])  # q = [1, -1], std = 1
    assert qhat[1].tolist() == [0.0]


def test_adrs_centring_global_uses_the_unbiased_std_over_all_tokens():
    qhat = adrs_centred_scores([[-1.0, -3.0], [-2.0, -2.0]], std_mode="global")
    sd = statistics.stdev([1.0, -1.0, 0.0, 0.0])
    assert torch.cat(qhat).tolist() == pytest.approx([1 / sd, -1 / sd, 0.0, 0.0])


def test_tva_compares_rewards_of_teacher_aligned_and_divergent_rows():
    rows = [row(0, 0, 0, 10.0), row(0, 1, 0, 0.0), row(1, 0, 0, 3.0)]
    tva = tva_per_row(rows, [[-1.0], [-2.0], [-1.5]], level="L2").tolist()
    a = _sig(0.5)  # the batch mean of row means is -1.5
    assert tva[0] == pytest.approx(10 * a - 10 * (1 - a), rel=1e-6) and tva[0] == tva[1]
    assert tva[2] == 0.0  # a single-row group has no TVA


def test_tva_at_l3_uses_anchor_groups_and_discounted_returns():
    rows = [row(0, 0, 0, 1.0, anchor="s"), row(0, 0, 1, 1.0, step=1.0, anchor="t"), row(0, 1, 0, 0.0, anchor="s")]
    tva = tva_per_row(rows, [[-1.0], [-1.0], [-4.0]], level="L3", gamma=0.5).tolist()
    a_hi, a_lo = _sig(1.0), _sig(-2.0)  # row means -1, -1, -4 around their mean -2
    expected = (a_hi * 0.5) / (a_hi + a_lo) - ((1 - a_hi) * 0.5) / ((1 - a_hi) + (1 - a_lo))
    assert tva[0] == pytest.approx(expected, rel=1e-6) and tva[2] == tva[0]
    assert tva[1] == 0.0


def test_adrs_whitens_within_the_group_and_adds_the_scaled_shaping_to_the_row_advantage():
    rows = [row(0, 0, 0, 1.0), row(0, 1, 0, 3.0)]
    lps = [[-1.0, -3.0], [-2.0, -2.5, -1.0]]
    base = grpo_advantages(rows)
    out, m = adrs_advantages(rows, lps, base, eta_s=0.5, clip=None)
    qhat = [v for x in adrs_centred_scores(lps) for v in x.tolist()]
    mu, var = statistics.mean(qhat), statistics.variance(qhat)
    z = [(v - mu) / math.sqrt(var + 1e-8) for v in qhat]
    a = base.advantages.tolist()
    expected = [a[0] + 0.5 * z[0], a[0] + 0.5 * z[1], a[1] + 0.5 * z[2], a[1] + 0.5 * z[3], a[1] + 0.5 * z[4]]
    assert torch.cat(out).tolist() == pytest.approx(expected, abs=1e-6)
    assert [t.numel() for t in out] == [2, 3]
    assert m["adrs/clip_fraction"] == 0.0 and m["adrs/shaped_group_fraction"] == 1.0


def test_adrs_adaptive_clip_scales_the_clip_by_the_groups_std_relative_to_the_median():
    rows, lps = [], []
    for g, (lo, hi) in enumerate([(0.0, 0.5), (0.0, 1.0), (0.0, 2.0)]):  # stds proportional to 0.5, 1, 2
        rows += [row(g, 0, 0, lo), row(g, 1, 0, hi)]
        lps += [[-1.0, -2.0], [-3.0, -1.0]]
    base = grpo_advantages(rows)
    out, m = adrs_advantages(rows, lps, base, eta_s=100.0, clip=0.2)
    std = base.strength.tolist()
    for i, tokens in enumerate(out):
        c = 0.2 * min(std[i] / (std[2] + EPS), 1.0)  # median of the three stds is group 1's
        shaping = [v - base.advantages[i].item() for v in tokens.tolist()]
        assert [abs(s) for s in shaping] == pytest.approx([c, c], rel=1e-5)
    assert m["adrs/clip_fraction"] == 1.0
    out_fixed, _ = adrs_advantages(rows, lps, base, eta_s=100.0, clip=0.2, adaptive_clip=False)
    assert (out_fixed[0] - base.advantages[0]).abs().tolist() == pytest.approx([0.2, 0.2], rel=1e-5)


def test_adrs_adaptive_clip_median_counts_single_row_groups_as_the_reference_does():
    # Two shaped groups (stds 0.354, 0.707) and three single-row groups, which the reference
    # counts with std 1 in the median: median 1, so the clips are 0.2 * std / (1 + 1e-6).
    rows = [
        row(0, 0, 0, 0.0),
        row(0, 1, 0, 0.5),
        row(1, 0, 0, 0.0),
        row(1, 1, 0, 1.0),
        row(2, 0, 0, 1.0),
        row(3, 0, 0, 0.0),
        row(4, 0, 0, 1.0),
    ]
    lps = [[-1.0, -2.0], [-3.0, -1.0]] * 2 + [[-1.0, -2.0]] * 3
    base = grpo_advantages(rows)
    out, _ = adrs_advantages(rows, lps, base, eta_s=100.0, clip=0.2)
    std = base.strength.tolist()
    for i in range(4):
        c = 0.2 * std[i] / (1.0 + EPS)
        assert (out[i] - base.advantages[i]).abs().tolist() == pytest.approx([c, c], rel=1e-5)
    for i in range(4, 7):  # single rows are not shaped
        assert out[i].tolist() == pytest.approx([base.advantages[i].item()] * 2)


def test_adrs_leaves_single_row_and_zero_std_groups_unshaped():
    rows = [row(0, 0, 0, 5.0), row(0, 1, 0, 5.0), row(1, 0, 0, 1.0), row(2, 0, 0, 0.0), row(2, 1, 0, 1.0)]
    lps = [[-1.0, -2.0]] * 5
    base = grpo_advantages(rows)
    out, m = adrs_advantages(rows, lps, base, eta_s=0.5)
    for i in range(3):
        assert torch.all(out[i] == base.advantages[i])
    assert not torch.all(out[3] == base.advantages[3])
    assert m["adrs/shaped_group_fraction"] == pytest.approx(1 / 3)


def test_adrs_leaves_a_one_episode_group_unshaped():
    # statistics over episodes: group 0 has one episode of 3 turns (nothing to compare: advantage 0,
    # no shaping; the released code would use A = R and shape it, docs/methods.md), group 1 two
    rows = [row(0, 0, 0, 1.0), row(0, 0, 1, 1.0), row(0, 0, 2, 1.0), row(1, 0, 0, 1.0), row(1, 1, 0, 0.0)]
    lps = [[-1.0, -2.0], [-0.5, -3.0], [-2.0, -0.1], [-1.0, -0.5], [-0.3, -2.0]]
    base = grpo_advantages(rows, mean_std_across_rows=False)
    out, m = adrs_advantages(rows, lps, base, eta_s=0.5)
    for i in range(3):
        assert torch.all(out[i] == 0.0)
    assert not torch.all(out[3] == base.advantages[3])  # the group of two episodes is shaped
    assert m["adrs/shaped_group_fraction"] == pytest.approx(1 / 2)


def test_l2_gate_cancels_in_paper_mode_but_acts_after_whitening():
    rows = [row(0, 0, 0, 10.0), row(0, 1, 0, 0.0), row(0, 2, 0, 4.0)]
    lps = [[-0.5, -1.0, -0.2], [-3.0, -2.0], [-1.0, -1.5]]
    base = grpo_advantages(rows)
    kw = dict(eta_s=0.1, clip=None)
    assert abs(tva_per_row(rows, lps).tolist()[0]) > 1.0  # a gate far from 0.5
    paper_gated, m = adrs_advantages(rows, lps, base, tva_apply="paper", tau=2.0, **kw)
    paper_neutral, _ = adrs_advantages(rows, lps, base, tva_apply="paper", tau=0.0, **kw)
    after_gated, _ = adrs_advantages(rows, lps, base, tva_apply="after_whitening", tau=2.0, **kw)
    after_neutral, _ = adrs_advantages(rows, lps, base, tva_apply="after_whitening", tau=0.0, **kw)
    assert torch.allclose(torch.cat(paper_gated), torch.cat(paper_neutral), atol=1e-6)
    gated = torch.cat([after_gated[i] - base.advantages[i] for i in range(3)])
    neutral = torch.cat([after_neutral[i] - base.advantages[i] for i in range(3)])
    m_group = m["adrs/gate_mean"]  # one group, so the gate is this one value on every token
    assert torch.allclose(gated, neutral * m_group / 0.5, atol=1e-6)  # tau = 0 means m = 0.5
    assert not torch.allclose(gated, neutral, atol=1e-3)


def test_l3_gate_varies_within_an_episode_group_so_it_acts_even_in_paper_mode():
    rows = [
        row(0, 0, 0, 10.0, anchor="s"),
        row(0, 0, 1, 10.0, step=10.0, anchor="t"),
        row(0, 1, 0, 0.0, anchor="s"),
        row(0, 1, 1, 0.0, anchor="t"),
    ]
    lps = [[-0.2, -0.9], [-2.0, -0.1], [-3.0, -1.0], [-0.4, -0.6]]
    base = gigpo_advantages(rows)
    kw = dict(eta_s=0.1, clip=None, level="L3", tva_apply="paper")
    gated, _ = adrs_advantages(rows, lps, base, tau=2.0, **kw)
    neutral, _ = adrs_advantages(rows, lps, base, tau=0.0, **kw)
    assert not torch.allclose(torch.cat(gated), torch.cat(neutral), atol=1e-4)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "level,tva_apply,std_mode",
    [
        ("L2", "paper", "per_seq"),
        ("L2", "after_whitening", "global"),
        ("L3", "paper", "global"),
        ("L3", "after_whitening", "per_seq"),
    ],
)
def test_adrs_matches_a_slow_loop_reference(seed, level, tva_apply, std_mode):
    rows, lps = random_rows(seed)
    base = (
        gigpo_advantages(rows, invalid_penalty=0.1, gamma=0.9)
        if level == "L3"
        else grpo_advantages(rows, invalid_penalty=0.1)
    )
    out, _ = adrs_advantages(
        rows, lps, base, eta_s=0.3, level=level, tva_apply=tva_apply, std_mode=std_mode, invalid_penalty=0.1, gamma=0.9
    )
    expected = ref_adrs(
        rows,
        lps,
        base.advantages.tolist(),
        base.strength.tolist(),
        eta_s=0.3,
        level=level,
        tva_apply=tva_apply,
        std_mode=std_mode,
        pen=0.1,
        gamma=0.9,
    )
    for got, want in zip(out, expected):
        assert got.tolist() == pytest.approx(want, abs=1e-5)


def test_adrs_rejects_rows_without_teacher_log_probs():
    rows = [row(0, 0, 0, 1.0), row(0, 1, 0, 0.0)]
    with pytest.raises(ValueError, match="at least one"):
        adrs_advantages(rows, [[-1.0], []], grpo_advantages(rows), eta_s=0.1)


def test_adrs_with_zero_eta_returns_the_row_advantage_on_every_token():
    rows, lps = random_rows(0)
    base = grpo_advantages(rows)
    out, m = adrs_advantages(rows, lps, base, eta_s=0.0)
    assert all(torch.all(t == base.advantages[i]) for i, t in enumerate(out))
    assert m["adrs/shaping_abs_mean"] == 0.0


def test_adrs_schedule_is_off_through_step_20_on_for_21_to_70_and_off_after():
    assert adrs_schedule(20).eta_s == 0.0 and adrs_schedule(20).entropy_coef == 0.001
    assert adrs_schedule(21).eta_s == 0.02 and adrs_schedule(21).entropy_coef == 0.01
    assert adrs_schedule(70).eta_s == 0.02
    assert adrs_schedule(71).eta_s == 0.0 and adrs_schedule(71).entropy_coef == 0.001
    assert adrs_schedule(10_000, active_steps=None).eta_s == 0.02


def test_row_advantages_are_float32_in_input_order():
    rows = [row(0, 1, 0, 3.0), row(0, 0, 0, 1.0)]
    got = grpo_advantages(rows)
    assert isinstance(got, RowAdvantages) and got.advantages.dtype == torch.float32
    assert got.advantages[0] > 0 > got.advantages[1]
