"""Paired, alternating timing: how every comparison that decides a setting is measured.

A 2-core machine drifts, and light background work comes in bursts of a second or more. Totals timed at
different moments (every plain configuration first, then every tree) carry a burst into one side only, and
the verdict follows the burst. So a decision is never made on totals. Contenders (plain decodings, trees)
decode the same unit of prompts back to back, in an order that rotates from unit to unit, and a comparison
is judged on the per-unit ratios of their speeds:
- a burst that covers a whole block slows every contender alike and cancels in the ratio;
- one that starts or ends inside a block makes one ratio an outlier, as often in either direction (the order
  rotates), and the trimmed mean (`estimate`) drops it;
- what is left is the prompt-to-prompt spread of the speedup itself, which the interval reports.

Where the machine can say what other processes took of the CPU during a call (Linux, `ForeignLoad`), a call that
another process contended is timed again once the machine is quiet (at most RETIMES times), so that a burst of
background work costs time, not accuracy.

Everything here is pure but `time_block`, which takes the contenders' own timers: a test scripts them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from mars.accounting.timing import ForeignLoad

T = TypeVar("T")
Unit = list[torch.Tensor]  # the prompts decoded together in one timed call (one at batch 1)
# A contender's timed call: (unit, seed, new tokens) -> (tokens decoded, seconds). Seeded per unit, so every
# contender samples with the same seed on the same unit.
Timer = Callable[[Unit, int, int], tuple[int, float]]

TRIM = 0.2  # the share of pairs dropped at each end of the sorted log ratios
RETIMES = 3  # a contended call is timed again at most this many times
LEVEL = 0.90  # two-sided coverage of every interval here (one-sided 95% for "faster than")


@dataclass
class Contender:
    """One configuration in the blocks: its `label` (e.g. "vanilla float32", "float32 6/6/1",
    "generate@bfloat16+avx2") and how to time it."""

    label: str
    time: Timer
    rates: dict[int, float] = field(default_factory=dict)  # unit index -> tokens/s on it
    tokens: int = 0
    seconds: float = 0.0
    retimed: int = 0  # calls timed again because another process contended them
    contended: int = 0  # calls still contended after RETIMES

    @property
    def speed(self) -> float:
        """Tokens/s over everything it decoded (a figure to show, never to decide on)."""
        return self.tokens / self.seconds if self.seconds else 0.0


def time_block(contenders: Sequence[Contender], unit: Unit, index: int, tokens: int,
               load: ForeignLoad | None = None) -> None:
    """Each contender decodes `unit` (the block's `index`-th) once, back to back, the order rotated by `index`
    so that each contender goes first as often as the others; with `load`, a call another process contended is
    timed again once the machine is quiet."""
    k = index % len(contenders)
    for c in [*contenders[k:], *contenders[:k]]:
        decoded, seconds = timed_call(c, unit, index, tokens, load)
        c.tokens += decoded
        c.seconds += seconds
        if seconds > 0 and decoded > 0:
            c.rates[index] = decoded / seconds


def quietly(call: Callable[[], T], seconds_of: Callable[[T], float], load: ForeignLoad | None) -> tuple[T, int, bool]:
    """`call()`, done again (after waiting for quiet) while another process contended it, at most RETIMES times:
    (the last result, how many times it was redone, whether that one was still contended). `seconds_of` reads a
    result's wall time, which the contention is judged against."""
    for attempt in range(RETIMES + 1):
        before = load.sample() if load is not None else None
        result = call()
        if load is None or not load.contended(load.seconds(before, load.sample()), seconds_of(result)):
            return result, attempt, False
        if attempt == RETIMES:
            return result, attempt, True
        load.wait_quiet()
    raise AssertionError("unreachable")


def timed_call(c: Contender, unit: Unit, index: int, tokens: int, load: ForeignLoad | None) -> tuple[int, float]:
    """One call of `c`, timed again (after waiting for quiet) while another process contended it."""
    (decoded, seconds), retimed, contended = quietly(lambda: c.time(unit, index, tokens), lambda r: r[1], load)
    c.retimed += retimed
    c.contended += contended
    return decoded, seconds


def log_ratios(a: Contender, b: Contender) -> list[float]:
    """log(a's speed / b's speed) on every unit both decoded, in unit order."""
    return [math.log(a.rates[u] / b.rates[u]) for u in sorted(a.rates.keys() & b.rates.keys())]


@dataclass(frozen=True)
class Estimate:
    """A ratio of speeds from paired units: the trimmed mean of the log ratios, exponentiated, and its
    LEVEL interval. `log_sd`: the units' spread (winsorised), what a run of other prompts varies by."""

    ratio: float
    low: float
    high: float
    pairs: int
    log_se: float
    log_sd: float

    @property
    def decided(self) -> bool:
        """Whether the interval lies on one side of 1 (faster or slower, beyond the noise)."""
        return self.low > 1.0 or self.high < 1.0

    @property
    def half_width(self) -> float:
        """The interval's larger relative distance from the point estimate."""
        return max(self.high / self.ratio - 1.0, 1.0 - self.low / self.ratio)

    def widened(self, other_se: float, other_df: int) -> Estimate:
        """This estimate with another independent error (log scale, `other_df` degrees of freedom) added to its
        interval, e.g. the run's own prompt-to-prompt spread: what a prediction of a run's figure carries. The
        t quantile takes the Welch-Satterthwaite degrees of freedom of the two errors together."""
        se = math.hypot(self.log_se, other_se)
        mine = self.log_se ** 4 / degrees_of_freedom(self.pairs) + (other_se ** 4 / other_df if other_se else 0.0)
        t = t_quantile(max(round(se ** 4 / mine), 1)) if mine else t_quantile(degrees_of_freedom(self.pairs))
        mean = math.log(self.ratio)
        return Estimate(self.ratio, math.exp(mean - t * se), math.exp(mean + t * se), self.pairs, se, self.log_sd)

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "pairs": self.pairs, "log_se": self.log_se,
                "log_sd": self.log_sd}

    @classmethod
    def from_dict(cls, d: dict) -> Estimate:
        return cls(d["ratio"], d["low"], d["high"], d["pairs"], d["log_se"], d["log_sd"])


def trimmed(n: int) -> int:
    """How many pairs the trimmed mean drops at each end: none below 5 pairs."""
    return int(TRIM * n) if n >= 5 else 0


def degrees_of_freedom(pairs: int) -> int:
    """Of a trimmed mean over `pairs` units (the pairs it keeps, less one), at least 1."""
    return max(pairs - 2 * trimmed(pairs) - 1, 1)


def trimmed_se(sd: float, n: int) -> float:
    """The standard error of a trimmed mean over n units whose winsorised spread is `sd` (Tukey-McLaughlin)."""
    return sd / ((1 - 2 * trimmed(n) / n) * math.sqrt(n))


def t_quantile(df: int, level: float = LEVEL) -> float:
    """Student's t quantile for a two-sided `level` interval (the Cornish-Fisher expansion from the normal's, three
    terms: within 0.5% for df >= 3), so that the library needs no scipy."""
    z = {0.90: 1.6449, 0.95: 1.96}[level]
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def estimate(logs: Sequence[float]) -> Estimate | None:
    """The trimmed mean of `logs` (log ratios of paired units) with its Tukey-McLaughlin standard error (the
    winsorised variance over (1 - 2 g/n)^2 n), as an `Estimate`; None for fewer than 2 pairs."""
    n = len(logs)
    if n < 2:
        return None
    xs, g = sorted(logs), trimmed(n)
    kept = xs[g: n - g]
    mean = sum(kept) / len(kept)
    winsorised = [min(max(x, xs[g]), xs[n - g - 1]) for x in xs]
    w_mean = sum(winsorised) / n
    sd = math.sqrt(sum((x - w_mean) ** 2 for x in winsorised) / (n - 1))
    se = trimmed_se(sd, n)
    t = t_quantile(degrees_of_freedom(n))
    return Estimate(math.exp(mean), math.exp(mean - t * se), math.exp(mean + t * se), n, se, sd)


def compare(a: Contender, b: Contender) -> Estimate | None:
    """a's speed over b's, from the units both decoded."""
    return estimate(log_ratios(a, b))
