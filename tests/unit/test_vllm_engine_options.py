"""``rollout.vllm`` reaches the vLLM engine through one mapping (``VLLMEngine.from_options``), read
by the rollout's engines and the scorer's. A recording subclass stands in for the engine (no vLLM
in this venv): only the mapping is under test."""

from __future__ import annotations

import dataclasses
import inspect

from actors.engines.vllm import VLLMEngine
from pipeline.core.schema import VLLMConfig


class RecordingEngine(VLLMEngine):
    def __init__(self, model_path, **kwargs):  # records instead of starting vLLM
        self.model_path, self.kwargs = model_path, kwargs


def test_every_option_but_the_resolved_length_and_the_batching_mode_reaches_the_engine():
    opts = VLLMConfig(tensor_parallel_size=2, gpu_memory_utilization=0.3, max_model_len=999, kv_cache_gb=3.5)
    eng = RecordingEngine.from_options("/m", opts, dtype="bf16", max_model_len=640, chat_template="t")
    assert eng.model_path == "/m"
    assert eng.kwargs == {
        "dtype": "bf16",
        "max_model_len": 640,  # the caller's resolved length, not the option's
        "chat_template": "t",
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "enable_sleep_mode": False,
        "in_process": True,
        "kv_cache_gb": 3.5,
    }


def test_what_a_caller_fixes_wins_over_the_options():
    opts = VLLMConfig(tensor_parallel_size=4, in_process=False, enable_sleep_mode=True)
    fixed = {"in_process": True, "tensor_parallel_size": 1, "enable_sleep_mode": False}
    eng = RecordingEngine.from_options("/m", opts, dtype="fp32", max_model_len=64, **fixed)
    assert {k: eng.kwargs[k] for k in fixed} == fixed


def test_every_engine_option_is_a_parameter_of_the_engine():
    params = inspect.signature(VLLMEngine.__init__).parameters
    missing = [f.name for f in dataclasses.fields(VLLMConfig) if f.name not in params and f.name != "continuous"]
    assert not missing, f"VLLMConfig fields the engine does not take: {missing}"
