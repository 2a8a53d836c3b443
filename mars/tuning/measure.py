"""The one door to measured settings: what `eval.run` (`eval/runner/settings.py`) and `mars.tuned` both call.

One orchestration, so that the two reach the same calibration records (and cache files) for the same
machine, models, rules, batch and prompts:
1. strict first: precision, kernels and tree searched together (`calibrate`), judged against the fastest
   plain decoding timed beside them (`references`: e.g. `model.generate` under the AVX2 limits);
2. whether strict speculates (`speculation_of`): where its best tree is slower than that reference, the
   run decodes with the kernels of our fastest plain decoding instead; where it speculates, plain decoding
   (vanilla, and any method whose speculation is off) runs at our fastest plain kernels of the tree's
   precision (`plain_kernels_of`), the tree at its own;
3. then each relaxed rule's own tree at those kernels, and whether that rule speculates (judged against
   strict's reference too).
A fixed tree (`fixed_tree`) skips the tree search and always speculates ("forced"); where there is no
choice left to time (one kernel candidate and a fixed tree), nothing is timed. `shared=True` compares rules
at one tree: strict's tree is searched as above but always speculates, and no rule gets a tree of its own
(every method drafts strict's, as the paper compares rules).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mars.decoding.settings import Kernels, Speculation, TreeShape
from mars.rules.strict import Strict
from mars.tuning.calibrate import (
    Budget,
    Load,
    Reference,
    budget_for,
    calibrate,
    decoding_kernels,
    fixed_candidates,
    speculation_of,
)
from mars.verification.sampling import SamplingConfig

STRICT = Strict.name
RULE_WEIGHT = 2  # a rule's calibration's budget share per candidate tree, against strict's one


@dataclass
class Measured:
    """What the door found. `records`: {method: its calibration record} (strict's under "strict", absent where
    nothing was timed); `speculation`: {method: verdict}; `kernels`: what the run's trees verify with (the
    generator's); `plain_kernels`: what its plain decoding runs at (None: `kernels`); `tree`: strict's tree (or
    the fixed one); `method_trees`: {rule method: its own tree}."""

    kernels: Kernels
    tree: TreeShape
    plain_kernels: Kernels | None = None
    records: dict[str, dict] = field(default_factory=dict)
    speculation: dict[str, Speculation] = field(default_factory=dict)
    method_trees: dict[str, TreeShape] = field(default_factory=dict)

    @property
    def strict_speculates(self) -> bool:
        return self.speculation[STRICT].speculate if STRICT in self.speculation else True


def measure(load: Load, options: list[Kernels], prompts: list[torch.Tensor], strict: SamplingConfig,
            rules: dict[str, SamplingConfig] | None = None, *, trees: tuple[TreeShape, ...] | None,
            fixed_tree: TreeShape | None = None, drafting: str = "auto", batch: int = 1,
            budget: float | None = None, references: Sequence[Reference] = (),
            exclusive: Callable[[], AbstractContextManager] = nullcontext, cache_dir: Path | None = None,
            shared: bool = False, max_new_tokens: int = 64, log=print) -> Measured:
    """Strict's kernels and tree, then each of `rules`' ({method name: its sampling, rule included}) trees at
    those kernels, each with its speculation verdict (see the module docstring). `trees` None: the tree is
    `fixed_tree`, which speculates whatever it costs. `budget`: seconds for all the calibrations together,
    shared by the candidates each times (`Budget`; None: `budget_for(max_new_tokens)`). `max_new_tokens`: the
    length the run decodes, which the candidates are timed at (a tree's advantage and plain decoding's speed
    both change with the context)."""
    rules = {} if shared else rules or {}
    sampled = not strict.greedy
    if trees is None and fixed_tree is None:
        raise ValueError("give the candidate trees, or the fixed tree to time the kernels at")
    # Shares by candidates timed, a rule's doubled: its halving starts from fewer candidates than strict's
    # joint search, but its last rounds, where its tree and verdict are decided, time as many prompts.
    per_rule = RULE_WEIGHT * len(trees) if trees else 0
    budget = budget_for(max_new_tokens) if budget is None else budget
    shares = Budget(budget, [len(options) * len(trees or fixed_candidates(fixed_tree, sampled, drafting))]
                    + [per_rule] * len(rules))
    common = {"prompts": prompts, "drafting": drafting, "batch": batch, "references": references,
              "max_new_tokens": max_new_tokens,
              "exclusive": exclusive, "cache_dir": cache_dir, "log": log}
    if len(options) == 1 and trees is None:  # nothing to choose: a forced tree at the only kernels
        return Measured(options[0], fixed_tree)
    record = calibrate(load, options, sampling=strict, trees=trees, fixed_tree=fixed_tree, budget=shares.next(),
                       **common)
    shares.extend(record)
    found = Measured(Kernels(**record["kernels"]), TreeShape(**record["tree"]), records={STRICT: record})
    found.speculation[STRICT] = speculation_of(
        STRICT, record, forced=trees is None or shared,
        **({"why_forced": "every method drafts strict's tree, rules compared at one tree"} if trees and shared else {}))
    found.kernels, found.plain_kernels = decoding_kernels(record, found.strict_speculates)
    # A rule is judged against strict's reference carried over through our vanilla at the run's kernels
    # (`reference_of`): where strict's calibration timed that vanilla, the references (a worker under the AVX2
    # limits) are not timed again.
    retime = not record["kernel_candidates"].get(found.kernels.label, {}).get("plain")
    for name, sampling in rules.items() if trees else ():
        own = calibrate(load, [found.kernels], sampling=sampling, trees=trees, budget=shares.next(),
                        **{**common, "references": references if retime else ()})
        shares.extend(own)
        found.records[name] = own
        found.method_trees[name] = TreeShape(**own["tree"])
        found.speculation[name] = speculation_of(name, own, strict=record)
    return found
