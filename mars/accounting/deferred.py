"""Deferred cost accounting: a relaxation's cost (`mars.accounting.cost`) kept out of a decoding loop, settled after it.

The cost is measurement, not decision (nothing in verification reads it), so a loop need not pay for
it in its cycles. With `defer_cost=True`, `mars.verification.verify` neither computes nor reads a forest's cost:
it wraps the computation in a `ForestCost` (run once, when first asked for) and gives each verdict a
`PendingCost`, its share of that forest's flattened chain. `VerifyStats.add` keeps the shares;
`settle` computes them and adds them to the stats in one device-to-host read (the stats settle
themselves before they merge or report). `CostLedger` is a
decoding call's use of it: settle once the call's `seconds` is taken, or inside the loop when the
target tables the pending computations keep alive exceed `PENDING_BYTES`.

Invariants (tests/test_deferred_cost.py):
- settling adds to each `VerifyStats` exactly what computing the cost in the cycle adds, in the same
  order (the same float sums, not merely close ones);
- one read per `settle`, however many verdicts, forests and stats it covers;
- a lossless rule (strict) leaves nothing pending: it has no cost.

This module sits below the verifier and the stats (both import it), so it names what it needs of
them structurally (`Accounts`, `Deferring`) rather than importing them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from mars.accounting.cost import Cost
from mars.accounting.timing import ACCOUNTING, PhaseClock

if TYPE_CHECKING:
    from mars.rules.base import TargetView

# Device memory the pending cost accounting of a call may keep alive (the target tables of the cycles
# not settled yet) before the loop settles it where it is.
PENDING_BYTES = 256 << 20


class ForestCost:
    """The cost (`mars.accounting.cost.Cost`) at every chain node of one verified forest, flattened [B L], computed
    by `compute` when first asked for and kept; the closure (and the target tables it holds) is then
    dropped."""

    def __init__(self, compute: Callable[[], Cost], nbytes: int):
        self._compute: Callable[[], Cost] | None = compute
        self._cost: Cost | None = None
        self.nbytes = nbytes  # device memory kept alive until computed (estimated: `retained_bytes`)

    def cost(self) -> Cost:
        if self._cost is None:
            self._cost, self._compute, self.nbytes = self._compute(), None, 0
        return self._cost

    def share(self, start: int) -> PendingCost:
        """A verdict's share: its steps' entries in the flattened chain, from `start` on."""
        return PendingCost(self, start)


@dataclass(frozen=True)
class PendingCost:
    """A verdict's deferred cost: its steps' entries in its forest's flattened chain, from `start` on."""

    forest: ForestCost
    start: int

    def columns(self, count: int) -> torch.Tensor:
        """[4, count] float64 on the device: tv, kl, mismatch and regret of the verdict's first `count` steps."""
        cost = self.forest.cost()
        at = slice(self.start, self.start + count)
        return torch.stack([cost.tv[at], cost.kl[at], cost.mismatch[at], cost.regret[at]]).double()


def retained_bytes(view: TargetView) -> int:
    """Device memory a deferred cost keeps alive by holding `view`: its tensors, those cached so far
    included (the [n, V] tables dominate: logits, draft, probabilities, the trial's residuals)."""
    values = [x for v in vars(view).values() for x in (v if isinstance(v, tuple) else (v,))]
    return sum(t.nbytes for t in values if isinstance(t, torch.Tensor))


def cost_now_or_later(compute: Callable[[], Cost], view: TargetView, lossless: bool,
                      defer: bool) -> tuple[Cost | None, ForestCost | None]:
    """(the forest's cost, None) computed now, to be read with the verdicts; or (None, its deferred
    computation) with `defer`; (None, None) for a deferred lossless rule, which has no cost to account."""
    if not defer:
        return compute(), None
    return None, None if lossless else ForestCost(compute, retained_bytes(view))


class Deferring(Protocol):
    """A verdict as the accounting sees it (`mars.verification.verify.Verdict`): its share of a deferred cost,
    if any."""

    pending: PendingCost | None


class Accounts(Protocol):
    """Statistics that keep deferred costs until settled (`mars.accounting.stats.VerifyStats`): (a verdict's share,
    how many of its steps were recorded), and how a settled token's cost is added."""

    pending: list[tuple[PendingCost, int]]

    def add_cost(self, tv: float, kl: float, mismatch: bool, regret: float) -> None: ...


def pending_bytes(verdicts: Iterable[Deferring]) -> int:
    """Device memory the deferred costs of `verdicts` keep alive (each forest's counted once)."""
    forests = {id(v.pending.forest): v.pending.forest for v in verdicts if v.pending is not None}
    return sum(f.nbytes for f in forests.values())


def settle(stats: Iterable[Accounts]) -> None:
    """Compute the deferred costs of `stats` (each forest's once) and add them as `VerifyStats.add`
    adds a computed one (`add_cost`), in the order they were recorded, reading all of them to the host in one
    transfer; the pending references (and the target tables they hold) are dropped."""
    stats = [s for s in stats if s.pending]
    if not stats:
        return
    tv, kl, mismatch, regret = torch.cat([p.columns(n) for s in stats for p, n in s.pending], dim=1).tolist()
    at = 0
    for s in stats:
        count = sum(n for _, n in s.pending)
        for i in range(at, at + count):
            s.add_cost(tv[i], kl[i], bool(mismatch[i]), regret[i])
        at += count
        s.pending = []


class CostLedger:
    """The cost accounting of one decoding call, deferred out of its timed loop.

    Verification leaves each verdict's cost pending (`defer` for `mars.verification.verify`'s `defer_cost`), the
    stats keep it (`VerifyStats.add`), and `settle` adds it all in one read once the call's `seconds`
    is taken, charged to the ACCOUNTING phase. If the target tables the pending cycles hold exceed
    `PENDING_BYTES`, `record` settles inside the loop: that time then stays in `seconds` (conservative)."""

    def __init__(self, stats: list[Accounts], clock: PhaseClock, static: bool):
        self.stats, self.clock, self.retained = stats, clock, 0
        # Static shapes: the target's outputs are buffers the next forward overwrites, so a deferred
        # computation would read a later cycle's logits; the cost is computed in the cycle, as before.
        self.defer = not static

    def record(self, verdicts: list[Deferring]) -> None:
        """After a cycle's verdicts are added to the stats (and a lap): settle if over the budget."""
        self.retained += pending_bytes(verdicts)
        if self.retained > PENDING_BYTES:
            self.settle()

    def settle(self) -> None:
        with self.clock.apart(ACCOUNTING):
            settle(self.stats)
        self.retained = 0
