"""GPU basics: the pieces the GPU cluster path stands on, on one CUDA machine.

Run with ``scripts/gpu_check.sh`` (or ``DS_ACCELERATOR=cuda pytest -m gpu tests/gpu -x``). Uses
the ``tiny_bytes`` model (random 2-layer Llama, byte tokenizer): it is built locally and needs no
network. Tests 1 and 2 also run on ``cpu`` in every CPU suite (those cases carry no ``gpu`` mark):
the GPU machine is lent rarely, and code that only runs there rots unseen (two API changes had
broken this file before its first run on a GPU).

1. HFEngine generates on the device, and its behaviour log-probs match ``forward_response``; the
   teacher scorer at precision auto stays near the fp32 forward.
2. A LearnerWorker (DeepSpeed, NCCL on cuda / gloo on cpu, world size 1, ZeRO-2, bf16) takes a
   step, in a child process so that DeepSpeed picks the accelerator whatever the test session set
   (tests/conftest.py defaults DS_ACCELERATOR to cpu): with the batch on the device, and on cuda
   also with the batch as rollout workers send it (CPU tensors), which is the production path.
   Then, at ZeRO-2 and ZeRO-3, the reference KL, the learner-side teacher of ``full_kl`` and a
   checkpoint that loads back bit-exactly.
3. Moving a state dict between two processes with checksums: an NCCL broadcast from rank 0 to
   rank 1 needs two GPUs (NCCL refuses two ranks on one device: "Duplicate GPU detected"), so with
   one GPU the second process receives the tensors through CUDA IPC (torch.multiprocessing), the
   route a colocated rollout engine would take.

Tolerances: fp32 log-prob parity 1e-3 absolute (the CPU test measures about 1e-6 and bounds it by
1e-4; the KV-cached decode and the full forward may pick different CUDA kernels); checksums are
float64 sums of every tensor and must match exactly after a bit-exact transfer.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
NEEDS_CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]
ON_EACH_DEVICE = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])

PARITY_ATOL_FP32 = 1e-3
CHILD_TIMEOUT = 240  # seconds for one child process (DeepSpeed import + init + one step)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir() -> str:
    from pipeline.models import resolve_model

    return str(resolve_model("tiny_bytes"))


def _checksums(sd: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v.detach().double().sum().item()) for k, v in sd.items()}


def _random_batch(vocab: int, rows: int = 4, seed: int = 0):
    """A TrainBatch of random prompt + response ids (CPU tensors, right-padded)."""
    from pipeline.core.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(4, 12, (rows,), generator=g)
    r_len = torch.randint(3, 10, (rows,), generator=g)
    T = int((p_len + r_len).max())
    ids = torch.zeros(rows, T, dtype=torch.long)
    attn = torch.zeros(rows, T, dtype=torch.long)
    resp = torch.zeros(rows, T)
    for b in range(rows):
        p, r = int(p_len[b]), int(r_len[b])
        ids[b, : p + r] = torch.randint(3, vocab, (p + r,), generator=g)
        attn[b, : p + r] = 1
        resp[b, p : p + r] = 1.0
    behaviour = (-torch.rand(rows, T, generator=g) * 3 - 3) * resp  # about log(1/vocab)
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * resp
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        behaviour_logprobs=behaviour,
        advantages=adv.contiguous(),
        entropy_coef=0.001,
        versions=[0] * rows,
    )


def _batch_to(batch, device):
    from dataclasses import replace

    kw = {
        n: getattr(batch, n).to(device)
        for n in ("input_ids", "attention_mask", "response_mask", "behaviour_logprobs", "advantages")
    }
    kw["distill"] = batch.distill.map(lambda v: v.to(device))
    return replace(batch, **kw)


def _join(ctx, what: str) -> None:
    """Wait for every child of a torch.multiprocessing context; a child's exception is re-raised
    here with its traceback (ProcessRaisedException); past CHILD_TIMEOUT they are killed."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{what} did not finish within {CHILD_TIMEOUT} s")


# ----- 1. the HF engine on cuda ------------------------------------------------------------------
@ON_EACH_DEVICE
def test_hf_engine_generates_and_matches_forward_response(device):
    from actors.engines.hf import HFEngine
    from pipeline.algorithm.logprobs import response_logprobs

    engine = HFEngine.from_pretrained(_model_dir(), dtype="float32", device=device)
    assert engine.device.type == device
    vocab = engine.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 11, 17)]
    gens = engine.generate(prompts, max_new_tokens=16, temperature=1.0, seed=0)
    assert [len(x.token_ids) for x in gens] and all(x.n_tokens >= 1 for x in gens)
    again = engine.generate(prompts, max_new_tokens=16, temperature=1.0, seed=0)
    assert [x.token_ids for x in again] == [x.token_ids for x in gens], "seeded sampling is not reproducible"

    ref = response_logprobs(engine.model, prompts, [x.token_ids for x in gens])  # on the engine's device
    gap = max((r - torch.tensor(x.logprobs)).abs().max().item() for r, x in zip(ref, gens))
    assert gap <= PARITY_ATOL_FP32, f"behaviour log-probs differ from forward_response by {gap:.2e}"


@ON_EACH_DEVICE
def test_teacher_scorer_at_auto_precision_stays_near_the_fp32_learner(device):
    """The GPU configs give the scorer a GPU at precision auto (bf16 there; on a CPU bf16 only
    where it is native); its teacher log-probs stay within the bf16 gap of the learner's fp32
    forward on the same tokens (CPU engines measured 0.05 mean, 0.3 max in bf16)."""
    from actors.scorer import TeacherScorerWorker
    from pipeline.algorithm.logprobs import response_logprobs
    from pipeline.core.hardware import choose_precision
    from pipeline.core.types import TeacherNeeds
    from pipeline.models import as_torch_dtype, load_model

    path = _model_dir()
    scorer = TeacherScorerWorker(path, temperature=1.0, micro_batch_tokens=256, precision="auto", device=device)
    want = "bf16" if device == "cuda" else choose_precision("auto", "cpu").dtype
    assert scorer.precision.dtype == want
    assert next(scorer.model.parameters()).dtype == as_torch_dtype(want)
    vocab = scorer.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    items = [
        (torch.randint(3, vocab, (p,), generator=g).tolist(), torch.randint(3, vocab, (r,), generator=g).tolist())
        for p, r in ((7, 9), (13, 4), (20, 15))
    ]
    teacher = scorer.score(items, [], TeacherNeeds()).logprobs
    ref = response_logprobs(load_model(path, "fp32", "cpu"), [p for p, _ in items], [r for _, r in items])
    gaps = torch.cat([(torch.tensor(t) - r).abs() for t, r in zip(teacher, ref)])
    assert gaps.mean().item() < 0.1 and gaps.max().item() < 1.0, (gaps.mean().item(), gaps.max().item())


# ----- 2. a DeepSpeed learner step (child process) ------------------------------------------------
def _learner_child(rank: int, device: str, model_dir: str, out: str, move_batch: bool) -> None:
    os.environ["DS_ACCELERATOR"] = device  # before DeepSpeed is imported in this process
    import torch.distributed as dist

    from actors.learner import LearnerWorker
    from actors.learner_setup import init_process_group_env
    from pipeline.core.config import LearnerConfig
    from pipeline.distributed.rendezvous import host_store

    init_process_group_env(0, 1, "127.0.0.1", host_store(CHILD_TIMEOUT))
    cfg = LearnerConfig(zero_stage=2, precision="bf16", lr=1e-3, micro_batch_tokens=32)
    worker = LearnerWorker(cfg, model_dir, temperature=1.0, total_steps=2)
    worker.setup()
    before = _checksums(worker.state_dict_for_sync())
    batch = _random_batch(worker.module.config.vocab_size)
    if move_batch:
        batch = _batch_to(batch, worker.engine.device)
    metrics = worker.train_step([batch])
    after = _checksums(worker.state_dict_for_sync())
    result = {
        "backend": dist.get_backend(),
        "device": str(worker.engine.device),
        "param_dtype": str(next(worker.module.parameters()).dtype),
        "version": worker.version,
        "metrics": {k: float(value) for k, (value, _reduce) in metrics.items()},
        "changed": sum(before[k] != after[k] for k in before),
        "n_tensors": len(before),
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _run_learner(tmp_path: Path, device: str, move_batch: bool) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / f"learner_{device}_{int(move_batch)}.json"
    ctx = mp.start_processes(
        _learner_child, args=(device, _model_dir(), str(out), move_batch), nprocs=1, join=False, start_method="spawn"
    )
    _join(ctx, "the learner child")
    return json.loads(out.read_text())


def _check_step(r: dict, device: str) -> None:
    assert r["backend"] == ("nccl" if device == "cuda" else "gloo"), r
    assert r["device"].startswith(device), r
    assert r["param_dtype"] == "torch.bfloat16", r
    assert r["version"] == 1
    m = r["metrics"]
    for key in ("learner/loss", "policy/loss", "policy/entropy", "learner/grad_norm"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), (key, m.get(key))
    assert r["changed"] > 0.5 * r["n_tensors"], f"only {r['changed']} of {r['n_tensors']} tensors moved"


@ON_EACH_DEVICE
def test_learner_step_zero2_bf16(tmp_path, device):
    """NCCL on a GPU, gloo on a CPU; the batch already on the learner's device."""
    _check_step(_run_learner(tmp_path, device, move_batch=True), device)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=NEEDS_CUDA)])
def test_learner_step_on_cuda_with_a_cpu_batch(tmp_path, device):
    """The batch as a rollout worker sends it (CPU tensors): the learner must move it itself."""
    _check_step(_run_learner(tmp_path, device, move_batch=False), device)


def _hinted_batch(vocab: int, rows: int = 4, seed: int = 0):
    """``_random_batch`` plus what a learner-side teacher reads (hint_distill's ``full_kl``): each
    row's response after a longer, privileged prompt, right-padded, marking the same tokens."""
    from dataclasses import replace

    from pipeline.core.types import AuxTerm

    batch = _random_batch(vocab, rows, seed)
    g = torch.Generator().manual_seed(seed + 100)
    seqs, masks = [], []
    for b in range(rows):
        n = int(batch.attention_mask[b].sum())
        resp = batch.response_mask[b, :n].bool()
        hint = torch.randint(3, vocab, (5,), generator=g)
        seqs.append(torch.cat([hint, batch.input_ids[b, :n]]))
        masks.append(torch.cat([torch.zeros(5), resp.float()]))
    T = max(len(x) for x in seqs)
    ids, attn, mask = (
        torch.zeros(rows, T, dtype=torch.long),
        torch.zeros(rows, T, dtype=torch.long),
        torch.zeros(rows, T),
    )
    for b, (x, m) in enumerate(zip(seqs, masks)):
        ids[b, : len(x)], attn[b, : len(x)], mask[b, : len(x)] = x, 1, m
    return replace(
        batch,
        teacher_input_ids=ids,
        teacher_attention_mask=attn,
        teacher_response_mask=mask,
        aux_terms=[AuxTerm(name="sd", kind="full_kl", coef=0.1)],
    )


def _resume_child(rank: int, device: str, zero: int, model_dir: str, ckpt: str, out: str) -> None:
    os.environ["DS_ACCELERATOR"] = device  # before DeepSpeed is imported in this process
    import torch.distributed as dist

    from actors.learner import LearnerWorker
    from actors.learner_setup import init_process_group_env
    from pipeline.core.config import LearnerConfig
    from pipeline.distributed.rendezvous import host_store

    init_process_group_env(0, 1, "127.0.0.1", host_store(CHILD_TIMEOUT))
    cfg = LearnerConfig(zero_stage=zero, precision="bf16", lr=1e-3, micro_batch_tokens=32, kl_coef=0.05)
    worker = LearnerWorker(cfg, model_dir, temperature=1.0, total_steps=4)
    worker.setup()
    batch = _hinted_batch(worker.module.config.vocab_size)
    metrics = worker.train_step([batch])
    worker.save_checkpoint(ckpt)
    saved = _checksums(worker.state_dict_for_sync())
    worker.train_step([_hinted_batch(worker.module.config.vocab_size, seed=1)])  # moves away from the save
    moved = _checksums(worker.state_dict_for_sync())
    version = worker.load_checkpoint(ckpt)
    result = {
        "metrics": {k: float(value) for k, (value, _reduce) in metrics.items()},
        "device": str(worker.engine.device),
        "ref_device": str(next(worker.ref_model.parameters()).device),
        "version": version,
        "saved": saved,
        "moved": moved,
        "loaded": _checksums(worker.state_dict_for_sync()),
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


@ON_EACH_DEVICE
@pytest.mark.parametrize("zero", [2, 3])
def test_learner_reference_kl_learner_side_teacher_and_checkpoint_resume(tmp_path, device, zero):
    """What a GPU cluster run adds to the plain step: the k3 KL to a reference model on the
    learner's device, the learner-side teacher forward of ``full_kl`` (hint_distill), ZeRO-3's
    gathered weights, and a checkpoint that loads back bit-exactly, with an HF export that
    transformers loads to the same weights."""
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    out, ckpt = tmp_path / "resume.json", tmp_path / "ckpt"
    ctx = mp.start_processes(
        _resume_child,
        args=(device, zero, _model_dir(), str(ckpt), str(out)),
        nprocs=1,
        join=False,
        start_method="spawn",
    )
    _join(ctx, "the resume child")
    r = json.loads(out.read_text())
    assert r["device"].startswith(device) and r["ref_device"].startswith(device), r
    m = r["metrics"]
    for key in ("policy/ref_kl_ref", "sd/kl", "learner/loss", "learner/grad_norm"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), (key, sorted(m))
    assert m["sd/kl"] > 0, "the hinted teacher's distribution differs from the student's on random rows"
    assert r["version"] == 1
    assert r["moved"] != r["saved"], "the second step did not move the weights: the resume check proves nothing"
    assert r["loaded"] == r["saved"]
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "hf", dtype=torch.bfloat16).state_dict()
    exported = _checksums({k: v for k, v in hf.items() if k in r["saved"]})
    assert exported == {k: r["saved"][k] for k in exported} and len(exported) == len(r["saved"])


# ----- 3. a state dict from one process to another -----------------------------------------------
def _bcast_child(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    sd = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(f"cuda:{rank}").state_dict()
    if rank != 0:  # the receiver starts from zeros, so only the broadcast can fill it
        sd = {k: torch.zeros_like(v) for k, v in sd.items()}
    for key in sorted(sd):
        dist.broadcast(sd[key], src=0)
    torch.cuda.synchronize()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(_checksums(sd)))
    dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.skipif(
    CUDA and torch.cuda.device_count() < 2,
    reason="an NCCL broadcast between two processes needs two GPUs: NCCL refuses two "
    "ranks on one device ('Duplicate GPU detected'); the CUDA IPC test covers one GPU",
)
def test_nccl_broadcast_of_a_state_dict_matches_checksums(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _bcast_child, args=(2, _free_port(), _model_dir(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    _join(ctx, "the broadcast children")
    sent = json.loads((tmp_path / "rank0.json").read_text())
    got = json.loads((tmp_path / "rank1.json").read_text())
    assert got == sent
    assert any(v != 0.0 for v in got.values())


def _ipc_child(inbox, outbox) -> None:
    sd = inbox.get(timeout=CHILD_TIMEOUT)  # CUDA tensors arrive as IPC handles, no copy
    assert all(v.is_cuda for v in sd.values())
    outbox.put(_checksums({k: v.clone() for k, v in sd.items()}))
    inbox.get(timeout=CHILD_TIMEOUT)  # hold the handles until the parent has read the result


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_ipc_state_dict_to_a_second_process_matches_checksums():
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    sd = AutoModelForCausalLM.from_pretrained(_model_dir(), dtype=torch.float32).cuda().state_dict()
    sd = {k: v.detach() for k, v in sd.items()}
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_child, args=(inbox, outbox))
    proc.start()
    try:
        inbox.put(sd)
        got = outbox.get(timeout=CHILD_TIMEOUT)
        inbox.put("done")
        proc.join(timeout=60)
    finally:
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert got == _checksums(sd)
