"""Per-generation and per-run statistics of verification: what was accepted, where, why, and at what cost."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mars.accounting.deferred import PendingCost, settle


class Judged(Protocol):
    """A verdict as the statistics read it (`mars.verification.verify.Verdict`, a room above this one): its
    verified positions (`Step`s), whether their costs bound the cost from above, and its deferred cost."""

    steps: list[Any]
    cost_bound: bool
    pending: PendingCost | None


@dataclass
class VerifyStats:
    """Counts over verified positions; `merge` adds runs together.

    A position is a node on an accepted path whose children the target judged; each emits one token.
    Per depth d: `attempts[d]` positions at depth d that had drafted children, `accepts[d]` of them
    accepted one, `relaxed[d]` of them only through the rule's relaxation. `gates` keeps every
    position's gate metric (MARS: the margin; for histograms); `relax_allowed` how many the gate
    opened; `counters` the rule's own facts (MARS: `nonfinite` top-1/top-2 logits, never relaxed, and
    `negative_logit`, a top-1 logit <= 0 where the logit ratio's meaning inverts). `accepted_ranks[r]`:
    positions whose accepted child was its parent's r-th in draft order (what sizes sampled trees,
    `eagle.sampled_trees.best_topology`).

    Cost of the relaxation per emitted token (`mars.accounting.cost`): sampled positions add TV(pi, p) and
    KL(pi || p) of the exact emitted distribution (`kl_infinite` counts tokens outside p's support,
    left out of `kl_sum`; `bounded` counts those whose TV and KL are upper bounds, from sampled drafts,
    see `mars.accounting.cost.sampling_cost`); greedy positions add whether the token is not the argmax and its regret.
    A verdict with a deferred cost (`Verdict.pending`) adds its cost only when settled
    (`mars.accounting.deferred.settle`, one read for every pending verdict); until then tv_sum, kl_sum,
    kl_infinite, mismatches and regret_sum leave it out. `merge`, `cost` and `to_json` settle first;
    the pending list is never serialised.
    """

    attempts: Counter = field(default_factory=Counter)
    accepts: Counter = field(default_factory=Counter)
    relaxed: Counter = field(default_factory=Counter)
    gates: list[float] = field(default_factory=list)
    relax_allowed: int = 0
    positions: int = 0
    counters: Counter = field(default_factory=Counter)
    sampled: int = 0  # positions verified by sampling (the rest greedily)
    tv_sum: float = 0.0
    kl_sum: float = 0.0
    kl_infinite: int = 0
    mismatches: int = 0
    regret_sum: float = 0.0
    bounded: int = 0
    accepted_ranks: Counter = field(default_factory=Counter)
    # Deferred costs not added yet: (a verdict's pending cost, how many of its steps were recorded).
    pending: list[tuple[PendingCost, int]] = field(default_factory=list, repr=False, compare=False)

    def add(self, verdict: Judged, keep_steps: int | None = None, sampled: bool = False) -> None:
        """Record a verdict's steps (only the first `keep_steps`, when output was cut short); a deferred
        cost is kept for `settle`."""
        steps = verdict.steps[:keep_steps]
        if verdict.pending is not None and steps:
            self.pending.append((verdict.pending, len(steps)))
        for step in steps:
            self.positions += 1
            self.sampled += sampled
            self.bounded += sampled and verdict.cost_bound
            self.gates.append(step.gate)
            self.relax_allowed += step.relax_allowed
            self.counters.update({k: int(v) for k, v in step.counters.items()})
            if verdict.pending is None:
                self.add_cost(step.tv, step.kl, step.mismatch, step.regret)
            if step.rank is not None:
                self.accepted_ranks[step.rank] += 1
            if step.has_children:
                self.attempts[step.depth] += 1
                self.accepts[step.depth] += step.child_accepted
                self.relaxed[step.depth] += step.relaxed

    def add_cost(self, tv: float, kl: float, mismatch: bool, regret: float) -> None:
        """One emitted token's cost (`mars.accounting.cost.Cost`): from its step, or settled
        (`mars.accounting.deferred`)."""
        self.tv_sum += tv
        self.regret_sum += regret
        self.mismatches += mismatch
        if math.isinf(kl):
            self.kl_infinite += 1
        else:
            self.kl_sum += kl

    def merge(self, other: VerifyStats) -> None:
        settle([self, other])  # both, in one read
        self.attempts.update(other.attempts)
        self.accepts.update(other.accepts)
        self.relaxed.update(other.relaxed)
        self.accepted_ranks.update(other.accepted_ranks)
        self.gates.extend(other.gates)
        self.counters.update(other.counters)
        for name in ("relax_allowed", "positions", "sampled", "bounded", "tv_sum", "kl_sum", "kl_infinite",
                     "mismatches", "regret_sum"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance_rate_by_depth(self) -> dict[int, float]:
        return {d: self.accepts[d] / n for d, n in sorted(self.attempts.items()) if n}

    @property
    def acceptance_by_rank(self) -> dict[int, float]:
        """P(the accepted child is its parent's r-th | a position with children), per rank r."""
        n = sum(self.attempts.values())
        return {r: self.accepted_ranks[r] / n for r in sorted(self.accepted_ranks)} if n else {}

    @property
    def relaxed_tokens(self) -> int:
        return sum(self.relaxed.values())

    def cost(self) -> dict:
        """Per emitted token: tv_per_token over sampled positions; kl_per_token, the mean KL over the
        sampled positions whose KL is finite, and kl_infinite_tokens, how many are not (where it is > 0
        the KL per token is +inf and kl_per_token no bound on it: the reports add "(+∞ on N tokens)");
        argmax_mismatch and logprob_regret over greedy positions (None without any). cost_bound_tokens:
        sampled positions whose tv/kl are upper bounds (sampled drafts); when it equals the sampled
        positions, tv_per_token (and kl_per_token, if no KL is infinite) are upper bounds on the cost."""
        settle([self])
        greedy = self.positions - self.sampled
        finite = self.sampled - self.kl_infinite
        return {
            "tv_per_token": self.tv_sum / self.sampled if self.sampled else None,
            "kl_per_token": self.kl_sum / finite if finite else None,
            "kl_infinite_tokens": self.kl_infinite,
            "cost_bound_tokens": self.bounded,
            "argmax_mismatch": self.mismatches / greedy if greedy else None,
            "logprob_regret": self.regret_sum / greedy if greedy else None,
        }

    def to_json(self) -> dict:
        """Every count, JSON-ready. Gate values are rounded to 4 decimals; non-finite ones are left out
        of the list (JSON has no inf/nan)."""
        settle([self])
        return {
            "attempts": dict(self.attempts),
            "accepts": dict(self.accepts),
            "relaxed": dict(self.relaxed),
            "accepted_ranks": dict(self.accepted_ranks),
            "gates": [round(m, 4) for m in self.gates if math.isfinite(m)],
            "relax_allowed": self.relax_allowed,
            "positions": self.positions,
            "counters": dict(self.counters),
            "sampled": self.sampled, "bounded": self.bounded, "tv_sum": self.tv_sum, "kl_sum": self.kl_sum,
            "kl_infinite": self.kl_infinite,
            "mismatches": self.mismatches, "regret_sum": self.regret_sum,
        }

    @classmethod
    def from_json(cls, d: dict) -> VerifyStats:
        """The inverse of `to_json` (JSON object keys are strings; depths come back as ints). Reads the
        layout before rules were plugins too (`margins`, `nonfinite`, `negative_logit`; no costs)."""
        def counter(x: dict) -> Counter:
            return Counter({int(k): v for k, v in x.items()})

        counters = Counter(d.get("counters", {}))
        for old in ("nonfinite", "negative_logit"):
            if d.get(old):
                counters[old] += d[old]
        return cls(attempts=counter(d["attempts"]), accepts=counter(d["accepts"]), relaxed=counter(d["relaxed"]),
                   accepted_ranks=counter(d.get("accepted_ranks", {})),
                   gates=list(d.get("gates", d.get("margins", []))), relax_allowed=d["relax_allowed"],
                   positions=d["positions"], counters=counters, sampled=d.get("sampled", 0),
                   bounded=d.get("bounded", 0),
                   tv_sum=d.get("tv_sum", 0.0), kl_sum=d.get("kl_sum", 0.0), kl_infinite=d.get("kl_infinite", 0),
                   mismatches=d.get("mismatches", 0), regret_sum=d.get("regret_sum", 0.0))

    def summary(self) -> dict:
        return {
            "positions": self.positions,
            "relax_allowed_frac": self.relax_allowed / self.positions if self.positions else 0.0,
            "relaxed_tokens": self.relaxed_tokens,
            "relaxed_by_depth": dict(sorted(self.relaxed.items())),
            "acceptance_rate_by_depth": self.acceptance_rate_by_depth,
            "acceptance_by_rank": self.acceptance_by_rank,
            **{f"{k}_positions": v for k, v in sorted(self.counters.items())},
            **self.cost(),
        }



def chi_square_pvalue(counts: Counter, probs: dict, min_expected: float = 5.0) -> float:
    """Pearson's goodness of fit of observed `counts` to the distribution `probs` (same keys; missing = 0).

    How losslessness is tested on samples: `probs` is the distribution the target defines, `counts` what a
    sampler emitted. Cells expected fewer than `min_expected` times are pooled into one (merged with the
    smallest remaining cell if the pool itself is too small), so that the chi-square law holds. An
    observation in a cell of probability 0 fails outright (p = 0). The p-value is the chi-square survival
    function, Q(k / 2, x / 2) (torch's regularised upper incomplete gamma, in float64).
    """
    n = sum(counts.values())
    total = sum(probs.values())
    if not math.isclose(total, 1.0, abs_tol=1e-4):
        raise ValueError(f"probs must sum to 1 (got {total}): give every cell, with the rest of the mass as one")
    if any(probs.get(key, 0.0) <= 0 for key in counts):
        return 0.0
    cells = sorted(probs, key=lambda k: probs[k])
    expected = [n * probs[k] / total for k in cells]
    observed = [counts.get(k, 0) for k in cells]
    obs = [o for o, e in zip(observed, expected, strict=True) if e >= min_expected]
    exp = [e for e in expected if e >= min_expected]
    pool_obs = sum(o for o, e in zip(observed, expected, strict=True) if e < min_expected)
    pool_exp = sum(e for e in expected if e < min_expected)
    if pool_exp > 0:
        if pool_exp < min_expected and exp:  # merge the pool with the smallest big cell
            pool_obs, pool_exp = pool_obs + obs.pop(0), pool_exp + exp.pop(0)
        obs.append(pool_obs)
        exp.append(pool_exp)
    if len(obs) < 2:
        raise ValueError(f"{len(obs)} cell(s) after pooling those expected < {min_expected} times: draw more samples")
    scale = sum(obs) / sum(exp)  # guard rounding of the expected total
    statistic = sum((o - e * scale) ** 2 / (e * scale) for o, e in zip(obs, exp, strict=True))
    dof = torch.tensor((len(obs) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(statistic / 2, dtype=torch.float64)))
