"""Typical acceptance (Cai et al. 2024, "Medusa", arXiv 2401.10774, section 3.3.1; vLLM's former
TypicalAcceptanceSampler with posterior_threshold epsilon and posterior_alpha delta)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from mars.rules import register
from mars.rules.base import ARGMAX, Relaxation, Rule, TargetView, check_choice, check_range


@register
@dataclass(frozen=True)
class Typical(Rule):
    """Accept a drafted token x outright where p(x) > min(epsilon, delta * exp(-H(p))): plausible
    enough, with a bar that drops as the target grows unsure.

    Open detail, chosen here: Medusa and vLLM reject the other children without a test and emit the
    target's argmax (fallback "reference"); by default ("strict") the children that miss the bar go
    through the strict rule, so that the rule is a relaxation of strict (it equals strict where no
    child clears the bar, and never relaxes at epsilon = 1, delta = inf). Greedy form: the same bar
    on the temperature-1 distribution.
    """

    name: ClassVar[str] = "typical"
    never_relaxes: ClassVar[dict] = {"epsilon": 1.0, "delta": math.inf}
    relaxing: ClassVar[tuple[dict, ...]] = ({"epsilon": 0.3, "delta": 0.5}, {"epsilon": 0.3, "fallback": "reference"})
    # epsilon 0.5, 0.3, 0.15 with delta = 100, then Medusa's default (0.09, 0.3). The bar is
    # min(epsilon, delta exp(-H)), and at Medusa's delta (with or without its delta = sqrt(epsilon)) the
    # entropy term sets it on a flat target whatever epsilon: in the zoo's pilot epsilon 0.25 ... 0.04 with
    # delta = sqrt(epsilon) emitted the same tokens (72% relaxed at T=1, 13% at T=0). delta = 100 takes the
    # entropy term out of play below H ~ 5 nats, so that epsilon alone (Medusa's posterior threshold) spans
    # mild to aggressive.
    sweep: ClassVar[tuple[dict, ...]] = ({"epsilon": 0.5, "delta": 100.0}, {"epsilon": 0.3, "delta": 100.0},
                                         {"epsilon": 0.15, "delta": 100.0}, {"epsilon": 0.09, "delta": 0.3})
    label: ClassVar[str] = "epsilon"
    epsilon: float = 0.09  # Medusa's posterior_threshold
    delta: float = 0.3  # Medusa's posterior_alpha (sqrt(epsilon) in the paper)
    fallback: str = "strict"  # sampling: strict | reference (reject the rest, emit the argmax)

    def __post_init__(self):
        check_range(self, "epsilon", 0.0, 1.0, "the hard bar on p(x)")
        check_range(self, "delta", 0.0, math.inf, "the entropy-scaled bar's factor")
        check_choice(self, "fallback", ("strict", "reference"))

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        return ("bar min(epsilon, delta exp(-H))", 0.0, self.epsilon, None)

    def relax(self, view: TargetView) -> Relaxation:
        bar = torch.clamp(self.delta * torch.exp(-view.entropy), max=self.epsilon)
        outright = view.child_probs > bar[:, None]
        if self.fallback == "reference":
            tested = torch.zeros_like(bar, dtype=torch.bool)
            fallback = torch.full_like(bar, ARGMAX, dtype=torch.long)
        else:
            tested = fallback = None
        return Relaxation(outright, bar, view.pmax > bar, tested=tested, fallback=fallback,
                          accepts=lambda nodes: view.probs[nodes] > bar[nodes, None])
