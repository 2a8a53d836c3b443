"""How a decoding call's phases are timed (`PhaseClock`, the phase names), what keeps Python's collector
out of every timed decoding (`frozen_heap`), and what other processes took of the CPU meanwhile
(`ForeignLoad`)."""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


# --- foreign load: CPU time other processes took while a call was timed --------------------------------

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CONTENDED_SHARE = 0.1  # a call is contended where others took more than this share of one CPU during it
# MARS_FOREIGN_LOAD=off: nothing is foreign (as without /proc). For a machine shared on purpose, e.g. the test
# suite's parallel workers, whose load is the point and would have every timing wait for a quiet that never comes.
FOREIGN_LOAD = "MARS_FOREIGN_LOAD"


def busy_ticks() -> int | None:
    """Every CPU's busy time so far (user, nice, system, irq, softirq, steal), in clock ticks; None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal


def process_ticks(pid: int) -> int | None:
    """A process's CPU time so far (utime + stime, every thread), in clock ticks; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])


class ForeignLoad:
    """How much CPU time processes that are not ours took during a section: the machine's busy time less ours
    (this process, and the pids `ours()` names: worker processes being timed). Light background work (a file
    search, another program) slows a decoding on 2 cores by more than its share, and only where it lands: a
    timing it touched is redone once the machine is quiet (`mars.tuning.pairs.time_block`). None without /proc."""

    def __init__(self, ours: Callable[[], Iterable[int]] = tuple):
        self.ours = ours

    def sample(self) -> tuple[int, int] | None:
        if os.environ.get(FOREIGN_LOAD) == "off":
            return None
        busy = busy_ticks()
        if busy is None:
            return None
        return busy, sum(t for pid in {os.getpid(), *self.ours()} if (t := process_ticks(pid)) is not None)

    def seconds(self, before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
        """Foreign CPU seconds between two samples."""
        if before is None or after is None:
            return None
        return max((after[0] - before[0]) - (after[1] - before[1]), 0) / TICK

    @staticmethod
    def contended(foreign: float | None, wall: float) -> bool:
        # Slack of two ticks: the kernel charges CPU time a tick at a time, and its own threads take a few.
        return foreign is not None and foreign > CONTENDED_SHARE * wall + 2 / TICK

    def wait_quiet(self, window: float = 0.2, limit: float = 4.0) -> bool:
        """Wait until others take less than CONTENDED_SHARE of a CPU over `window` seconds; False after `limit`."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            before = self.sample()
            time.sleep(window)
            if not self.contended(self.seconds(before, self.sample()), window):
                return True
        return False
