"""How a decoding call's phases are timed (`PhaseClock`, the phase names) and what keeps Python's collector
out of every timed decoding (`frozen_heap`)."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from mars.adapter import synchronize

ACCOUNTING = "accounting"  # the phase outside `GenerationOutput.seconds` (except settlements the memory forces)
PHASES = ("prefill", "draft", "tree_forward", "accept", "cache_update", "catch_up", "decode", ACCOUNTING)

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
    def apart(self, phase: str) -> Iterator[None]:
        """Charge the block's wall time to `phase` whether the clock is on or not, and leave it out of
        the next lap (use it right after a lap, or after the loop)."""
        start = time.perf_counter()
        yield
        if self.on:
            synchronize(self.devices)
        self.last = time.perf_counter()
        self.seconds[phase] += self.last - start


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
