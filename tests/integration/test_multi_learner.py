"""Data parallelism is exact: M=2 learner ranks take the same step as M=1 on the same batch.

Real ``LearnerActor`` Ray actors (DeepSpeed over gloo, fractional CPUs) driven through
``LearnerGroup``, which shards every mini-batch's rows contiguously across the ranks. The learner
divides every micro-batch loss by the token count of the whole mini-batch across ranks (divided by
the world size, because DeepSpeed averages gradients), so the summed gradient is the full-batch
token mean at any M: rank 0's weights after the step must equal the single rank's up to float
reduction order, and so must the step's metrics.

Tolerances. The batch is stepped with two mini-batches (two AdamW updates, lr 1e-3): the first
Adam update is about ``lr * sign(g)``, the second depends on gradient ratios, so a sharding or
accumulation bug (wrong denominator, a rank's rows dropped or counted twice, a micro-batch's
gradient overwritten) moves weights by O(lr). A different float summation order moves a handful
of weights whose gradient is near 0 (Adam divides by ``sqrt(v) + eps``) by a few 1e-3 * lr.
Measured (3.27M weights, largest update 2.0e-3): ZeRO-2 M=2 max 2.1e-6, relative L2 of the update
difference 1.0e-6; ZeRO-3 M=2 max 3.8e-6, 2.1e-6; a lost micro-batch gradient max 4.0e-3, 0.98.
Bounds: every weight within ``2e-2 * lr`` and the update's relative L2 difference below 1e-4.
Metrics: relative 1e-4 (absolute 1e-6).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from actors.handles import LearnerGroup
from pipeline.core.config import LearnerConfig
from pipeline.core.types import TrainBatch

pytestmark = pytest.mark.integration

LR = 1e-3
W_ATOL = 2e-2 * LR
W_REL_L2 = 1e-4
TIMEOUT = 300  # seconds for any one Ray call (actor setup includes a possible shm_comm JIT)
# Metrics that are means/fractions over the step's tokens, or extrema, and must agree at any M.
COMPARED = (
    "learner/loss",
    "policy/loss",
    "policy/entropy",
    "policy/clip_fraction",
    "policy/dual_clip_fraction",
    "policy/approx_kl_k1",
    "policy/approx_kl_k3",
    "policy/ratio_mean",
    "policy/ratio_max",
    "policy/ratio_min",
    "policy/behaviour_weight_mean",
    "policy/behaviour_weight_max",
    "policy/truncated_fraction",
    "learner/grad_norm",
)
TIMINGS: dict[str, float] = {}


def _make_batch(model_dir, seed: int = 0, rows: int = 8) -> TrainBatch:
    """Random prompts and responses over the model's vocab, right-padded; behaviour log-probs are
    the model's own plus noise (so ratios are near 1 and some tokens clip); one advantage per row."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.algorithm.logprobs import forward_response

    g = torch.Generator().manual_seed(seed)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    prompt_len = torch.randint(6, 20, (rows,), generator=g)
    resp_len = torch.randint(3, 16, (rows,), generator=g)
    T = int((prompt_len + resp_len).max())
    ids = torch.zeros(rows, T, dtype=torch.long)
    attn = torch.zeros(rows, T, dtype=torch.long)
    resp = torch.zeros(rows, T, dtype=torch.float32)
    for b in range(rows):
        p, r = int(prompt_len[b]), int(resp_len[b])
        ids[b, : p + r] = torch.randint(0, vocab, (p + r,), generator=g)
        attn[b, : p + r] = 1
        resp[b, p : p + r] = 1.0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = forward_response(model, ids, attn, resp, with_entropy=False).logprobs
    behaviour = (lp + 0.3 * torch.randn(lp.shape, generator=g)) * resp
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * resp
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=behaviour.contiguous(),
        advantages=adv.contiguous(),
        entropy_coef=0.001,
        versions=[0] * rows,
    )


def _cfg(zero_stage: int, budget: int = 8) -> LearnerConfig:
    # By default a micro-batch budget below every row's length: each row is a micro-batch of its
    # own, so every rank accumulates over several micro-batches per mini-batch (and ZeRO-3's
    # accumulation counts).
    return LearnerConfig(
        zero_stage=zero_stage, precision="fp32", lr=LR, grad_clip=1.0, micro_batch_tokens=budget, num_cpus=0.5
    )


def _uneven_batch(model_dir) -> TrainBatch:
    """Per mini-batch of 4 rows, rank 0's two rows are long (40 tokens: one micro-batch each under
    a 48-token budget) and rank 1's two are short (12 tokens: one micro-batch together), so the
    ranks cut different numbers of micro-batches."""
    g = torch.Generator().manual_seed(2)
    lengths = [(30, 10), (28, 12), (8, 4), (7, 5)] * 2
    T = 40
    ids = torch.zeros(8, T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(8, T)
    for b, (p, r) in enumerate(lengths):
        ids[b, : p + r] = torch.randint(0, 500, (p + r,), generator=g)
        attn[b, : p + r] = 1
        resp[b, p : p + r] = 1.0
    adv = torch.randn(8, 1, generator=g).expand(8, T) * resp
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=(-2.0 * resp).contiguous(),
        advantages=adv.contiguous(),
        entropy_coef=0.001,
        versions=[0] * 8,
    )


def _step(ray, model_dir, batch: TrainBatch, *, world_size: int, zero_stage: int, budget: int = 8):
    """Start ``world_size`` learner actors, take one train_step on two mini-batches through
    LearnerGroup, return (metrics, rank-0 weights); always kill the actors."""
    from actors.learner_actor import LearnerActor
    from pipeline.core.microbatch import slice_rows

    cls = ray.remote(LearnerActor)
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    t0 = time.time()
    ranks = [
        cls.options(num_cpus=0.5, runtime_env=env).remote(
            _cfg(zero_stage, budget),
            str(model_dir),
            temperature=1.0,
            total_steps=10,
            rank=r,
            world_size=world_size,
            seed=0,
        )
        for r in range(world_size)
    ]
    try:
        # The production rendezvous: rank 0 binds the store, every rank joins it.
        host, port = ray.get(ranks[0].node_address.remote(), timeout=TIMEOUT)
        ray.get([rk.setup.remote(host, port) for rk in ranks], timeout=TIMEOUT)
        ray.get([rk.ping.remote() for rk in ranks], timeout=TIMEOUT)
        t1 = time.time()
        group = LearnerGroup(ranks, pad_id=0)
        half = batch.n_rows // 2
        minibatches = [slice_rows(batch, 0, half), slice_rows(batch, half, batch.n_rows)]
        metrics = asyncio.run(asyncio.wait_for(group.train_step(minibatches), TIMEOUT))
        t2 = time.time()
        packets = ray.get([rk.weight_packet.remote(2) for rk in ranks], timeout=TIMEOUT)
        TIMINGS[f"ws{world_size}_zero{zero_stage}_b{budget}"] = t2 - t1
        TIMINGS[f"ws{world_size}_zero{zero_stage}_b{budget}_setup"] = t1 - t0
        return metrics, packets[0].state_dict
    finally:
        for rk in ranks:
            ray.kill(rk)


@pytest.fixture(scope="module")
def batch(tiny_model_dir) -> TrainBatch:
    return _make_batch(tiny_model_dir)


@pytest.fixture(scope="module")
def single(ray_local, tiny_model_dir, batch):
    """The M=1 reference (ZeRO-2 at world size 1) and the initial weights."""
    from safetensors.torch import load_file

    metrics, sd = _step(ray_local, tiny_model_dir, batch, world_size=1, zero_stage=2)
    init = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    return metrics, sd, init


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def double(request, ray_local, tiny_model_dir, batch):
    """M=2 under ZeRO-2 and ZeRO-3 (rank 0's weights are consolidated under ZeRO-3)."""
    return _step(ray_local, tiny_model_dir, batch, world_size=2, zero_stage=request.param)


def test_two_ranks_take_the_same_step_as_one(single, double):
    _, sd1, init = single
    _, sd2 = double
    assert set(sd1) == set(sd2)
    moved = max((sd1[k] - init[k]).abs().max().item() for k in init if k in sd1)
    assert moved > 0.5 * LR, f"the reference step barely moved the weights ({moved:.2e})"
    worst = {k: (sd2[k].float() - sd1[k].float()).abs().max().item() for k in sd1}
    name, err = max(worst.items(), key=lambda kv: kv[1])
    assert err <= W_ATOL, f"M=2 weights differ from M=1 by {err:.3e} in {name} (tol {W_ATOL:.1e})"
    keys = [k for k in init if k in sd1]
    d1 = torch.cat([(sd1[k].float() - init[k]).flatten() for k in keys])
    d2 = torch.cat([(sd2[k].float() - init[k]).flatten() for k in keys])
    rel = ((d2 - d1).norm() / d1.norm()).item()
    assert rel <= W_REL_L2, f"M=2 update differs from M=1's by {rel:.2e} relative L2 (tol {W_REL_L2:.0e})"


def test_two_ranks_report_the_same_metrics_as_one(single, double):
    """LearnerGroup's metrics are the whole batch's (token means over all ranks' tokens, extrema
    over all ranks, the token count summed), not rank 0's share."""
    metrics1, metrics2 = single[0], double[0]
    bad = {
        k: (metrics1[k], metrics2.get(k))
        for k in COMPARED
        if metrics2.get(k) is None or metrics2[k] != pytest.approx(metrics1[k], rel=1e-4, abs=1e-6)
    }
    assert not bad, f"metrics differ between M=1 and M=2 as (M=1, M=2): {bad}"
    assert metrics2["learner/tokens"] == metrics1["learner/tokens"]


def _assert_same_step(sd1, sd2, init) -> None:
    moved = max((sd1[k] - init[k]).abs().max().item() for k in init if k in sd1)
    assert moved > 0.5 * LR, f"the reference step barely moved the weights ({moved:.2e})"
    worst = {k: (sd2[k].float() - sd1[k].float()).abs().max().item() for k in sd1}
    name, err = max(worst.items(), key=lambda kv: kv[1])
    assert err <= W_ATOL, f"M=2 weights differ from M=1 by {err:.3e} in {name} (tol {W_ATOL:.1e})"


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_ranks_with_different_micro_batch_counts_take_the_same_step_as_one(ray_local, tiny_model_dir, zero_stage):
    """Rows of very different lengths: rank 0 cuts 2 micro-batches per mini-batch, rank 1 one. The
    ranks pad to the same count (ZeRO-2 reduces and ZeRO-3 gathers inside every backward and
    forward: unequal counts abort with a collective mismatch on gloo and hang on NCCL)."""
    from safetensors.torch import load_file

    from pipeline.core.microbatch import slice_rows, split_by_tokens, split_rows

    batch = _uneven_batch(tiny_model_dir)
    shards = split_rows(slice_rows(batch, 0, batch.n_rows // 2), 2)
    assert [len(split_by_tokens(s, 48)) for s in shards] == [2, 1]
    _, sd1 = _step(ray_local, tiny_model_dir, batch, world_size=1, zero_stage=zero_stage, budget=48)
    _, sd2 = _step(ray_local, tiny_model_dir, batch, world_size=2, zero_stage=zero_stage, budget=48)
    init = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    _assert_same_step(sd1, sd2, init)


def teardown_module(module):  # report the measured step times with -s / -rA
    if TIMINGS:
        print("\nlearner step seconds:", {k: round(v, 2) for k, v in TIMINGS.items()})
