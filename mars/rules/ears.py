"""EARS: entropy/uncertainty-adaptive rejection sampling (arXiv 2512.13194)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mars.rules import register
from mars.rules.base import Relaxation, Rule, TargetView, check_range


@register
@dataclass(frozen=True)
class Ears(Rule):
    """Accept a drafted child x when u < p(x) / q(x) + beta * (1 - max p): the strict test with a
    tolerance that grows with the target's uncertainty (q = 1 for this engine's deterministic drafts,
    and the residual r replaces p after a rejection, as in the strict tree rule).

    Sampling only (its source defines no greedy form). beta = 0 is strict.
    """

    name: ClassVar[str] = "ears"
    greedy_form: ClassVar[bool] = False
    never_relaxes: ClassVar[dict] = {"beta": 0.0}
    relaxing: ClassVar[tuple[dict, ...]] = ({"beta": 0.5},)
    # Around the default 0.1 (the zoo's pilot: 13% to 50% of tokens relaxed); sampling only, so the zoo
    # runs it at T > 0.
    sweep: ClassVar[tuple[dict, ...]] = ({"beta": 0.05}, {"beta": 0.1}, {"beta": 0.3}, {"beta": 0.6})
    label: ClassVar[str] = "beta"
    beta: float = 0.1

    def __post_init__(self):
        check_range(self, "beta", 0.0, 1.0, "the tolerance per unit of the target's uncertainty 1 - max p")

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        return ("1 - max p", 0.0, 1.0, None)

    def relax(self, view: TargetView) -> Relaxation:
        none = Relaxation.none(view)
        uncertainty = 1.0 - view.pmax
        tolerance = self.beta * uncertainty
        nothing = torch.zeros(view.logits.shape[-1], dtype=torch.bool, device=view.logits.device)
        return Relaxation(none.outright, uncertainty, tolerance > 0, tolerance=tolerance,
                          accepts=lambda nodes: nothing.expand(nodes.shape[0], -1))  # no token outright
