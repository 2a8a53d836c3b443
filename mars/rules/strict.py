"""The strict rule: greedy exact match, or lossless tree speculative sampling (`mars.verification.verify`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mars.rules import register
from mars.rules.base import Relaxation, Rule, TargetView


@register
@dataclass(frozen=True)
class Strict(Rule):
    """No relaxation: greedy output equals plain greedy decoding token for token, and sampling
    emits every token with exactly the target's probability (Chen et al. 2023; Leviathan et al.
    2023; EAGLE-2's tree form)."""

    name: ClassVar[str] = "strict"
    never_relaxes: ClassVar[dict] = {}
    relaxing: ClassVar[tuple[dict, ...]] = ()  # lossless
    sweep: ClassVar[tuple[dict, ...]] = ({},)  # the zoo's lossless reference: every zoo job's method

    def relax(self, view: TargetView) -> Relaxation:
        return Relaxation.none(view)

    @property
    def lossless(self) -> bool:
        return True
