"""Prepacked oneDNN matrix products for float32 linear layers on CPUs.

A tree forward multiplies every weight matrix by a few rows (the drafted nodes). On the AMD EPYC
CPUs this project lands on, torch's default float32 path (MKL `sgemm`) is slow for 2-32 rows: a
9-row forward of the embedded target costs 1.7 one-row decodes with it and 1.25 with oneDNN
multiplying weights packed once into its blocked layout (`../shared/notes/cpu-performance.md`).
oneDNN's packed product is also row-invariant (a row's result does not depend on how many rows are
multiplied with it), which MKL's is not.

`PackedLinears` packs a model's float32 CPU `nn.Linear` weights once and swaps them in only inside
`active()`: between calls the model is exactly the user's (its own `generate` keeps torch's kernels,
so baselines timed with it are not sped up by us). A weight modified in place since packing
(training, `load_state_dict`) is repacked at the next `active()`.

The packed copy doubles the memory of the weights it covers; `auto` packs only where that fits.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn

# `auto` packs when the copy takes at most this share of the memory still available.
MEMORY_SHARE = 0.25


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def available_memory() -> int | None:
    """Bytes of memory still available (Linux `MemAvailable`), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def packable(module: nn.Module) -> bool:
    return (isinstance(module, nn.Linear) and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32)


def choose_packing(modules: list[nn.Module], requested: bool | str = "auto",
                   compiled: bool = False) -> tuple[bool, str]:
    """Whether to pack the float32 CPU linears of `modules` (models), and why. compiled: the models'
    forwards run under `torch.compile`, which chooses its own kernels; packing swaps each linear's
    `forward` at every call, which would make it compile again, so `auto` is off and True refused."""
    if requested not in (True, False, "auto"):
        raise ValueError(f"prepack must be True, False or 'auto', got {requested!r}")
    linears = [m for model in modules for m in model.modules() if packable(m)]
    if requested is False:
        return False, "off (requested)"
    if compiled:
        if requested is True:
            raise ValueError("prepack=True swaps the linear layers' forward at every call, which torch.compile would "
                             "compile again each time: pass prepack=False or 'auto' with compile")
        return False, "off (auto): torch.compile chooses the kernels of the compiled forwards"
    if not linears:
        return False, "off: no float32 CPU linear layers"
    if not torch.backends.mkldnn.is_available():
        if requested is True:
            raise RuntimeError("prepack=True needs torch built with oneDNN (torch.backends.mkldnn): pass "
                               "prepack=False or 'auto' (model.prepack=false)")
        return False, "off: this torch has no oneDNN"
    if requested is True:
        return True, "on (requested)"
    size = sum(m.weight.numel() * 4 for m in linears)
    free = available_memory()
    if free is not None and size > MEMORY_SHARE * free:
        return False, (f"off (auto): a packed copy of the float32 weights ({size / 2**30:.1f} GiB) would take more "
                       f"than {MEMORY_SHARE:.0%} of the available memory")
    return True, "on (auto): float32 linears on CPU run oneDNN products on prepacked weights"


class PackedLinears:
    """The float32 CPU `nn.Linear` layers of some models, with oneDNN-packed copies of their weights."""

    def __init__(self, *models: nn.Module):
        self.linears = [m for model in models for m in model.modules() if packable(m)]
        self._packed: dict[nn.Linear, tuple[torch.Tensor, int, int]] = {}

    def _pack(self, linear: nn.Linear) -> torch.Tensor:
        weight = linear.weight
        stamp = (weight.data_ptr(), weight._version)
        held = self._packed.get(linear)
        if held is None or held[1:] != stamp:
            with torch.no_grad():
                held = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None), *stamp)
            self._packed[linear] = held
        return held[0]

    @contextmanager
    def active(self):
        """Inside: every covered linear multiplies with its packed weight (inference only)."""
        for linear in self.linears:
            bias = None if linear.bias is None else linear.bias.detach()
            linear.forward = partial(_packed_forward, self._pack(linear), bias)
        try:
            yield self
        finally:
            for linear in self.linears:
                del linear.forward  # the class's own forward again
