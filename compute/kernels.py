"""Prepacked oneDNN matrix products for float32 and bf16 linear layers on CPUs.

A tree forward multiplies every weight matrix by a few rows (the drafted nodes), a decoding step by
one. torch's default CPU paths are slow for both on the AMD EPYC CPUs this project lands on:
- float32 (MKL `sgemm`) over 2-32 rows: a 9-row forward of the embedded target costs 1.7 one-row
  decodes with it and 1.25 with oneDNN multiplying weights packed once into its blocked layout.
- bf16 on a CPU with AVX-512 BF16: torch hands each product to oneDNN with the weight in torch's
  layout, and the reorder into oneDNN's blocked layout runs at every call. For one row that is most
  of the product's cost: [1, 384] x [384, 384] took 39.7 us natively against 9.7 us with torch
  limited to AVX2 (`ATEN_CPU_CAPABILITY=avx2`, another kernel), which made plain bf16 decoding of
  the embedded target 1.2-1.6x faster under those limits than natively; on prepacked weights the
  native decode is the fastest of all (`../shared/notes/cpu-performance.md`).
oneDNN's packed product is also row-invariant for most shapes (a row's result does not depend on how many
rows are multiplied with it; `tests/test_kernels.py`), which MKL's float32 is not. Two exceptions are known,
both by row count, and `row_blocks` finds them once per process by trying each shape:
- a single row through another kernel than two or more: SmolLM2's down projection (1,536 -> 576, bf16, AVX-512
  BF16 EPYC) came out one bf16 step away from the same row among 2 to 64 rows, in about one row in sixteen,
  which was enough to make strict greedy verification leave plain bf16 decoding. Such a shape's lone row (plain
  decoding) is multiplied twice and one kept: the kernel a tree's rows get.
- more than some number of rows through another kernel: on a Xeon with AMX (2026-12-02, `AVX512`), bf16
  products of 1 to 32 rows agreed and 33 or more came out of another kernel (AMX tiles) for every shape but
  384 -> 1,024; a tree of 48 nodes would then verify with other sums than plain decoding's. Such a shape
  multiplies more rows in blocks of the largest count that agreed.
Packed is not fastest everywhere: on the AVX-512 BF16 EPYC, in a real decoding step (weights streamed from
memory, not cache), a packed one-row bf16 product of SmolLM2 took ~76 us per call against ~57 us for torch's
own kernel with oneDNN off, so plain bf16 decoding with oneDNN off (`onednn(False)`) ran 1.3x faster than
packed; those products are row-invariant too, but several rows cost nearly that many times one (a 40-token
prompt's forward took ~300 ms against ~55 ms packed), so a tree's rows and every prompt's forward stay packed
(benchmarks/records/2026-11-27-epyc-avx512-head2/plain_decoding_kernels_smollm2.json). Which wins is measured per
machine (`mars.tuning.search` races plain decoding at each).

`PackedLinears` packs a model's CPU `nn.Linear` weights once and swaps them in only inside
`active()`: between calls the model is exactly the user's (its own `generate` keeps torch's kernels,
so baselines timed with it are not sped up by us). A weight modified in place since packing
(training, `load_state_dict`) is repacked at the next `active()`.

The packed copy doubles the memory of the weights it covers; `auto` packs only where that fits.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

# `auto` packs when the copy takes at most this share of the memory still available.
MEMORY_SHARE = 0.25


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@dataclass(frozen=True)
class RowBlocks:
    """How to multiply rows through a packed weight so that each row's product does not depend on how many
    rows come with it (`row_blocks`). lone_row_differs: a single row gets another kernel than two, so it is
    multiplied as two (itself twice) and one kept. most_rows: above this many rows another kernel takes over,
    so more rows are multiplied in blocks of at most this many (None: every count tried agreed)."""

    lone_row_differs: bool = False
    most_rows: int | None = None


AS_TORCH_DOES = RowBlocks()  # every count in one call (what `_packed_forward` alone does)


def _invariant_forward(blocks: RowBlocks, packed: torch.Tensor, bias: torch.Tensor | None,
                       x: torch.Tensor) -> torch.Tensor:
    """`_packed_forward` of x: [..., fan_in], each row multiplied by a kernel that every count of rows gets."""
    rows = x.numel() // x.shape[-1]
    if rows == 1 and blocks.lone_row_differs:
        row = x.reshape(1, -1)
        return _packed_forward(packed, bias, torch.cat([row, row]))[:1].reshape(*x.shape[:-1], -1)
    if blocks.most_rows is None or rows <= blocks.most_rows:
        return _packed_forward(packed, bias, x)
    flat = x.reshape(rows, -1)
    parts = [_invariant_forward(blocks, packed, bias, flat[i : i + blocks.most_rows])
             for i in range(0, rows, blocks.most_rows)]
    return torch.cat(parts).reshape(*x.shape[:-1], -1)


# Row counts tried against the same rows two at a time: both sides of the block sizes kernels switch at, up to 128
# rows (a tree's verification and draft training's batches stay below; a longer prompt's forward is split into blocks
# only where a count up to 128 already disagreed).
PROBE_COUNTS = (3, 4, 8, 9, 16, 17, 24, 32, 33, 48, 64, 65, 96, 128)
PROBE_ROWS = 128  # a shape whose lone rows differ one time in 16 is missed ~0.03% of the time


@functools.cache
def row_blocks(fan_in: int, fan_out: int, dtype: torch.dtype) -> RowBlocks:
    """How oneDNN's packed product of a weight of this shape and dtype keeps rows invariant here, found by trying
    (on seeded random rows: the kernel is chosen by shape and row count, not values): lone rows, and each count of
    `PROBE_COUNTS`, against the same rows multiplied two at a time."""
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(fan_out, fan_in, generator=generator) * fan_in ** -0.5).to(dtype)
    x = torch.randn(PROBE_ROWS, fan_in, generator=generator).to(dtype)
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        twos = torch.cat([_packed_forward(packed, None, x[r : r + 2]) for r in range(0, PROBE_ROWS, 2)])
        lone_differs = any(not torch.equal(_packed_forward(packed, None, x[r : r + 1]), twos[r : r + 1])
                           for r in range(PROBE_ROWS))
        agreed = 2
        for count in PROBE_COUNTS:
            if not torch.equal(_packed_forward(packed, None, x[:count]), twos[:count]):
                return RowBlocks(lone_differs, agreed)
            agreed = count
    return RowBlocks(lone_differs, None)


@contextmanager
def onednn(enabled: bool):
    """Inside: torch hands CPU products to oneDNN where it can (`enabled`), or multiplies with its own kernels
    (`torch.backends.mkldnn.enabled`, process-wide; restored after)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def available_memory() -> int | None:
    """Bytes of memory still available (Linux `MemAvailable`), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN here can pack weights of `dtype` (float32 wherever torch has oneDNN; bf16 only
    with the CPU's bf16-capable instructions, which `ONEDNN_MAX_CPU_ISA` may withhold): tried once."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.no_grad():
            weight = torch.ones(8, 8, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            out = _packed_forward(packed, None, torch.ones(2, 8, dtype=dtype))
        return bool(out.eq(8).all())
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
        return False


def packable(module: nn.Module) -> bool:
    return (isinstance(module, nn.Linear) and module.weight.device.type == "cpu" and packs(module.weight.dtype))


def packed_copy_fits(size: int) -> bool:
    """Whether a packed copy of `size` bytes of weights takes at most MEMORY_SHARE of the available memory."""
    free = available_memory()
    return free is None or size <= MEMORY_SHARE * free


def choose_packing(modules: list[nn.Module], requested: bool | str = "auto",
                   compiled: bool = False) -> tuple[bool, str]:
    """Whether to pack the CPU linears of `modules` (models) that oneDNN can pack here, and why. compiled: the models'
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
        if requested is True:
            raise RuntimeError("prepack=True needs CPU linear layers that this torch's oneDNN can pack (float32, or "
                               "bf16 on a CPU with AVX-512 BF16): pass prepack=False or 'auto' (model.prepack=false)")
        return False, "off: no CPU linear layers that oneDNN packs here"
    if requested is True:
        return True, "on (requested)"
    size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if not packed_copy_fits(size):
        return False, (f"off (auto): a packed copy of the weights ({size / 2**30:.1f} GiB) would take more "
                       f"than {MEMORY_SHARE:.0%} of the available memory")
    kinds = "/".join(sorted({str(m.weight.dtype).removeprefix("torch.") for m in linears}))
    return True, f"on (auto): {kinds} linears on CPU run oneDNN products on prepacked weights"


class PackedLinears:
    """The CPU `nn.Linear` layers of some models that oneDNN packs here, with packed copies of their weights."""

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
        """Inside: every covered linear multiplies with its packed weight (inference only). A linear moved
        since to a precision oneDNN cannot pack here (bf16 without AVX-512 BF16) keeps torch's product."""
        covered = [linear for linear in self.linears if packable(linear)]
        for linear in covered:
            bias = None if linear.bias is None else linear.bias.detach()
            fan_out, fan_in = linear.weight.shape
            blocks = row_blocks(fan_in, fan_out, linear.weight.dtype)
            linear.forward = partial(_invariant_forward, blocks, self._pack(linear), bias)
        try:
            yield self
        finally:
            for linear in covered:
                del linear.forward  # the class's own forward again


@contextmanager
def packed_where_chosen(model: nn.Module, requested: bool | str = "auto"):
    """Inside: `model`'s CPU linears multiply packed weights where `choose_packing` packs them (a one-off pass
    over many rows: draft training's answers and features), torch's products otherwise."""
    if choose_packing([model], requested)[0]:
        with PackedLinears(model).active():
            yield
    else:
        yield
