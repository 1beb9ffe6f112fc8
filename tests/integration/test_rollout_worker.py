"""RolloutWorker (plain class, no Ray) with the real HF engine on the tiny model: many groups in
flight and new weights landing mid-episode (envs that raise or hang: tests/faults/test_env_faults.py).

``steps3`` (tests/scripted_envs.py) is a test env (3 turns, any reply is valid): it stands in for a
real env only to script the episodes; the worker, batcher and engine under it are the real ones.
"""

from __future__ import annotations

import pytest
import torch
from scripted_envs import play, rollout_worker

from pipeline.algorithm.logprobs import response_logprobs
from pipeline.core.types import StopReason
from pipeline.distributed.weight_sync import pack
from pipeline.models import load_model

pytestmark = pytest.mark.integration

PARITY_ATOL_FP32 = 1e-4  # as tests/integration/test_hf_engine.py


@pytest.fixture(scope="module")
def v0_state(tiny_model_dir):
    return {k: v.clone() for k, v in load_model(tiny_model_dir, torch.float32, "cpu").state_dict().items()}


def test_groups_in_flight_share_generate_calls_and_each_turn_matches_the_learner_under_its_version(
    tiny_model_dir, v0_state
):
    """Six groups x 4 episodes x 3 turns on one worker; new weights are queued during the second
    generate call, so turns sampled before and after the swap mix, within episodes too. Every
    turn's behaviour log-probs must equal the learner's forward under the weights of the version
    it recorded."""
    gen = torch.Generator().manual_seed(0)
    v1_state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in v0_state.items()
    }
    v1_state["lm_head.weight"] = v1_state["model.embed_tokens.weight"]  # tied, as the learner sends them
    worker = rollout_worker(tiny_model_dir, "steps3")
    sizes: list[int] = []
    real_generate = worker.engine.generate

    def generate(prompts, **kw):
        sizes.append(len(prompts))
        out = real_generate(prompts, **kw)
        if len(sizes) == 2:
            worker.set_weights(pack(v1_state, 1))  # lands before the third call
        return out

    worker.engine.generate = generate
    try:
        groups = play(worker, 6)
    finally:
        worker.close()
    assert all(len(g.episodes) == 4 for g in groups)
    rows = [(e, t) for g in groups for e in g.episodes for t in e.turns]
    assert len(rows) == 6 * 4 * 3 and all(e.stop_reason is StopReason.WON for g in groups for e in g.episodes)
    assert max(sizes) > 4  # turns of several groups in one generate call
    assert len(sizes) < len(rows) / 4  # far fewer calls than one per group turn
    mixed = [e for g in groups for e in g.episodes if {t.policy_version for t in e.turns} == {0, 1}]
    assert mixed  # an episode that started under v0 finished under v1

    models = {}
    for version, sd in ((0, v0_state), (1, v1_state)):
        m = load_model(tiny_model_dir, torch.float32, "cpu")
        m.load_state_dict(sd)
        models[version] = m.eval()
    worst = 0.0
    for version, model in models.items():
        mine = [t for _, t in rows if t.policy_version == version]
        assert mine
        ref = response_logprobs(model, [t.prompt_ids for t in mine], [t.response_ids for t in mine], temperature=1.0)
        worst = max(worst, max((r - torch.tensor(t.behaviour_logprobs)).abs().max().item() for r, t in zip(ref, mine)))
    assert worst < PARITY_ATOL_FP32


def test_chat_episodes_continue_their_sampled_ids_and_end_where_the_context_does(tiny_model_dir, v0_state):
    """``env.prompt_format=chat``: each turn's prompt is the last one's ids and its reply's ids as
    sampled, then the next observation; the behaviour log-probs still equal the learner's forward
    of those rows; an episode whose conversation outgrows ``rollout.max_prompt_tokens`` ends
    there (``StopReason.CONTEXT``), without an error."""
    from pipeline.algorithm.shared_prefix import unique_tokens

    worker = rollout_worker(tiny_model_dir, "steps3", prompt_format="chat")
    try:
        groups = play(worker, 2)
    finally:
        worker.close()
    episodes = [e for g in groups for e in g.episodes]
    assert all(e.stop_reason is StopReason.WON and len(e.turns) == 3 for e in episodes)
    for e in episodes:
        for prev, row in zip(e.turns, e.turns[1:]):
            said = prev.prompt_ids + prev.response_ids
            eot = worker.prompts.end_of_turn
            closed = said if prev.response_ids[-1] == eot else [*said, eot]
            assert row.prompt_ids[: len(closed)] == closed
        seqs = [t.prompt_ids + t.response_ids for t in e.turns]
        assert unique_tokens(seqs) == len(seqs[-1])  # the learner carries each token once
    model = load_model(tiny_model_dir, torch.float32, "cpu")
    model.load_state_dict(v0_state)
    rows = [t for e in episodes for t in e.turns]
    ref = response_logprobs(model.eval(), [t.prompt_ids for t in rows], [t.response_ids for t in rows], temperature=1.0)
    assert (
        max((r - torch.tensor(t.behaviour_logprobs)).abs().max().item() for r, t in zip(ref, rows)) < PARITY_ATOL_FP32
    )

    first = len(episodes[0].turns[0].prompt_ids)
    worker = rollout_worker(tiny_model_dir, "steps3", prompt_format="chat", max_prompt_tokens=first + 8)
    try:
        short = [e for g in play(worker, 1) for e in g.episodes]
    finally:
        worker.close()
    assert all(e.stop_reason is StopReason.CONTEXT and len(e.turns) == 1 and not e.error for e in short)


def test_groups_in_lockstep_merge_into_one_call_per_turn(tiny_model_dir):
    """Groups that step their envs while the others generate would alternate for ever, one or two
    groups per call; waiting for the live episodes merges all four (from turn 2 at the latest)."""
    worker = rollout_worker(tiny_model_dir, "steps3")
    sizes: list[int] = []
    real_generate = worker.engine.generate

    def generate(prompts, **kw):
        sizes.append(len(prompts))
        return real_generate(prompts, **kw)

    worker.engine.generate = generate
    try:
        groups = play(worker, 4)
    finally:
        worker.close()
    assert sum(sizes) == 4 * 4 * 3
    assert all(
        e.privileged_hint == f"Task {g.seed} is won by any three replies." for g in groups for e in g.episodes
    )  # written by the env at reset, read by a hints teacher
    assert sizes[-1] == 16 and len(sizes) <= 5, sizes


def test_the_engine_scores_as_the_scorer_actor_does_on_the_weights_it_samples_with(tiny_model_dir, v0_state):
    """scorer.placement=engine: the rollout worker's own engine gives the teacher log-probs the
    scorer actor gives on the same weights (fp32: the same forward, to float rounding), after
    applying the weights queued for its next turn, with their version; below the published
    version it refuses (a restarted process)."""
    from actors.scorer import TeacherScorerWorker
    from pipeline.core.errors import WeightsLost
    from pipeline.core.types import TeacherNeeds

    gen = torch.Generator().manual_seed(1)
    v3_state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in v0_state.items()
    }
    v3_state["lm_head.weight"] = v3_state["model.embed_tokens.weight"]
    items = [([5, 6, 7, 8, 9], [10, 11, 12]), ([5, 6], [13, 14, 15, 16, 17]), ([20] * 30, [21])]
    worker = rollout_worker(tiny_model_dir, "steps3")
    scorer = TeacherScorerWorker(str(tiny_model_dir), temperature=1.0, micro_batch_tokens=64, precision="fp32")
    try:
        worker.set_weights(pack(v3_state, 3))  # queued: the engine still holds v0
        scorer.set_weights(pack(v3_state, 3))
        out = worker.score(items, [], TeacherNeeds(), min_version=3, micro_batch_tokens=64)
        got, version = out.logprobs, out.version
        want = scorer.score(items, [], TeacherNeeds(), min_version=3).logprobs
        assert version == 3 and worker.engine.version == 3
        assert [len(x) for x in got] == [3, 5, 1]
        for g, w in zip(got, want):
            assert g == pytest.approx(w, abs=1e-5)
        with pytest.raises(WeightsLost, match="holds weights v3, v4 were published"):
            worker.score(items, [], TeacherNeeds(), min_version=4)
    finally:
        worker.close()


def test_the_teacher_on_the_students_support_is_the_closed_form_on_both_routes(tiny_model_dir, v0_state):
    """Estimator topk_rkl: the student's top-k ids come from the plain prompt's forward, the
    teacher's log-probs at them from the privileged prompt's, on the same weights; the rollout
    engine and the scorer actor give the same (fp32), and both equal a direct forward."""
    from actors.scorer import TeacherScorerWorker
    from pipeline.algorithm.logprobs import forward_response
    from pipeline.core.types import TeacherNeeds

    plain = [([5, 6, 7, 8, 9], [10, 11, 12]), ([5, 6], [13, 14, 15, 16, 17])]
    items = [([30, 31, 32, *p], r) for p, r in plain]  # the same responses after a privileged prefix
    k = 4
    worker = rollout_worker(tiny_model_dir, "steps3")
    scorer = TeacherScorerWorker(str(tiny_model_dir), temperature=1.0, micro_batch_tokens=64, precision="fp32")
    try:
        a = worker.score(items, plain, TeacherNeeds(support_k=k), min_version=0, micro_batch_tokens=64)
        b = scorer.score(items, plain, TeacherNeeds(support_k=k), min_version=0)
    finally:
        worker.close()
    got = [a.logprobs, a.plain_logprobs, a.topk_ids, a.topk_logprobs]
    want = [b.logprobs, b.plain_logprobs, b.topk_ids, b.topk_logprobs]
    assert a.version == 0
    lpt, lp_plain, ids, at_ids = got
    assert ids == want[2]
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert torch.tensor(x, dtype=torch.float64) == pytest.approx(torch.tensor(y, dtype=torch.float64), abs=1e-5)

    model = load_model(tiny_model_dir, torch.float32, "cpu").eval()

    def log_softmax_rows(pairs):
        out = []
        for p, r in pairs:
            x = torch.tensor([p + r])
            mask = torch.zeros_like(x, dtype=torch.float32)
            mask[0, len(p) :] = 1
            with torch.no_grad():
                fw = forward_response(model, x, torch.ones_like(x), mask, with_entropy=False, with_logits=True)
            out.append(torch.log_softmax(fw.logits, -1))
        return out

    for i, (s, t) in enumerate(zip(log_softmax_rows(plain), log_softmax_rows(items))):
        assert ids[i] == torch.topk(s, k, dim=-1).indices.tolist()
        assert torch.tensor(at_ids[i]) == pytest.approx(t.gather(-1, torch.tensor(ids[i])), abs=1e-5)
        resp = torch.tensor(plain[i][1]).unsqueeze(-1)
        assert torch.tensor(lp_plain[i]) == pytest.approx(s.gather(-1, resp).squeeze(-1), abs=1e-5)
        assert torch.tensor(lpt[i]) == pytest.approx(t.gather(-1, resp).squeeze(-1), abs=1e-5)
