"""Step 1 of a calibration (`mars.tuning.search`): every plain decoding a user has here, raced paired, and the
fastest, which every method is then judged against.

The racers: our vanilla at the kernel sets with the cheapest plain steps, `model.generate` in each precision
loaded (with the model's own attention implementation), and the caller's `Reference`s out of this process (e.g.
`model.generate` under the AVX2 limits in a worker). They decode the same units in rotated blocks
(`mars.tuning.pairs.time_block`) and are ranked by their paired ratios against one of them.
"""

from __future__ import annotations

import math
import statistics

import torch

from mars.accounting.timing import ForeignLoad
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.reference import InProcessGenerate, rows_of
from mars.decoding.settings import Kernels
from mars.tuning.pairs import Contender, Unit, log_ratios, time_block
from mars.tuning.plan import Reference
from mars.tuning.record import PlainSpeed
from mars.verification.sampling import SamplingConfig

RACE_VANILLAS = 2  # our vanilla races at this many kernel sets, those of the cheapest plain steps
PLAIN_TIE = 0.03  # our plain decoding moves off the trees' kernels only where that is faster by more than this


def seeded(gen: SpeculativeGenerator, sampling: SamplingConfig, seed: int) -> torch.Generator | None:
    """The generator a sampled decode of unit `seed` draws from (None when greedy): every contender draws alike."""
    return None if sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)


def vanilla_contender(kernels: Kernels, gen: SpeculativeGenerator, sampling: SamplingConfig) -> Contender:
    def timed(unit: Unit, seed: int, tokens: int) -> tuple[int, float]:
        outs = gen.vanilla(unit, sampling, max_new_tokens=tokens, generator=seeded(gen, sampling, seed))
        return sum(len(o.tokens) for o in outs), max(o.seconds for o in outs)
    return Contender(f"vanilla {kernels.label}", timed)


def generate_contender(model: torch.nn.Module, dtype: str, attention: str, sampling: SamplingConfig) -> Contender:
    """transformers' `model.generate`, with the model's own attention implementation while it decodes (the
    generators on the model switch it for tree attention, which plain decoding with `generate` is not)."""
    generate = InProcessGenerate(model, attention)

    def timed(unit: Unit, seed: int, tokens: int) -> tuple[int, float]:
        outs = generate.decode(rows_of(unit), sampling, tokens, [], seed)
        return sum(len(o.tokens) for o in outs), max(o.seconds for o in outs)
    return Contender(f"generate@{dtype}", timed)


def reference_contender(reference: Reference, sampling: SamplingConfig) -> Contender:
    return Contender(reference.label, lambda unit, seed, tokens: reference.time(unit, sampling, tokens, seed))


def plain_contenders(gens: dict[Kernels, SpeculativeGenerator], vanillas: list[Kernels],
                     targets: dict[str, tuple[torch.nn.Module, str]], references: list[Reference],
                     sampling: SamplingConfig) -> dict[str, tuple[Kernels | None, Contender]]:
    """{label: (our kernels or None, its contender)}: our vanilla at `vanillas`, `model.generate` for each of
    `targets` ({dtype: (the target loaded in it, its own attention implementation)}), and the `references`."""
    found: dict[str, tuple[Kernels | None, Contender]] = {
        f"vanilla {k.label}": (k, vanilla_contender(k, gens[k], sampling)) for k in vanillas}
    for dtype, (model, attention) in targets.items():
        found[f"generate@{dtype}"] = (None, generate_contender(model, dtype, attention, sampling))
    for r in references:
        found[r.label] = (None, reference_contender(r, sampling))
    return found


def race(contenders: dict[str, tuple[Kernels | None, Contender]], units: list[Unit], tokens: int,
         meter: ForeignLoad) -> tuple[list[PlainSpeed], PlainSpeed]:
    """Every contender decoding `units` in rotated blocks of `tokens`, fastest first, and the fastest."""
    racers = [c for _, c in contenders.values()]
    for c in racers:
        c.time(units[0], 0, 8)  # a first call pays one-time costs (a worker's start, allocations)
    for index, unit in enumerate(units):
        time_block(racers, unit, index, tokens, meter)
    anchor = racers[0]  # every plain decoding against one, on the same units: ratios that compose
    relative = {c.label: math.exp(statistics.fmean(log_ratios(c, anchor) or [0.0])) for c in racers}
    top = max(relative.values())
    plains = sorted((PlainSpeed(label, k, c.speed, relative[label] / top) for label, (k, c) in contenders.items()),
                    key=lambda p: -p.relative)
    return plains, plains[0]


def plain_kernels(plains: list[PlainSpeed], tree_kernels: Kernels) -> Kernels:
    """Our plain decoding's kernels: the fastest vanilla raced, unless the trees' kernels' vanilla was raced and is
    within PLAIN_TIE of it (strict then reproduces our plain decoding token for token)."""
    ours = [p for p in plains if p.ours]
    fastest = max(ours, key=lambda p: p.relative)
    at_trees = next((p for p in ours if p.kernels == tree_kernels), None)
    if at_trees is not None and at_trees.relative * (1 + PLAIN_TIE) >= fastest.relative:
        return tree_kernels
    return fastest.kernels
