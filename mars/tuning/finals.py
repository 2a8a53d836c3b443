"""The finals: the few candidates the cost model cannot separate, timed end to end against the fastest plain
decoding, in rotated blocks (`mars.tuning.pairs`), until each method's verdict is decided.

Every method's arms share one block with the reference, so the reference's decodes (the slowest of the block)
serve them all, and every comparison is paired: arm against reference, arm against arm. The run verifies every
method's trees with one kernel set, so kernel sets race as a whole: one stops where some method runs clearly
slower there than at the leading kernels and none clearly faster; an arm stops where it runs clearly slower than
another of its method at its kernels beyond the tie band, or clearly within the band at a dearer cycle (the
cheaper is chosen in a tie). The time left goes to what is still in question.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from mars.accounting.timing import ForeignLoad
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape
from mars.rules.strict import Strict
from mars.tuning.cost_model import Prediction
from mars.tuning.pairs import Contender, Estimate, Unit, compare, time_block
from mars.tuning.plain_race import seeded
from mars.verification.sampling import SamplingConfig

# Blocks timed whatever the budget: a verdict from one or two prompts is noise, and a trimmed mean of 6 keeps 4
# (t = 2.35 for its 90% interval, against 1.94 at 8: a loaded machine's prediction for a run then spans +-27%
# against +-18%).
FLOOR = 8
LEAST = 4  # blocks before an arm or kernel set may stop, or the finals end early
TARGET_SE = 0.04  # the finals end once every method's lead is decided at this standard error of the log ratio
TIE = 0.04  # an arm within this of the fastest (paired) is tied with it: the cheaper cycle wins
SEPARATION = 0.10  # candidates predicted within this of a method's best are timed end to end beside it
MAX_FINALISTS = 2  # per method


@dataclass
class Arm:
    """One finalist: `method`'s speculation at `prediction`'s kernels and tree, and its contender in the blocks."""

    method: str
    prediction: Prediction
    contender: Contender

    @property
    def kernels(self) -> Kernels:
        return self.prediction.kernels


def finalists(predictions: dict[str, list[Prediction]], kernels: Kernels | None = None) -> dict[str, list[Prediction]]:
    """The candidates each method takes to the finals, from its predictions (fastest first), at most MAX_FINALISTS
    each: strict's best and those predicted within SEPARATION of it; a rule's best at each kernel set of strict's
    finalists (or at `kernels`, where strict's record decided them), and where those are one kernel set, also
    those within SEPARATION of its best there. A rule's longer accepted paths make its deeper trees tie with its
    shallower ones in the model more often than strict's, and one picked from a tie the model cannot resolve
    may run several percent slower (the embedded pair's MARS at 6/6/1 against 8/8/1, 0.5% apart in the model,
    benchmarks/records/2026-12-02-epyc-avx512/calibration-ab_c253e0d.json). The arms stay at most MAX_FINALISTS
    per method, so that the finals' pairs, and the interval of the prediction, do not thin."""
    def close(found: list[Prediction], most: int) -> list[Prediction]:
        best = found[0]
        return [best, *[p for p in found[1:] if p.tokens_per_s >= (1 - SEPARATION) * best.tokens_per_s]][:most]

    strict = Strict.name
    chosen = {strict: close(predictions[strict], MAX_FINALISTS)} if strict in predictions else {}
    at = list(dict.fromkeys(p.kernels for p in chosen[strict])) if chosen else [kernels]
    most = max(1, MAX_FINALISTS // len(at))
    for name, found in predictions.items():
        if name != strict:
            chosen[name] = [p for k in at for p in close([q for q in found if q.kernels == k], most)]
    return chosen


def no_pairs() -> Estimate:
    """No pairs: a ratio of 1 that decides nothing."""
    return Estimate(1.0, 0.0, math.inf, 0, math.inf, 0.0)


class Finals:
    """The blocks of `reference` and `arms` (see the module docstring). `kernels`: fixed where strict's record
    decided them already (a rule timed after it), else chosen here; `load`: what retimes contended calls."""

    def __init__(self, reference: Contender, arms: list[Arm], kernels: Kernels | None = None,
                 load: ForeignLoad | None = None):
        self.reference, self.arms, self.fixed, self.load = reference, arms, kernels, load
        self.racing = list(arms)
        self.blocks = 0

    def ratio(self, arm: Arm) -> Estimate:
        """`arm`'s paired ratio over the reference."""
        return compare(arm.contender, self.reference) or no_pairs()

    def run(self, units: list[Unit], first: int, tokens: int, deadline: float,
            say: Callable[[str], None] = lambda _: None) -> None:
        """Time the blocks on `units` (indexed from `first`, for the rotation and the seeds) until decided, out of
        units, or past `deadline` (a `time.perf_counter()`) after FLOOR blocks."""
        for index, unit in enumerate(units, start=first):
            if self.blocks >= FLOOR and time.perf_counter() > deadline:
                say(f"budget spent after {self.blocks} paired prompts")
                return
            time_block([self.reference, *(a.contender for a in self.racing)], unit, index, tokens, self.load)
            self.blocks += 1
            if self.blocks >= LEAST:
                self.racing = self.still_racing()
                if self.settled():
                    return

    def best(self, arms: list[Arm], method: str, kernels: Kernels) -> Arm | None:
        return max((a for a in arms if a.method == method and a.kernels == kernels),
                   key=lambda a: self.ratio(a).ratio, default=None)

    def still_racing(self) -> list[Arm]:
        """The arms still in question (see the module docstring)."""
        arms = self.racing
        methods = list(dict.fromkeys(a.method for a in arms))
        lead = self.kernels()
        dropped = set()
        for k in dict.fromkeys(a.kernels for a in arms):
            pairs = [(mine, theirs) for m in methods
                     if (mine := self.best(arms, m, k)) and (theirs := self.best(arms, m, lead))]
            mutual = [compare(mine.contender, theirs.contender) or no_pairs() for mine, theirs in pairs]
            if k != lead and any(e.high < 1.0 for e in mutual) and not any(e.low > 1.0 for e in mutual):
                dropped.add(k)
        kept = [a for a in arms if a.kernels not in dropped]
        return [a for a in kept if not self.settled_against(a, self.best(kept, a.method, a.kernels))]

    def settled_against(self, arm: Arm, lead: Arm) -> bool:
        """Whether `arm` is out against `lead`, its method's fastest at its kernels: clearly slower beyond the tie
        band, or clearly within it (paired interval inside the band) with the dearer cycle: `choose` would take
        the other either way."""
        if arm is lead:
            return False
        mutual = compare(arm.contender, lead.contender) or no_pairs()
        band = math.exp(TIE)
        if mutual.high < 1 / band:
            return True
        return 1 / band < mutual.low and mutual.high < band and cost(arm) > cost(lead)

    def settled(self) -> bool:
        """Whether every method has one arm left, decided and precise."""
        for name in dict.fromkeys(a.method for a in self.arms):
            mine = [a for a in self.racing if a.method == name]
            if len(mine) != 1:
                return False
            lead = self.ratio(mine[0])
            if not (lead.decided and lead.log_se <= TARGET_SE):
                return False
        return True

    def kernels(self) -> Kernels:
        """The kernels the run's trees verify with: the fixed ones, or where the methods' best arms still racing
        are fastest together (the mean of their log ratios over the reference)."""
        if self.fixed is not None:
            return self.fixed
        methods = list(dict.fromkeys(a.method for a in self.arms))

        def score(k: Kernels) -> float:
            best = [self.best(self.racing, m, k) for m in methods]
            return statistics.fmean(math.log(self.ratio(a).ratio) if a else -math.inf for a in best)
        return max(dict.fromkeys(a.kernels for a in self.racing), key=score)

    def tied(self, chosen: Arm, other: Arm) -> bool:
        """Whether `other` ran within TIE of `chosen`, paired on the units both decoded."""
        mutual = compare(other.contender, chosen.contender)
        return mutual is not None and abs(math.log(mutual.ratio)) <= TIE

    def choose(self, method: str) -> Arm:
        """`method`'s arm at `kernels()` among those still racing: the fastest by its paired ratio, or one tied with
        it with a cheaper cycle (fewer rows, fewer levels): a smaller tree loses less where the run's prompts
        accept less than calibration's."""
        kernels = self.kernels()
        mine = [a for a in self.racing if a.method == method and a.kernels == kernels]
        best = max(mine, key=lambda a: self.ratio(a).ratio)
        ties = [a for a in mine if a is best or self.tied(best, a)]
        return min(ties, key=lambda a: (*cost(a), -self.ratio(a).ratio))


def cost(arm: Arm) -> tuple[bool, int, int]:
    """How dear an arm's cycle is, to break a tie: an adaptive tree last, then rows verified, then levels drafted."""
    tree = arm.prediction.tree
    return tree.adaptive, tree.total_tokens, tree.depth


def arm_contender(kernels: Kernels, tree: TreeShape, gen: SpeculativeGenerator, sampling: SamplingConfig) -> Contender:
    """Speculation at `tree` with `kernels`."""
    def timed(unit: Unit, seed: int, tokens: int) -> tuple[int, float]:
        gen.use_tree(tree)
        outs = gen.generate(unit, sampling, max_new_tokens=tokens, generator=seeded(gen, sampling, seed))
        return sum(len(o.tokens) for o in outs), max(o.seconds for o in outs)
    return Contender(f"{kernels.label} {tree.label}", timed)
