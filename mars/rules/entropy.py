"""An entropy gate on the top-2 relaxation (the gate of FLy, arXiv 2511.22972)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from mars.rules import register
from mars.rules.base import Relaxation, Rule, TargetView, check_range


@register
@dataclass(frozen=True)
class EntropyGate(Rule):
    """Where the target's entropy H(p) is at least h nats, accept a drafted top-1 or top-2 outright;
    elsewhere the strict rule. MARS's relaxation behind FLy's gate (greedy: the entropy of the
    temperature-1 distribution). h = inf relaxes nowhere.
    """

    name: ClassVar[str] = "entropy"
    never_relaxes: ClassVar[dict] = {"h": math.inf}
    relaxing: ClassVar[tuple[dict, ...]] = ({"h": 1.0},)
    # The zoo's pilot target had H >= 3 nats at ~90% of greedy and ~75% of sampled positions, so gates
    # below 3 all relax about the same.
    sweep: ClassVar[tuple[dict, ...]] = ({"h": 5.0}, {"h": 4.0}, {"h": 3.0}, {"h": 1.0})
    label: ClassVar[str] = "h"
    h: float = 1.0

    def __post_init__(self):
        check_range(self, "h", 0.0, math.inf, "nats of target entropy from which it relaxes")

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        return ("entropy (nats)", 0.0, 8.0, self.h if math.isfinite(self.h) else None)

    def relax(self, view: TargetView) -> Relaxation:
        gate = view.entropy >= self.h
        top2 = torch.stack([view.top1, view.top2], dim=1)
        outright = view.children_among(top2) & gate[:, None]
        return Relaxation(outright, view.entropy, gate,
                          accepts=lambda nodes: view.vocab_among(top2, nodes) & gate[nodes, None])
