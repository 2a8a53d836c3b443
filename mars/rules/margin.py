"""MARS: margin-aware speculative verification (Song et al., Findings of ACL 2026, arXiv 2601.15498)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from mars.rules import register
from mars.rules.base import RESIDUAL, TARGET, Relaxation, Rule, TargetView, check_choice, check_range

MARGINS = ("logit_ratio", "prob_ratio", "logprob_gap")
FALLBACKS = ("strict", "reference")
# The range of theta in which each margin metric means something (inclusive).
THETA_RANGES = {"logit_ratio": (0.0, 1.0), "prob_ratio": (0.0, 1.0), "logprob_gap": (0.0, math.inf)}
# The range a histogram of each metric shows (values outside land in the end bins).
PLOT_RANGES = {"logit_ratio": (-0.5, 1.5), "prob_ratio": (0.0, 1.0), "logprob_gap": (0.0, 10.0)}


@dataclass
class Margins:
    """The margin metric at every node (over processed logits z, z1 >= z2 the top two)."""

    value: torch.Tensor  # [n] the metric's value
    relax_allowed: torch.Tensor  # [n] bool: the test passes (target undecided here), relaxation allowed
    nonfinite: torch.Tensor  # [n] bool: z1 or z2 not finite (e.g. filtered by top-k/top-p): never relaxed
    negative: torch.Tensor  # [n] bool: z1 <= 0, where the logit ratio's meaning inverts


def margin_test(logits: torch.Tensor, theta: float, margin: str, top: torch.Tensor | None = None) -> Margins:
    """The MARS test at every position of `logits` [n, V] (processed); `top` [n, 2]: their two
    largest values if the caller has them.

    - logit_ratio (the paper's): value z2 / (z1 + 1e-10), relax when value > theta. With z1 > 0 it
      is in [.., 1] and near 1 means undecided. When z1 <= 0 the ratio inverts (both negative:
      ratio >= 1, so it always passes; z1 near 0: it explodes). The MARS code applies it as is, and
      so do we, counting such positions in `negative_logit` so that they can be reported.
    - prob_ratio: p2 / p1 = exp(z2 - z1) in (0, 1], relax when above theta. Scale-free, but it
      depends on the temperature (at temperature 0 it is taken at temperature 1).
    - logprob_gap: log p1 - log p2 = z1 - z2 >= 0, relax when below theta.
    A position whose z1 or z2 is not finite never passes (z2 = -inf means the filter left one token).
    """
    top = logits.topk(2, dim=-1).values if top is None else top
    z1, z2 = top[..., 0], top[..., 1]
    nonfinite = ~(torch.isfinite(z1) & torch.isfinite(z2))
    if margin == "logit_ratio":
        value = z2 / (z1 + 1e-10)
        passes = value > theta
    elif margin == "prob_ratio":
        value = torch.exp(z2 - z1)
        passes = value > theta
    else:
        value = z1 - z2
        passes = value < theta
    return Margins(value, passes & ~nonfinite, nonfinite, z1 <= 0)


@register
@dataclass(frozen=True)
class Mars(Rule):
    """Where the target is undecided (the margin test passes), a drafted token equal to the target's
    top-1 or top-2 is accepted; elsewhere the strict rule applies, with the same random draws.

    Sampling: where the test passes, a child that is the target's top-1 or top-2 is accepted outright
    when its turn comes (children are tried in draft order). With fallback "strict" the other
    children go through the strict test; with "reference" they are rejected and, if no child is
    top-1/2, the token is drawn from p unadjusted (the MARS code's behaviour on one path).
    """

    name: ClassVar[str] = "mars"
    never_relaxes: ClassVar[dict] = {"theta": 1.0, "margin": "prob_ratio"}
    relaxing: ClassVar[tuple[dict, ...]] = ({"theta": 0.5}, {"theta": 0.5, "fallback": "reference"})
    # From near strict through the paper's 0.9 (its ablation sweeps 0.84-0.98) to relaxing where the target
    # is far from undecided (the zoo's pilot, T=1: 25% of tokens relaxed at 0.95, 70% at 0.6).
    sweep: ClassVar[tuple[dict, ...]] = ({"theta": 0.98}, {"theta": 0.9}, {"theta": 0.8}, {"theta": 0.6})
    label: ClassVar[str] = "theta"
    # From relaxing wherever the runner-up is within half the top logit to the paper's ablation's strictest
    budget_grid: ClassVar[tuple[float, ...]] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
    theta: float = 0.9  # relax where z2 / z1 > theta (logprob_gap: where z1 - z2 < theta)
    margin: str = "logit_ratio"
    fallback: str = "strict"  # sampling only: strict | reference

    def __post_init__(self):
        check_choice(self, "margin", MARGINS)
        check_choice(self, "fallback", FALLBACKS)
        lo, hi = THETA_RANGES[self.margin]
        check_range(self, "theta", lo, hi, f"the meaningful range for margin {self.margin!r}: logit_ratio and "
                                           "prob_ratio in [0, 1], relax when above; logprob_gap >= 0, relax when below")

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        return (self.margin, *PLOT_RANGES[self.margin], self.theta)

    def relax(self, view: TargetView) -> Relaxation:
        m = margin_test(view.logits, self.theta, self.margin, view.top_two.values)
        top2 = torch.stack([view.top1, view.top2], dim=1)
        outright = view.children_among(top2) & m.relax_allowed[:, None]
        if self.fallback == "reference":  # where the test passes only a top-1/2 child is accepted; else draw from p
            tested, fallback = ~m.relax_allowed, torch.where(m.relax_allowed, TARGET, RESIDUAL)
        else:
            tested = fallback = None
        return Relaxation(outright, m.value, m.relax_allowed, tested=tested, fallback=fallback,
                          counters={"nonfinite": m.nonfinite, "negative_logit": m.negative},
                          accepts=lambda nodes: view.vocab_among(top2, nodes) & m.relax_allowed[nodes, None])
