"""What a decoding call returns (`GenerationOutput`), how its phases are timed (`PhaseClock`), how its
cost accounting is kept out of its timing (`CostLedger`), and what keeps Python's collector out of its
timings (`frozen_heap`)."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from mars.adapter import synchronize
from mars.stats import VerifyStats, settle_all
from mars.verify import Verdict, pending_bytes


@dataclass
class GenerationOutput:
    tokens: list[int] = field(default_factory=list)  # new tokens only
    accept_lengths: list[int] = field(default_factory=list)  # drafted tokens emitted per cycle
    draft_depths: list[int] = field(default_factory=list)  # draft levels grown per cycle (0: a plain decoding step)
    num_cycles: int = 0
    stats: VerifyStats = field(default_factory=VerifyStats)
    seconds: float = 0.0  # wall time of the call's decoding (without settling its cost accounting)
    stopped_by: str = "length"  # "eos" or "length"
    # Wall time by phase (`PHASES`): the loop's with profile=True; ACCOUNTING always (speculative
    # decoding): settling the deferred cost accounting, after `seconds` was taken (`CostLedger`).
    phase_seconds: Counter = field(default_factory=Counter)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per draft-verify cycle (the prefill's first token is in no cycle)."""
        return (len(self.tokens) - 1) / self.num_cycles if self.num_cycles else 1.0

    @property
    def relaxed_tokens(self) -> int:
        """Tokens accepted only because of the MARS relaxation."""
        return self.stats.relaxed_tokens


ACCOUNTING = "accounting"  # the phase outside `GenerationOutput.seconds` (except settlements the memory forces)
PHASES = ("prefill", "draft", "tree_forward", "accept", "cache_update", "catch_up", "decode", ACCOUNTING)
# Device memory the pending cost accounting of a call may keep alive (the target tables of the cycles
# not settled yet) before the loop settles it where it is.
PENDING_BYTES = 256 << 20


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


class CostLedger:
    """The cost accounting of one decoding call (`mars.cost`), deferred out of its timed loop.

    Verification leaves each verdict's cost pending (`defer` for `mars.verify`'s `defer_cost`), the
    stats keep it (`VerifyStats.add`), and `settle` adds it all in one read once the call's `seconds`
    is taken, charged to the ACCOUNTING phase. If the target tables the pending cycles hold exceed
    `PENDING_BYTES`, `record` settles inside the loop: that time then stays in `seconds` (conservative)."""

    def __init__(self, stats: list[VerifyStats], clock: PhaseClock, static: bool):
        self.stats, self.clock, self.retained = stats, clock, 0
        # Static shapes: the target's outputs are buffers the next forward overwrites, so a deferred
        # computation would read a later cycle's logits; the cost is computed in the cycle, as before.
        self.defer = not static

    def record(self, verdicts: list[Verdict]) -> None:
        """After a cycle's verdicts are added to the stats (and a lap): settle if over the budget."""
        self.retained += pending_bytes(verdicts)
        if self.retained > PENDING_BYTES:
            self.settle()

    def settle(self) -> None:
        with self.clock.apart(ACCOUNTING):
            settle_all(self.stats)
        self.retained = 0


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
