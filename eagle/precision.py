"""Which floating-point precision a model runs in, by a rule of the hardware, where nothing is measured.

`eval.run` measures the precision on a CPU (`mars.tuning.search`: the fastest kernels that keep strict
greedy output equal to plain decoding), because no rule got it right: on an AVX-512 BF16 CPU bf16
verification was 1.3x slower than float32 with torch's kernels and is the fastest on prepacked
weights (`compute.kernels`). This module's rule is what a library call with dtype "auto" gets and
what GPUs get: bf16 on GPUs (float16 where bf16 is unsupported) and on CPUs with native bf16 matrix
instructions (AVX-512 BF16, AMX); float32 on other CPUs (AVX2 only, or AVX-512 without BF16), where
torch runs bf16 products over several rows without a native kernel, 3-6x slower than float32 on the
embedded pair (`../shared/notes/cpu-performance.md`).

`ATEN_CPU_CAPABILITY` and `ONEDNN_MAX_CPU_ISA` limit what torch and oneDNN use; they are honoured,
so that `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` on a bigger CPU resolves as an AVX2 one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
HALF = (torch.bfloat16, torch.float16)
# ONEDNN_MAX_CPU_ISA values that keep bf16 instructions: AVX512_CORE_BF16 and every level above it
# (AVX512_CORE_FP16, AVX512_CORE_AMX, AVX10_1_512, AVX10_1_512_AMX_FP16, ...), and no limit at all.
_ONEDNN_BF16_MARKERS = ("BF16", "FP16", "AMX", "AVX10", "ALL", "DEFAULT")


@dataclass(frozen=True)
class Precision:
    """A resolved precision and why it was chosen (recorded in run summaries)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line starting with one of `keys` (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    return set((_cpuinfo("flags", "Features") or "").split())


def _amd_core(family: int, model: int) -> str | None:
    """AMD's core generation for a cpuinfo family and model (None where not one of these)."""
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen"
    if family == 0x19:
        if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF:
            return "Zen 4"
        return "Zen 3" if model <= 0x0F or 0x20 <= model <= 0x2F or 0x40 <= model <= 0x5F else None
    if family == 0x1A:
        return "Zen 5"
    return None


def cores() -> int:
    """The CPU cores this process may run on (all of them where the OS cannot say, e.g. macOS)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo) with its family and model numbers, else what `platform` knows.

    The numbers are kept because a virtual machine's name can be bare ("AMD EPYC") while CPUs behind it
    differ in what counts: a Zen 4 EPYC runs AVX-512 (bf16 included) on half-width units, a Zen 5 on
    full-width ones, so the same capability string hides different speeds and different winning kernels."""
    import platform

    name = _cpuinfo("model name") or platform.processor() or platform.machine()
    family, model = _cpuinfo("cpu family"), _cpuinfo("model\t", "model ")
    if not (family and model and family.isdigit() and model.isdigit()):
        return name
    core = _amd_core(int(family), int(model)) if "AMD" in name else None
    return f"{name} ({core + ', ' if core else ''}family {family}, model {model})"


def cpu_bf16_matmul() -> tuple[bool, str]:
    """(whether this CPU has native bf16 matrix instructions that torch may use, the evidence)."""
    capability = torch.backends.cpu.get_cpu_capability()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and not any(marker in isa for marker in _ONEDNN_BF16_MARKERS):
        return False, f"ONEDNN_MAX_CPU_ISA={isa} excludes bf16 instructions"
    if not capability.startswith("AVX512") and "AMX" not in capability:
        # torch dispatches below AVX-512 (the CPU has none, or ATEN_CPU_CAPABILITY limits it)
        return False, f"CPU capability {capability}: no native bf16 matrix instructions"
    flags = cpu_flags()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if native:
        return True, f"CPU capability {capability} with {'+'.join(native)}"
    if flags:
        return False, f"CPU capability {capability} without avx512_bf16/amx_bf16"
    # No flag list to read (not Linux): trust torch's own check.
    supported = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return supported, f"CPU capability {capability}, torch reports bf16 {'supported' if supported else 'unsupported'}"


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> Precision:
    """The precision to run in: `name` as given, or for "auto" bf16 on GPUs and on CPUs with native
    bf16 matrix instructions, float32 on other CPUs."""
    if isinstance(name, torch.dtype):
        return Precision(name, "set explicitly")
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}: use one of {sorted(DTYPES)} or 'auto'")
        return Precision(DTYPES[name], "set explicitly")
    kind = torch.device(device).type
    if kind == "cuda":
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return Precision(torch.float16, "auto: GPU without bf16 support")
        return Precision(torch.bfloat16, "auto: GPU")
    if kind != "cpu":
        return Precision(torch.bfloat16, f"auto: {kind} device")
    native, evidence = cpu_bf16_matmul()
    return Precision(torch.bfloat16 if native else torch.float32, f"auto: {evidence}")


def needs_exact_attention(dtype: torch.dtype) -> bool:
    """Whether tree verification needs layout-invariant attention to reproduce plain decoding.

    In bf16/fp16, a tree forward's differently laid out attention reductions flip roundings that
    grow into different greedy tokens; in float32 the differences stay in the last bits (strict
    greedy equalled plain decoding on all 64 held-out prompts of the embedded pair), and exact
    attention would cost ~20% of a cycle there.
    """
    return dtype in HALF
