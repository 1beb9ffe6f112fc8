"""GPU basics: the pieces the GPU cluster path stands on, on one CUDA machine.

Run with ``scripts/gpu_check.sh`` (or ``DS_ACCELERATOR=cuda pytest -m gpu tests/gpu -x``). Skipped
without CUDA. Uses the ``tiny_bytes`` model (random 2-layer Llama, byte tokenizer): it is built
locally and needs no network.

1. HFEngine generates on cuda, and its behaviour log-probs match ``forward_response`` on cuda.
2. A LearnerWorker (DeepSpeed, NCCL, world size 1, ZeRO-2, bf16) takes a step on cuda, in a child
   process so that DeepSpeed picks the cuda accelerator whatever the test session set
   (tests/conftest.py defaults DS_ACCELERATOR to cpu): first with the batch moved to the GPU by the
   test, then with the batch as rollout workers send it (CPU tensors), which is the production path.
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
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

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
        resp[b, p: p + r] = 1.0
    behaviour = (-torch.rand(rows, T, generator=g) * 3 - 3) * resp  # about log(1/vocab)
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * resp
    return TrainBatch(input_ids=ids, attention_mask=attn, response_mask=resp,
                      behaviour_logprobs=behaviour, advantages=adv.contiguous(),
                      entropy_coef=0.001, versions=[0] * rows)


def _batch_to(batch, device):
    from dataclasses import replace

    kw = {n: getattr(batch, n).to(device) for n in
          ("input_ids", "attention_mask", "response_mask", "behaviour_logprobs", "advantages")}
    kw["aux"] = {k: v.to(device) for k, v in batch.aux.items()}
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
def test_hf_engine_generates_on_cuda_and_matches_forward_response():
    from actors.engines.hf import HFEngine
    from pipeline.algorithm.logprobs import response_logprobs

    engine = HFEngine.from_pretrained(_model_dir(), dtype="float32", device="cuda")
    assert engine.device.type == "cuda"
    vocab = engine.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 11, 17)]
    gens = engine.generate(prompts, max_new_tokens=16, temperature=1.0, seed=0)
    assert [len(x.token_ids) for x in gens] and all(x.n_tokens >= 1 for x in gens)
    again = engine.generate(prompts, max_new_tokens=16, temperature=1.0, seed=0)
    assert [x.token_ids for x in again] == [x.token_ids for x in gens], "seeded sampling is not reproducible"

    ref = response_logprobs(engine.model, prompts, [x.token_ids for x in gens])  # on cuda
    gap = max((r - torch.tensor(x.logprobs)).abs().max().item() for r, x in zip(ref, gens))
    assert gap <= PARITY_ATOL_FP32, f"behaviour log-probs differ from forward_response by {gap:.2e}"


def test_teacher_scorer_on_cuda_runs_bf16_and_stays_near_the_fp32_learner():
    """The GPU configs give the scorer a GPU at precision auto (bf16 there); its teacher log-probs
    stay within the bf16 gap of the learner's fp32 forward on the same tokens (CPU engines
    measured 0.05 mean, 0.3 max in bf16)."""
    from actors.scorer import TeacherScorerWorker
    from pipeline.algorithm.logprobs import response_logprobs
    from pipeline.models import load_model

    path = _model_dir()
    scorer = TeacherScorerWorker(path, temperature=1.0, micro_batch_tokens=256, precision="auto", device="cuda")
    assert scorer.precision.dtype == "bf16" and next(scorer.model.parameters()).dtype == torch.bfloat16
    vocab = scorer.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    items = [(torch.randint(3, vocab, (p,), generator=g).tolist(), torch.randint(3, vocab, (r,), generator=g).tolist())
             for p, r in ((7, 9), (13, 4), (20, 15))]
    teacher, _ = scorer.score(items)
    ref = response_logprobs(load_model(path, "fp32", "cpu"), [p for p, _ in items], [r for _, r in items])
    gaps = torch.cat([(torch.tensor(t) - r).abs() for t, r in zip(teacher, ref)])
    assert gaps.mean().item() < 0.1 and gaps.max().item() < 1.0, (gaps.mean().item(), gaps.max().item())


# ----- 2. a DeepSpeed learner step on cuda (child process) ---------------------------------------
def _learner_child(rank: int, port: int, model_dir: str, out: str, move_batch: bool) -> None:
    os.environ["DS_ACCELERATOR"] = "cuda"  # before DeepSpeed is imported in this process
    import torch.distributed as dist

    from actors.learner import LearnerWorker, init_process_group_env
    from pipeline.core.config import LearnerConfig

    init_process_group_env(0, 1, "127.0.0.1", port)
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
        "metrics": {k: float(v) for k, v in metrics.items()},
        "changed": sum(before[k] != after[k] for k in before),
        "n_tensors": len(before),
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _run_learner(tmp_path: Path, move_batch: bool) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / f"learner_{int(move_batch)}.json"
    ctx = mp.start_processes(_learner_child, args=(_free_port(), _model_dir(), str(out), move_batch),
                             nprocs=1, join=False, start_method="spawn")
    _join(ctx, "the learner child")
    return json.loads(out.read_text())


def _check_step(r: dict) -> None:
    assert r["backend"] == "nccl", r
    assert r["device"].startswith("cuda"), r
    assert r["param_dtype"] == "torch.bfloat16", r
    assert r["version"] == 1
    m = r["metrics"]
    for key in ("learner/loss", "policy/loss", "policy/entropy", "learner/grad_norm"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), (key, m.get(key))
    assert r["changed"] > 0.5 * r["n_tensors"], f"only {r['changed']} of {r['n_tensors']} tensors moved"


def test_learner_step_on_cuda_nccl_zero2_bf16(tmp_path):
    _check_step(_run_learner(tmp_path, move_batch=True))


def test_learner_step_on_cuda_with_a_cpu_batch(tmp_path):
    """The batch as a rollout worker sends it (CPU tensors): the learner must move it itself."""
    _check_step(_run_learner(tmp_path, move_batch=False))


# ----- 3. a state dict from one process to another -----------------------------------------------
def _bcast_child(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    sd = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(f"cuda:{rank}").state_dict()
    if rank != 0:  # the receiver starts from zeros, so only the broadcast can fill it
        sd = {k: torch.zeros_like(v) for k, v in sd.items()}
    for key in sorted(sd):
        dist.broadcast(sd[key], src=0)
    torch.cuda.synchronize()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(_checksums(sd)))
    dist.destroy_process_group()


@pytest.mark.skipif(CUDA and torch.cuda.device_count() < 2,
                    reason="an NCCL broadcast between two processes needs two GPUs: NCCL refuses two "
                           "ranks on one device ('Duplicate GPU detected'); the CUDA IPC test covers one GPU")
def test_nccl_broadcast_of_a_state_dict_matches_checksums(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_bcast_child, args=(2, _free_port(), _model_dir(), str(tmp_path)),
                             nprocs=2, join=False, start_method="spawn")
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
