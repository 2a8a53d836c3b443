"""Per-generation and per-run statistics of verification: what was accepted, where, and why."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from mars.verify import Verdict


@dataclass
class VerifyStats:
    """Counts over verified positions; `merge` adds runs together.

    A position is a node on an accepted path whose children the target judged. Per depth d:
    `attempts[d]` positions at depth d that had drafted children, `accepts[d]` of them accepted one,
    `relaxed[d]` of them only through the MARS relaxation. `margins` keeps every verified
    position's margin value (for histograms); `relax_allowed` how many passed the margin test;
    `nonfinite` how many had a non-finite top-1 or top-2 logit (never relaxed), `negative_logit`
    how many had a top-1 logit <= 0, where the logit ratio's meaning inverts.
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

    def to_json(self) -> dict:
        """Every count, JSON-ready. Margins are rounded to 4 decimals; non-finite ones are left out of
        the list (JSON has no inf/nan) but counted in `nonfinite`."""
        return {
            "attempts": dict(self.attempts),
            "accepts": dict(self.accepts),
            "relaxed": dict(self.relaxed),
            "margins": [round(m, 4) for m in self.margins if math.isfinite(m)],
            "relax_allowed": self.relax_allowed,
            "positions": self.positions,
            "nonfinite": self.nonfinite,
            "negative_logit": self.negative_logit,
        }

    @classmethod
    def from_json(cls, d: dict) -> VerifyStats:
        """The inverse of `to_json` (JSON object keys are strings; depths come back as ints)."""
        def counter(x: dict) -> Counter:
            return Counter({int(k): v for k, v in x.items()})

        return cls(attempts=counter(d["attempts"]), accepts=counter(d["accepts"]), relaxed=counter(d["relaxed"]),
                   margins=list(d["margins"]), relax_allowed=d["relax_allowed"], positions=d["positions"],
                   nonfinite=d.get("nonfinite", 0), negative_logit=d.get("negative_logit", 0))

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
