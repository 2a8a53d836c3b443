"""Top-m acceptance with a probability floor (the accept thresholds production servers expose, e.g.
SGLang's speculative accept thresholds; cf. the top-k verification of Lookahead/REST-style systems)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mars.rules import register
from mars.rules.base import Relaxation, Rule, TargetView, check_range


@register
@dataclass(frozen=True)
class TopM(Rule):
    """Accept outright a drafted token among the target's m most likely with p(x) >= alpha * max p;
    other children go through the strict rule.

    Greedy form: the same test on the temperature-1 distribution (m = 1 is then strict). When
    sampling, accepting the top-1 outright is already a relaxation; m = 0 relaxes nowhere.
    """

    name: ClassVar[str] = "topm"
    never_relaxes: ClassVar[dict] = {"m": 0}
    relaxing: ClassVar[tuple[dict, ...]] = ({"m": 2, "alpha": 0.3},)
    # A runner-up within alpha of the top token's probability, then three candidates; (2, 0.5) is the
    # default. Greedy it spans 4-10% relaxed in the zoo's pilot; when sampling, accepting a drafted top-1
    # outright is already most of the relaxation.
    sweep: ClassVar[tuple[dict, ...]] = ({"m": 2, "alpha": 0.7}, {"m": 2, "alpha": 0.5}, {"m": 2, "alpha": 0.3},
                                         {"m": 3, "alpha": 0.2})
    label: ClassVar[str] = "m"
    m: int = 2
    alpha: float = 0.5

    def __post_init__(self):
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 0:
            raise ValueError(f"topm.m={self.m!r} must be an integer >= 0 (0: never relax)")
        check_range(self, "alpha", 0.0, 1.0, "the floor on p(x) relative to the top-1's probability")

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        return ("p2 / p1", 0.0, 1.0, self.alpha)

    def relax(self, view: TargetView) -> Relaxation:
        m = min(self.m, view.logits.shape[-1])
        floor = self.alpha * view.pmax
        if m == 0:
            return Relaxation.none(view)
        top = view.logits.topk(m, dim=-1)
        outright = view.children_among(top.indices) & (view.child_probs >= floor[:, None])
        runner_up = view.probs.gather(1, view.top2[:, None])[:, 0] / view.pmax.clamp(min=1e-30)
        # Allowed where a token other than the argmax qualifies (greedy), or anywhere (sampling).
        relax_allowed = (view.pmax > 0) if not view.greedy else (runner_up >= self.alpha) & (m >= 2)
        return Relaxation(outright, runner_up, relax_allowed, accepts=lambda nodes: view.vocab_among(top.indices, nodes)
                          & (view.probs[nodes] >= floor[nodes, None]))
