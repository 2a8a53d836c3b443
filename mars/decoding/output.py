"""What a decoding call returns (`GenerationOutput`): its tokens, how each cycle was accepted, its time,
and the bookkeeping that fills them (`emit`, `done`, `record_cycle`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mars.accounting.stats import VerifyStats

if TYPE_CHECKING:  # the result type describes verdicts; it does not run the verifier
    from mars.verification.verify import Verdict


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

    def emit(self, new: list[int], eos: frozenset[int], max_new_tokens: int) -> int:
        """Append what may be emitted of `new`: up to `max_new_tokens` in all, through the first of the
        `eos` ids. Returns how many tokens were taken."""
        taken = new[: max_new_tokens - len(self.tokens)]
        for i, token in enumerate(taken):
            if token in eos:
                taken = taken[: i + 1]
                self.stopped_by = "eos"
                break
        self.tokens.extend(taken)
        return len(taken)

    def done(self, max_new_tokens: int) -> bool:
        return self.stopped_by == "eos" or len(self.tokens) >= max_new_tokens

    def record_cycle(self, verdict: Verdict | None, emitted: int, levels: int, sampled: bool) -> None:
        """One draft-verify cycle that emitted `emitted` tokens from a tree of `levels` draft levels
        (`verdict` None, levels 0: a plain decoding step)."""
        self.num_cycles += 1
        self.draft_depths.append(levels)
        if verdict is None:
            self.accept_lengths.append(0)
            return
        self.accept_lengths.append(min(verdict.accepted, emitted))
        self.stats.add(verdict, keep_steps=emitted, sampled=sampled)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per draft-verify cycle (the prefill's first token is in no cycle)."""
        return (len(self.tokens) - 1) / self.num_cycles if self.num_cycles else 1.0

    @property
    def relaxed_tokens(self) -> int:
        """Tokens accepted only because of the MARS relaxation."""
        return self.stats.relaxed_tokens
