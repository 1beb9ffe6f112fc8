"""What the hardware runs natively: the precision and the thread count of each actor.

``precision: auto`` (the default of the learner, the rollout engines and the teacher scorer)
resolves where the actor runs, from what torch reports about that device:

- CUDA: bf16 where the GPU supports it (``torch.cuda.is_bf16_supported()``), else fp32.
- CPU: bf16 only where the CPU executes bf16 matmuls natively: torch's ATen kernels run at the
  AVX-512 level (``torch.backends.cpu.get_cpu_capability()``) and the CPU has ``avx512_bf16``
  or AMX (``torch.cpu._is_avx512_bf16_supported()`` / ``_is_amx_tile_supported()``), and
  oneDNN is not capped below its bf16 ISA (``ONEDNN_MAX_CPU_ISA``). Everywhere else fp32.

Why: on an AVX2-only CPU bf16 is emulated. Measured on these machines (docs/results.md):
a SmolLM2-135M forward+backward under bf16 was more than 10x slower than fp32, and the learning
test ran 212-221 s per step instead of 9-10 s. An explicit ``bf16`` there still runs, with a
one-line warning saying so.

The decision is a pure function of a ``CpuFeatures`` record, so tests inject what the hardware
reports instead of mocking torch. ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an
AVX-512 machine take (and measure) the AVX2 path.

Threads: every actor sets its torch thread count explicitly (``set_threads``) and reports it, so
that two actors sharing two cores never oversubscribe them (see ``pipeline.orchestration.resources.actor_threads``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PRECISIONS = ("auto", "fp32", "bf16")
EMULATED_BF16_SLOWDOWN = "10-20x"  # bf16 vs fp32 matmuls without native bf16 (measured, see above)
_ONEDNN_BF16_ISAS = (
    "ALL",
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
)


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """What torch reports about the CPU (``detect``), or what a test says it reports."""

    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", "DEFAULT", ...
    avx512_bf16: bool
    amx_bf16: bool
    onednn_max_isa: str | None = None  # $ONEDNN_MAX_CPU_ISA, upper-cased; None = not capped

    @classmethod
    def detect(cls) -> "CpuFeatures":
        import torch

        cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
        return cls(
            capability=str(torch.backends.cpu.get_cpu_capability()),
            avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
            amx_bf16=bool(torch.cpu._is_amx_tile_supported()),
            onednn_max_isa=cap.upper() if cap else None,
        )

    @property
    def native_bf16(self) -> bool:
        isa_ok = self.onednn_max_isa is None or self.onednn_max_isa in _ONEDNN_BF16_ISAS
        return self.capability.upper().startswith("AVX512") and (self.avx512_bf16 or self.amx_bf16) and isa_ok

    def describe(self) -> str:
        units = [n for n, ok in (("avx512_bf16", self.avx512_bf16), ("AMX", self.amx_bf16)) if ok]
        text = f"torch CPU capability {self.capability}, " + (" + ".join(units) or "no avx512_bf16/AMX")
        if self.onednn_max_isa:
            text += f", ONEDNN_MAX_CPU_ISA={self.onednn_max_isa}"
        return text


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    dtype: str  # "fp32" | "bf16"
    reason: str  # one line: what was asked, what the hardware offers
    warning: str | None = None  # set when an explicit bf16 will run emulated

    def line(self, who: str) -> str:
        return f"{who}: {self.dtype} ({self.reason})"


def choose_precision(
    requested: str, device: str = "cpu", *, cpu: CpuFeatures | None = None, cuda_bf16: bool | None = None
) -> PrecisionChoice:
    """Resolve ``auto | fp32 | bf16`` for an actor on ``device`` ("cpu" or "cuda").

    ``cpu`` / ``cuda_bf16`` default to what this process's torch reports; tests pass their own.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision={requested!r}: use one of {list(PRECISIONS)}")
    if device.startswith("cuda"):
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if requested == "auto":
            return PrecisionChoice(
                "bf16" if cuda_bf16 else "fp32",
                "auto on a GPU " + ("with" if cuda_bf16 else "without") + " bf16 support",
            )
        return PrecisionChoice(requested, "set explicitly on a GPU")
    cpu = cpu or CpuFeatures.detect()
    native = cpu.native_bf16
    if requested == "auto":
        what = "native bf16" if native else "no native bf16: bf16 would be emulated"
        return PrecisionChoice("bf16" if native else "fp32", f"auto, CPU with {what}; {cpu.describe()}")
    if requested == "bf16" and not native:
        return PrecisionChoice(
            "bf16",
            f"set explicitly; {cpu.describe()}",
            warning=(
                f"bf16 on a CPU without native bf16 ({cpu.describe()}) is emulated: "
                f"expect it to be about {EMULATED_BF16_SLOWDOWN} slower than fp32; "
                "use precision=auto or fp32"
            ),
        )
    return PrecisionChoice(requested, f"set explicitly; {cpu.describe()}")


def hardware_info(choice: PrecisionChoice, threads: int) -> dict:
    """What an actor reports about itself: ``{"precision", "reason", "warning", "threads"}``."""
    return {"precision": choice.dtype, "reason": choice.reason, "warning": choice.warning, "threads": threads}


def set_threads(n: int | None) -> int:
    """Set this process's torch intra-op threads (``None`` keeps torch's default) and return the
    count in effect, for the actor to report."""
    import torch

    if n is not None:
        if n < 1:
            raise ValueError(f"thread count must be >= 1, got {n}")
        torch.set_num_threads(int(n))
    return torch.get_num_threads()


__all__ = ["CpuFeatures", "PRECISIONS", "PrecisionChoice", "choose_precision", "hardware_info", "set_threads"]
