"""GPU scale-out pieces on one CUDA machine (``scripts/gpu_check.sh``); test 1 also runs on cpu.

1. The collective weight sync (pipeline/distributed/collective_sync.py) with buffers on cuda: over NCCL
   between two processes on two GPUs; with one GPU (NCCL refuses two ranks on one device) over
   gloo with CUDA tensors, which runs the same bucketing, device placement and trailer check.
2. The vLLM engine on cuda, if vLLM is installed: processed log-probs equal ``forward_response``
   on cuda, in-place reloads with the prefix cache reset, sleep mode frees memory.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
NEEDS_CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

CHILD_TIMEOUT = 240
PARITY_ATOL_FP32 = 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir() -> str:
    from pipeline.models import resolve_model

    return str(resolve_model("tiny_bytes"))


# ----- 1. collective weight sync on cuda ---------------------------------------------------------
def _sync_child(rank: int, world: int, port: int, backend: str, where: str, model_dir: str, out_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from pipeline.distributed.collective_sync import broadcast_state_dict, init_group, meta_of, receive_state_dict

    if where == "cuda":
        gpu = rank if backend == "nccl" else 0
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)
    else:
        device = torch.device("cpu")
    sd = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).state_dict()
    meta = meta_of(sd)
    group = init_group("127.0.0.1", port, rank, world, backend, timeout_s=CHILD_TIMEOUT)
    out = {}
    for version in (1, 2):  # two syncs: buffers are not reused across syncs
        if rank == 0:
            sent = {k: (v + version).to(device) for k, v in sd.items()}
            out[f"stats{version}"] = broadcast_state_dict(group, sent, version, 1 << 16, device=device)
            got = sent
        else:
            got = receive_state_dict(group, meta, version, 1 << 16, device=device)
            out[f"on_device{version}"] = all(v.device.type == where for v in got.values())
        out[f"sums{version}"] = {k: float(v.double().sum()) for k, v in got.items()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
def test_collective_weight_sync_with_device_buffers(tmp_path, where):
    """Buffers on the GPU (NCCL with two GPUs, else gloo over CUDA tensors); the cpu case runs in
    every CPU suite so that this code cannot rot between GPU leases."""
    import time

    import torch.multiprocessing as mp

    backend = "nccl" if where == "cuda" and torch.cuda.device_count() >= 2 else "gloo"
    ctx = mp.start_processes(
        _sync_child,
        args=(2, _free_port(), backend, where, _model_dir(), str(tmp_path)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the sync children did not finish within {CHILD_TIMEOUT} s")
    sender = json.loads((tmp_path / "rank0.json").read_text())
    receiver = json.loads((tmp_path / "rank1.json").read_text())
    for v in (1, 2):
        assert receiver[f"on_device{v}"]
        assert receiver[f"sums{v}"] == sender[f"sums{v}"]
        assert sender[f"stats{v}"]["buckets"] > 1
    print(f"backend={backend}: {sender['stats2']}")


# ----- 2. vLLM on cuda ---------------------------------------------------------------------------
def _chat(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_vllm_engine_on_cuda_parity_reload_and_sleep():
    pytest.importorskip("vllm")
    from actors.engines.vllm import VLLMEngine
    from pipeline.algorithm.logprobs import response_logprobs
    from pipeline.models import load_model, resolve_model

    path = resolve_model("tiny")  # SmolLM2's tokenizer and chat template, head_dim 32
    eng = VLLMEngine(path, dtype="fp32", max_model_len=1024, gpu_memory_utilization=0.3, enable_sleep_mode=True)
    hf = load_model(path, "float32", "cuda")
    prompts = [_chat(eng.tokenizer, q) for q in ("hi", "put a mug on the table " * 30)]

    def gap(gens, temperature):
        ref = response_logprobs(hf, prompts, [g.token_ids for g in gens], temperature=temperature)
        return max((r - torch.tensor(g.logprobs)).abs().max().item() for r, g in zip(ref, gens))

    gens = eng.generate(prompts, max_new_tokens=16, temperature=0.7, seed=1)
    assert gap(gens, 0.7) < PARITY_ATOL_FP32
    g = torch.Generator().manual_seed(0)
    new = {k: v.detach().cpu() + 0.05 * torch.randn(v.shape, generator=g) for k, v in hf.state_dict().items()}
    if "lm_head.weight" in new:
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    eng.load_state_dict(new, version=1)
    hf.load_state_dict(new)
    gens = eng.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2)
    assert gap(gens, 1.0) < PARITY_ATOL_FP32, "weights not reloaded, or stale prefix-cache KV"
    free_awake = torch.cuda.mem_get_info()[0]
    eng.sleep()
    free_asleep = torch.cuda.mem_get_info()[0]
    eng.wake_up()
    print(f"sleep freed {(free_asleep - free_awake) / 2**30:.2f} GiB")
    assert free_asleep > free_awake
    again = eng.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2)
    assert [x.token_ids for x in again] == [x.token_ids for x in gens]
