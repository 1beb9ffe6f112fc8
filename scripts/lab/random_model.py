"""Random models of SmolLM2's shapes, and a learner of one rank on them, for the benchmarks.

Speed and memory do not depend on the weights' values, and the GPU machines reach no hub and
cannot carry the 98 MB GGUF: so the benchmarks build SmolLM2's architecture with random weights
(seed 0) and the byte tokenizer of ``pipeline.models.tiny``.
"""

from __future__ import annotations

from pathlib import Path

SMOLLM2_VOCAB = 49152
# SmolLM2's sizes: what differs between them (head_dim 64 and the rest are common, below).
SMOLLM2_SIZES = {
    "135m": dict(
        hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30
    ),
    "360m": dict(
        hidden_size=960, intermediate_size=2560, num_attention_heads=15, num_key_value_heads=5, num_hidden_layers=32
    ),
}
_COMMON = dict(
    vocab_size=SMOLLM2_VOCAB,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100_000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def smollm2_config(size: str = "135m", **overrides):
    """A ``LlamaConfig`` of SmolLM2's architecture at ``size``; ``overrides`` (e.g.
    ``num_hidden_layers``, the token ids) win."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**_COMMON, **SMOLLM2_SIZES[size], **overrides})


def build_random_smollm2(out: Path, size: str = "135m", layers: int | None = None) -> int:
    """Save a random fp32 model of SmolLM2's shape (``layers``: another depth) and the byte
    tokenizer to ``out``; returns its parameter count."""
    import torch
    from transformers import LlamaForCausalLM

    from pipeline.models.tiny import byte_tokenizer

    tok = byte_tokenizer()
    depth = {"num_hidden_layers": layers} if layers else {}
    config = smollm2_config(
        size,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
        **depth,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def random_train_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int):
    """A ``TrainBatch`` of random ids whose behaviour log-probs are about log(1/vocab), so that the
    importance ratios stay near 1, and random advantages."""
    import torch

    from pipeline.core.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    T = prompt_len + response_len
    ids = torch.randint(3, vocab, (rows, T), generator=g)
    resp = torch.zeros(rows, T)
    resp[:, prompt_len:] = 1.0
    behaviour = -torch.full((rows, T), 10.8) * resp
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * resp
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones(rows, T, dtype=torch.long),
        response_mask=resp,
        behaviour_logprobs=behaviour,
        advantages=adv.contiguous(),
        entropy_coef=0.001,
        versions=[0] * rows,
    )


def one_rank_learner(path: Path, cfg, total_steps: int):
    """A ``LearnerWorker`` (``cfg``: a LearnerConfig) on the model at ``path``, alone in a process
    group of one rank, set up; returns (worker, its ``setup()`` metrics). One per process:
    DeepSpeed's process group is made once."""
    from actors.learner import LearnerWorker
    from actors.learner_setup import init_process_group_env
    from pipeline.distributed.rendezvous import host_store

    init_process_group_env(0, 1, "127.0.0.1", host_store(300))
    worker = LearnerWorker(cfg, str(path), temperature=1.0, total_steps=total_steps)
    return worker, worker.setup()
