"""What a decoding call returns (`GenerationOutput`), how its phases are timed (`PhaseClock`), and
what keeps Python's collector out of its timings (`frozen_heap`)."""

from __future__ import annotations

import gc
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from mars.adapter import synchronize
from mars.stats import VerifyStats


@dataclass
class GenerationOutput:
    tokens: list[int] = field(default_factory=list)  # new tokens only
    accept_lengths: list[int] = field(default_factory=list)  # drafted tokens emitted per cycle
    draft_depths: list[int] = field(default_factory=list)  # draft levels grown per cycle (0: a plain decoding step)
    num_cycles: int = 0
    stats: VerifyStats = field(default_factory=VerifyStats)
    seconds: float = 0.0  # wall time of the whole call
    stopped_by: str = "length"  # "eos" or "length"
    phase_seconds: Counter = field(default_factory=Counter)  # wall time by phase (`PHASES`), with profile=True

    @property
    def tau(self) -> float:
        """Mean tokens emitted per draft-verify cycle (the prefill's first token is in no cycle)."""
        return (len(self.tokens) - 1) / self.num_cycles if self.num_cycles else 1.0

    @property
    def relaxed_tokens(self) -> int:
        """Tokens accepted only because of the MARS relaxation."""
        return self.stats.relaxed_tokens


PHASES = ("prefill", "draft", "tree_forward", "accept", "cache_update", "catch_up", "decode")


class PhaseClock:
    """Adds the wall time since the previous lap to a phase (when `on`; otherwise it does nothing).

    It synchronises every device in use first, so that each phase is charged with its own kernels
    rather than with whatever the next read waits for; that costs the loop its asynchrony on a GPU,
    so it is opt-in (`SpeculativeGenerator(profile=True)`, `eval.run profile=true`)."""

    def __init__(self, seconds: Counter, devices: set[torch.device], on: bool):
        self.seconds, self.devices, self.on = seconds, devices, on
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if not self.on:
            return
        synchronize(self.devices)
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now


@contextmanager
def frozen_heap():
    """Inside: the objects that exist on entry (models, tokenizers, earlier results) are left out of
    Python's cyclic garbage collections (`gc.freeze`), and back in on exit (`gc.unfreeze`).

    Why: a decoding loop allocates small objects every step (verdicts, steps, token lists), which
    triggers collections that walk every tracked object; with a model's modules and a run's results
    alive, a full one costs milliseconds. Measured on the embedded pair at batch 4 (float32, AVX512):
    verification and bookkeeping 2.9 ms per cycle without, 0.6 ms with. Every decoding method timed
    (ours and `model.generate`) runs inside it, so no baseline pays a cost another is spared. Left
    alone if the caller has frozen objects already (`gc.get_freeze_count()`)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
