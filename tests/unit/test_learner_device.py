"""The learner's GPU-facing pieces that can be checked on a CPU: the DeepSpeed config's offload
sections, moving a TrainBatch to the engine's device, and when DS_ACCELERATOR=cpu is forced."""

from __future__ import annotations

import pytest
import torch

from actors.learner_setup import ds_config, make_optimizer
from pipeline.core.config import LearnerConfig
from pipeline.core.microbatch import to_device
from pipeline.core.types import AuxTerm, Distill, TrainBatch


def test_ds_config_offloads_only_what_is_asked():
    base = ds_config(LearnerConfig(zero_stage=2), "fp32")["zero_optimization"]
    assert base == {"stage": 2}
    opt = ds_config(LearnerConfig(zero_stage=2, offload_optimizer=True), "fp32")["zero_optimization"]
    assert opt["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in opt
    both = ds_config(LearnerConfig(zero_stage=3, offload_optimizer=True, offload_params=True), "bf16")
    assert both["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}


def _adam_run(cfg: LearnerConfig, steps: int = 3) -> tuple[torch.optim.Optimizer, torch.Tensor]:
    """``steps`` AdamW updates of one parameter under seeded gradients."""
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(1000, generator=g))
    opt = make_optimizer(cfg, [p])
    for _ in range(steps):
        p.grad = torch.randn(1000, generator=g)
        opt.step()
    return opt, p.detach()


def test_the_fused_adamw_is_the_loops_update():
    """learner.fused_optimizer (default) runs torch's fused AdamW: one pass per element, none of
    the loop's full-size temporaries (the loop's sqrt and division each allocate a copy of the fp32
    master, about 1 GB at a 135M model's step). The same update to float rounding."""
    cfg = LearnerConfig(lr=1e-2, weight_decay=0.1)
    fused, p_fused = _adam_run(cfg)
    loop, p_loop = _adam_run(LearnerConfig(lr=1e-2, weight_decay=0.1, fused_optimizer=False))
    assert fused.defaults["fused"] is True and not loop.defaults["fused"] and not loop.defaults["foreach"]
    assert torch.allclose(p_fused, p_loop, rtol=0, atol=1e-6)
    assert not torch.equal(p_fused, _adam_run(cfg, steps=0)[1])  # the steps moved it


def _batch(teacher: bool) -> TrainBatch:
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    attn = (ids > 0).long()
    resp = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)
    kw = {}
    if teacher:
        kw = dict(
            teacher_input_ids=ids.clone(), teacher_attention_mask=attn.clone(), teacher_response_mask=resp.clone()
        )
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=torch.zeros(2, 4),
        advantages=torch.ones(2, 4),
        distill=Distill(teacher_logprobs=torch.zeros(2, 4)),
        aux_terms=[AuxTerm(name="x", kind="k3_is", coef=1.0)],
        versions=[0, 1],
        **kw,
    )


def test_to_device_moves_every_tensor_and_keeps_the_rest():
    for teacher in (False, True):
        b = _batch(teacher)
        assert to_device(b, "cpu") is b and to_device(b, torch.device("cpu", 0)) is b
        m = to_device(b, "meta")  # a second device that exists on every machine
        tensors = [
            m.input_ids,
            m.attention_mask,
            m.response_mask,
            m.behaviour_logprobs,
            m.advantages,
            *m.distill.present().values(),
        ]
        if teacher:
            tensors += [m.teacher_input_ids, m.teacher_attention_mask, m.teacher_response_mask]
        else:
            assert m.teacher_input_ids is None
        assert all(t.device.type == "meta" for t in tensors)
        assert m.aux_terms == b.aux_terms and m.versions == b.versions
        assert b.input_ids.device.type == "cpu"  # the original is untouched


def test_ds_accelerator_is_forced_to_cpu_only_without_cuda(monkeypatch):
    from pipeline.core.runtime_env import runtime_env_defaults

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    if torch.cuda.is_available():
        assert "DS_ACCELERATOR" not in runtime_env_defaults()
    else:
        assert runtime_env_defaults()["DS_ACCELERATOR"] == "cpu"


def test_lr_schedule_spans_every_optimizer_step_when_a_step_has_several_mini_batches():
    from actors.learner_setup import lr_lambda

    total, k = 4, 2  # 4 training steps of 2 mini-batches = 8 optimizer steps
    cosine = lr_lambda(LearnerConfig(lr_schedule="cosine", mini_batches=k), total)
    lrs = [cosine(i) for i in range(total * k)]
    assert lrs[0] == 1.0 and lrs[total * k // 2] == pytest.approx(0.5)  # halfway through the run
    assert all(a > b for a, b in zip(lrs, lrs[1:])) and lrs[-1] > 0  # 0 only after the last step
    one = lr_lambda(LearnerConfig(lr_schedule="cosine", mini_batches=1), total)
    assert [cosine(2 * i) for i in range(total)] == pytest.approx([one(i) for i in range(total)])
    warm = lr_lambda(LearnerConfig(warmup_steps=2, mini_batches=k), total)
    assert [warm(i) for i in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


@pytest.mark.parametrize("shared_tokens", [0, 1024])
def test_the_learners_forward_carries_the_head_chunk(shared_tokens):
    """learner.head_chunk_tokens reaches the forward the learner runs, shared or row by row (what
    the chunks give is tested in tests/unit/test_logprobs.py and test_learner_step.py)."""
    from actors.learner import LearnerWorker

    cfg = LearnerConfig(head_chunk_tokens=16, shared_tokens=shared_tokens)
    worker = LearnerWorker(cfg, "unused", temperature=1.0, total_steps=1)
    assert worker._forward.keywords["head_chunk"] == 16
