"""What a calibration chooses among: the draft trees and the kernel sets (precision, exact attention,
prepacked linears, oneDNN) a machine may decode with.

The lists are priors, not verdicts: `mars.tuning.search` predicts every kernels x tree pair from costs measured
here and times only the few it cannot separate.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from compute.kernels import packed_copy_fits, packs
from eagle.precision import needs_exact_attention, resolve_dtype
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape
from mars.tuning.pairs import Unit
from mars.verification.sampling import SamplingConfig

# From a narrow chain-like tree to EAGLE-2's GPU default; the adaptive policy (mars.decoding.adaptive) as the
# candidate that can fall back to plain decoding steps where no fixed tree pays.
# Chains first: on a CPU a verification's cost grows with every row, and chains usually beat trees there; wider
# trees pay where extra rows are nearly free (a GPU, a larger model). The order is the profiles' (a tree that cannot
# catch the best so far is skipped, so good candidates first make the search short).
CANDIDATES = tuple(TreeShape(*shape, drafting="topk") for shape in (
    (4, 4, 1), (6, 6, 1), (8, 8, 1), (8, 4, 2), (12, 4, 3), (16, 4, 4), (20, 4, 5), (24, 5, 5),
    (32, 5, 6), (32, 6, 6), (48, 6, 8), (60, 6, 10), (20, 6, 5, True)))
# At temperature > 0, sampled children (eagle.sampled_trees.sample_tree): a first draw is accepted far more
# often than any later sibling, so deep chains and narrow trees, deeper than top-k trees go.
SAMPLED_CANDIDATES = tuple(TreeShape(*shape, drafting="sample") for shape in (
    (4, 4, 1), (6, 6, 1), (8, 8, 1), (8, 6, 2), (8, 8, 2), (12, 6, 3), (12, 8, 3), (16, 8, 4), (20, 6, 5)))


def tree_candidates(sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """The trees a calibration profiles, in the order of their prior (the first profiled first): top-k trees when
    greedy; when sampling, those of `drafting` ("topk", "sample", or
    both for "auto", sampled first: a first draw is accepted far more often than a top-k sibling)."""
    if not sampled or drafting == "topk":
        return CANDIDATES
    return SAMPLED_CANDIDATES if drafting == "sample" else SAMPLED_CANDIDATES + CANDIDATES


def batchable(tree: TreeShape) -> bool:
    """Whether batched decoding can draft this tree: fixed trees (no adaptive tree, for now)."""
    return not tree.adaptive


def fixed_candidates(tree: TreeShape, sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """A configured tree's shape in the drafting modes a run may use (both, for "auto" when sampling)."""
    topk = replace(tree, drafting="topk")
    if not sampled or tree.adaptive or drafting == "topk":
        return (topk,)
    return (topk.sampled(),) if drafting == "sample" else (topk.sampled(), topk)


def kernel_candidates(device: str | torch.device, dtype: str = "auto", exact_attention: bool | None = None,
                      prepack: bool | None = None, parameters: int | None = None) -> list[Kernels]:
    """The kernel combinations to time on `device`, after the run's explicit settings (None / "auto": free).

    CPU: float32 and bf16; exact attention where the precision needs it to reproduce plain decoding
    (bf16: `eagle.precision.needs_exact_attention`) unless set; prepacked linears on and off where
    oneDNN packs that precision here (`compute.kernels.packs`) and a packed copy of the target's
    `parameters` weights fits in memory (`compute.kernels.packed_copy_fits`), unless set; and in bf16 /
    fp16, torch's own products with oneDNN off ("aten"), unless prepacking was asked for. Other devices:
    one candidate, the precision of `eagle.precision.resolve_dtype` and no prepacking (nothing on a GPU is timed:
    float32 is never the faster there, and `compute.kernels` packs CPU weights only).
    """
    on_cpu = torch.device(device).type == "cpu"
    if dtype != "auto":
        dtypes = [dtype]
    elif on_cpu:
        dtypes = ["float32", "bfloat16"]
    else:
        dtypes = [resolve_dtype("auto", device).name]
    found = []
    for name in dtypes:
        exact = needs_exact_attention(getattr(torch, name)) if exact_attention is None else exact_attention
        size = (parameters or 0) * getattr(torch, name).itemsize
        can_pack = on_cpu and packs(getattr(torch, name)) and packed_copy_fits(size)
        for packed in ([prepack] if prepack is not None else [True, False] if can_pack else [False]):
            found.append(Kernels(name, exact, packed))
        if on_cpu and name != "float32" and prepack is not True and torch.backends.mkldnn.is_available():
            # torch's own half-precision products, oneDNN off: a plain decoding candidate above all (one row
            # streams faster than packed on the AVX-512 EPYC); without exact attention, unless it was set,
            # which a lone row does not need. Its trees are timed only if they reproduce its plain decoding.
            found.append(Kernels(name, exact if exact_attention is not None else False, False, onednn=False))
    return found


def check_kernels(gens: dict[Kernels, SpeculativeGenerator], unit: Unit, max_new_tokens: int = 12) -> dict[str, bool]:
    """Whether strict greedy output equals plain greedy output at each kernel set on `unit` (untimed; also the
    first warm-up of every generator)."""
    greedy = SamplingConfig()
    return {k.label: [o.tokens for o in gen.vanilla(unit, greedy, max_new_tokens=max_new_tokens)]
            == [o.tokens for o in gen.generate(unit, greedy, max_new_tokens=max_new_tokens)]
            for k, gen in gens.items()}
