"""Per-generation and per-run statistics of verification: what was accepted, where, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mars.verify import Verdict


@dataclass
class VerifyStats:
    """Counts over verified positions; `merge` adds runs together.

    A position is a node on an accepted path whose children the target judged. Per depth d:
    `attempts[d]` positions at depth d that had drafted children, `accepts[d]` of them accepted one,
    `relaxed[d]` of them only through the MARS relaxation. `margins` keeps every verified
    position's margin value (for histograms); `relax_allowed` how many passed the margin test.
    """

    attempts: Counter = field(default_factory=Counter)
    accepts: Counter = field(default_factory=Counter)
    relaxed: Counter = field(default_factory=Counter)
    margins: list[float] = field(default_factory=list)
    relax_allowed: int = 0
    positions: int = 0
    nonfinite: int = 0
    negative_logit: int = 0

    def add(self, verdict: Verdict, keep_steps: int | None = None) -> None:
        """Record a verdict's steps (only the first `keep_steps`, when output was cut short)."""
        for step in verdict.steps[:keep_steps]:
            self.positions += 1
            self.margins.append(step.margin)
            self.relax_allowed += step.relax_allowed
            self.nonfinite += step.nonfinite
            self.negative_logit += step.negative
            if step.has_children:
                self.attempts[step.depth] += 1
                self.accepts[step.depth] += step.accepted
                self.relaxed[step.depth] += step.relaxed

    def merge(self, other: VerifyStats) -> None:
        self.attempts.update(other.attempts)
        self.accepts.update(other.accepts)
        self.relaxed.update(other.relaxed)
        self.margins.extend(other.margins)
        for name in ("relax_allowed", "positions", "nonfinite", "negative_logit"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance_rate_by_depth(self) -> dict[int, float]:
        return {d: self.accepts[d] / n for d, n in sorted(self.attempts.items()) if n}

    @property
    def relaxed_tokens(self) -> int:
        return sum(self.relaxed.values())

    def summary(self) -> dict:
        return {
            "positions": self.positions,
            "relax_allowed_frac": self.relax_allowed / self.positions if self.positions else 0.0,
            "relaxed_tokens": self.relaxed_tokens,
            "relaxed_by_depth": dict(sorted(self.relaxed.items())),
            "acceptance_rate_by_depth": self.acceptance_rate_by_depth,
            "nonfinite_margin_positions": self.nonfinite,
            "negative_logit_positions": self.negative_logit,
        }
