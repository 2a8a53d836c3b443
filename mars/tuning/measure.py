"""The one door to measured settings: what `eval.run` (`eval/runner/job_settings.py`) and `mars.tuned` both call.

One orchestration, so that the two reach the same calibration records (and cache files) for the same machine,
models, decoding, batch and prompts: strict's kernels and tree and each relaxed rule's tree at strict's kernels,
all judged against the fastest plain decoding raced beside them (`mars.tuning.search.calibrate`), then each
method's verdict (`mars.tuning.verdict`). A fixed tree skips the tree search and always speculates ("forced");
where there is nothing to choose (one kernel set and a fixed tree), nothing is timed. `shared=True` compares rules
at one tree: strict's tree is searched but always speculates, and every method drafts it (as the paper compares
rules).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import torch

from mars.decoding.settings import Kernels, Speculation, TreeShape
from mars.tuning.candidates import fixed_candidates
from mars.tuning.plan import DEFAULT_BUDGET, TIMED_TOKENS, Load, Plan, Reference
from mars.tuning.record import Calibration
from mars.tuning.search import STRICT, calibrate
from mars.tuning.verdict import speculation_of
from mars.verification.sampling import SamplingConfig


@dataclass(frozen=True)
class Request:
    """What a run asks the door for. strict: strict's sampling (the run's temperature, top-p, top-k); rules:
    {method name: its sampling, rule included}; trees: the candidates (None: `fixed_tree`, which speculates
    whatever it costs); budget: seconds for every calibration together (None: DEFAULT_BUDGET);
    run_prompts: how many prompts (or batches) the run times, which widen each predicted interval by their spread."""

    strict: SamplingConfig
    _: KW_ONLY
    rules: dict[str, SamplingConfig] = field(default_factory=dict)
    trees: tuple[TreeShape, ...] | None = None
    fixed_tree: TreeShape | None = None
    drafting: str = "auto"
    batch: int = 1
    budget: float | None = None
    max_new_tokens: int = 64
    references: Sequence[Reference] = ()
    shared: bool = False
    run_prompts: int | None = None
    cache_dir: Path | None = None
    log: Callable[[str], None] = print
    exclusive: Callable[[], AbstractContextManager] = nullcontext


@dataclass
class Measured:
    """What the door found. `records`: {method: its calibration} (strict's under "strict"; empty where nothing was
    timed); `speculation`: {method: verdict}; `kernels`: what the run's trees verify with; `plain_kernels`: our
    plain decoding's (None: `kernels`); `tree`: strict's tree (or the fixed one); `method_trees`: {rule: its tree}."""

    kernels: Kernels
    tree: TreeShape
    plain_kernels: Kernels | None = None
    records: dict[str, Calibration] = field(default_factory=dict)
    speculation: dict[str, Speculation] = field(default_factory=dict)
    method_trees: dict[str, TreeShape] = field(default_factory=dict)

    @property
    def strict_speculates(self) -> bool:
        return self.speculation[STRICT].speculate if STRICT in self.speculation else True


def measure(load: Load, options: list[Kernels], prompts: list[torch.Tensor], request: Request) -> Measured:
    """Strict's kernels and tree and each rule's tree at those kernels, each with its verdict (see the module
    docstring)."""
    r = request
    if r.trees is None and r.fixed_tree is None:
        raise ValueError("give the candidate trees, or the fixed tree to time the kernels at")
    if len(options) == 1 and r.trees is None:  # nothing to choose: a forced tree at the only kernels
        return Measured(options[0], r.fixed_tree)
    rules = {} if r.shared or r.trees is None else dict(r.rules)
    budget = DEFAULT_BUDGET if r.budget is None else r.budget
    forced = r.trees is None or r.shared
    trees = r.trees or fixed_candidates(r.fixed_tree, not r.strict.greedy, r.drafting)
    plan = Plan(tuple(trees), time.perf_counter() + budget, budget, forced=forced,
                max_new_tokens=min(r.max_new_tokens, TIMED_TOKENS), batch=r.batch, references=r.references,
                drafting=r.drafting, cache_dir=r.cache_dir, log=r.log, exclusive=r.exclusive)
    found = calibrate(load, options, prompts, plan, {STRICT: r.strict, **rules})
    for name, record in found.items():
        report(name, record, r.log)
    strict = found[STRICT]
    why = {"why_forced": "every method drafts strict's tree, rules compared at one tree"} if r.trees and r.shared \
        else {}
    return Measured(strict.kernels, strict.tree, strict.plain_kernels, found,
                    {name: speculation_of(name, record, forced=forced and name == STRICT, prompts=r.run_prompts,
                                          **(why if name == STRICT else {})) for name, record in found.items()},
                    {name: record.tree for name, record in found.items() if name != STRICT})


def report(method: str, record: Calibration, log: Callable[[str], None]) -> None:
    """One line per calibration: what it chose and where the record is."""
    if record.cached:
        log(f"calibration of {method}: cached ({record.cache})")
        return
    m = record.measured
    log(f"calibrated {method} in {record.seconds:.0f} s: {record.label}, "
        f"{m.ratio:.2f}x [{m.low:.2f}, {m.high:.2f}] the fastest plain decoding ({record.reference.label}) over "
        f"{m.pairs} paired prompts (saved to {record.cache})")
