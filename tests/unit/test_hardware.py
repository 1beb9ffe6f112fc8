"""The precision decision (``pipeline.core.hardware``) for both kinds of CPU, by injecting what the
hardware reports, and the thread count each actor sets."""

import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.core.hardware import CpuFeatures, choose_precision, set_threads
from pipeline.tools.cli import compose

AVX2 = CpuFeatures(capability="AVX2", avx512_bf16=False, amx_bf16=False)
AVX512_NO_BF16 = CpuFeatures(capability="AVX512", avx512_bf16=False, amx_bf16=False)
AVX512_BF16 = CpuFeatures(capability="AVX512", avx512_bf16=True, amx_bf16=False)
AMX = CpuFeatures(capability="AVX512", avx512_bf16=True, amx_bf16=True)


@pytest.mark.parametrize("cpu", [AVX512_BF16, AMX])
def test_auto_is_bf16_on_a_cpu_with_native_bf16(cpu):
    choice = choose_precision("auto", "cpu", cpu=cpu)
    assert choice.dtype == "bf16" and choice.warning is None
    assert "native bf16" in choice.reason and "AVX512" in choice.reason


@pytest.mark.parametrize("cpu", [AVX2, AVX512_NO_BF16])
def test_auto_is_fp32_on_a_cpu_without_native_bf16(cpu):
    choice = choose_precision("auto", "cpu", cpu=cpu)
    assert choice.dtype == "fp32" and choice.warning is None
    assert "emulated" in choice.reason


def test_torch_dispatching_at_avx2_means_no_native_bf16_even_on_a_bf16_cpu():
    # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine: torch reports AVX2, kernels run at AVX2.
    forced = CpuFeatures(capability="AVX2", avx512_bf16=True, amx_bf16=True)
    assert choose_precision("auto", "cpu", cpu=forced).dtype == "fp32"
    capped = CpuFeatures(capability="AVX512", avx512_bf16=True, amx_bf16=True, onednn_max_isa="AVX2")
    assert choose_precision("auto", "cpu", cpu=capped).dtype == "fp32"
    assert (
        choose_precision(
            "auto",
            "cpu",
            cpu=CpuFeatures(capability="AVX512", avx512_bf16=True, amx_bf16=False, onednn_max_isa="AVX512_CORE_BF16"),
        ).dtype
        == "bf16"
    )


def test_explicit_bf16_without_native_support_still_runs_with_a_one_line_warning():
    choice = choose_precision("bf16", "cpu", cpu=AVX2)
    assert choice.dtype == "bf16"
    assert choice.warning and "\n" not in choice.warning
    assert "emulated" in choice.warning and "slower than fp32" in choice.warning
    assert choose_precision("bf16", "cpu", cpu=AMX).warning is None


def test_explicit_fp32_is_kept_everywhere():
    for cpu in (AVX2, AMX):
        assert choose_precision("fp32", "cpu", cpu=cpu).dtype == "fp32"
    assert choose_precision("fp32", "cuda", cuda_bf16=True).dtype == "fp32"


def test_auto_on_a_gpu_is_bf16_where_the_gpu_supports_it():
    assert choose_precision("auto", "cuda", cuda_bf16=True).dtype == "bf16"
    assert choose_precision("auto", "cuda", cuda_bf16=False).dtype == "fp32"


def test_an_unknown_precision_is_refused_at_launch_naming_the_field():
    with pytest.raises(ValueError, match="precision"):
        choose_precision("fp16", "cpu", cpu=AMX)
    for key in ("learner.precision", "rollout.precision", "scorer.precision"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            compose([f"{key}=fp8"])


def test_auto_is_the_default_for_every_actor():
    cfg = compose([])
    assert (cfg.learner.precision, cfg.rollout.precision, cfg.scorer.precision) == ("auto", "auto", "auto")


def test_detected_features_agree_with_what_torch_reports():
    cpu = CpuFeatures.detect()
    assert cpu.capability == torch.backends.cpu.get_cpu_capability()
    assert cpu.avx512_bf16 == torch.cpu._is_avx512_bf16_supported()


def test_set_threads_sets_and_reports_the_torch_thread_count():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 == torch.get_num_threads()
        assert set_threads(None) == 1  # None keeps what is set
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError):
        set_threads(0)
