"""A relaxed rule's parameter chosen by a quality budget: the fastest value whose exact cost stays within it.

MARS relaxes where the target's top-2 logits are close (z2 / z1 > theta): a lower theta relaxes at more
positions, accepts more drafts and moves the output further from the target's. The cost of a relaxation is
measured exactly at every verified position (`mars.accounting.stats.VerifyStats.cost`): at T > 0 the TV
distance and KL divergence per emitted token between what the rule emits and the target's distribution; at
T = 0 how often the emitted token is not the target's argmax, and the log-probability it gives up. A user
states the cost they accept per token; `choose` takes the value of the rule's main parameter (`Rule.label`:
MARS's theta) that accepts the most within it:

1. `measure_grid` decodes the calibration prompts at each value of a grid (`Rule.budget_grid`, or the
   budget's own) with strict's calibrated kernels and tree, seeded per prompt so that every value meets the
   same draws, and records the value's cost and its acceptance length tau.
2. `choose` keeps the values whose cost is within `margin` x the budget, the margin being room for the run's
   questions to cost more than the calibration prompts did, and takes the one of the longest tau. At one tree
   and one kernel set a cycle costs the same whatever the rule accepts, so tau ranks their speed; unlike a
   timing it does not move with the machine's load.

The value chosen goes into the method's name (mars@0.8), hence into its run directory and the report; the run's
own cost per token is measured as every relaxed run's is, which checks the budget on the run's questions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle.files import write_atomic
from mars.accounting.stats import VerifyStats
from mars.decoding.generate import SpeculativeGenerator
from mars.rules import make_rule, rule_class
from mars.tuning import record as records
from mars.tuning.plain_race import seeded
from mars.verification.sampling import SamplingConfig

# The costs a budget may bound: those a sampled run measures, and those a greedy one does.
SAMPLED_METRICS = ("kl_per_token", "tv_per_token")
GREEDY_METRICS = ("logprob_regret", "argmax_mismatch")
MARGIN = 0.5  # a value is chosen only where the calibration prompts cost at most this share of the budget
BUDGET_PROMPTS = 12  # calibration prompts each value decodes: 12 x 64 tokens x 8 values, ~2 min on SmolLM2 (2 cores)


@dataclass(frozen=True)
class QualityBudget:
    """The most a relaxation may cost per emitted token. metric: kl_per_token or tv_per_token when sampling,
    logprob_regret or argmax_mismatch when greedy; per_token: the bound; margin: the share of it the
    calibration prompts may use; grid: the values of the rule's main parameter to choose among (empty: the
    rule's `budget_grid`)."""

    metric: str
    per_token: float
    margin: float = MARGIN
    grid: tuple[float, ...] = ()

    def __post_init__(self):
        if self.metric not in SAMPLED_METRICS + GREEDY_METRICS:
            raise ValueError(f"quality_budget.metric must be one of {', '.join(SAMPLED_METRICS + GREEDY_METRICS)}, "
                             f"got {self.metric!r}")
        if not (isinstance(self.per_token, (int, float)) and self.per_token > 0 and math.isfinite(self.per_token)):
            raise ValueError(f"quality_budget.per_token is a cost per token > 0, got {self.per_token!r}")
        if not 0 < self.margin <= 1:
            raise ValueError(f"quality_budget.margin is a share of the budget in (0, 1], got {self.margin!r}")
        object.__setattr__(self, "grid", tuple(float(v) for v in self.grid))

    def check(self, rule: str, sampling: SamplingConfig) -> tuple[float, ...]:
        """The grid this budget chooses `rule`'s value from under `sampling`; a ValueError naming the fix where
        the metric is not one such a run measures, or the rule has nothing to choose."""
        kind, allowed = ("greedy", GREEDY_METRICS) if sampling.greedy else ("sampled", SAMPLED_METRICS)
        if self.metric not in allowed:
            raise ValueError(f"a {kind} run measures {' and '.join(allowed)}, not {self.metric}: set "
                             f"quality_budget.metric to one of them")
        cls = rule_class(rule)
        if cls.label is None:
            raise ValueError(f"rule {rule!r} has no main parameter for a quality budget to choose")
        grid = self.grid or cls.budget_grid
        if not grid:
            raise ValueError(f"rule {rule!r} has no grid of {cls.label} values: give quality_budget.grid")
        return grid


@dataclass(frozen=True)
class GridPoint:
    """One value of the grid on the calibration prompts: its costs per token (`VerifyStats.cost`: every metric,
    so that any budget reads one measurement), its acceptance length, and the tokens they rest on."""

    value: float
    costs: dict
    tau: float
    tokens: int

    def cost(self, metric: str) -> float:
        """Per token; +inf for a KL that is infinite on some token (an upper bound, kl_per_token, leaves those out)."""
        if metric == "kl_per_token" and self.costs.get("kl_infinite_tokens"):
            return math.inf
        return float(self.costs.get(metric) or 0.0)

    def to_dict(self) -> dict:
        return {"value": self.value, "costs": self.costs, "tau": self.tau, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: dict) -> GridPoint:
        return cls(d["value"], d["costs"], d["tau"], d["tokens"])


@dataclass(frozen=True)
class Choice:
    """What `choose` found: the value chosen, the parameter it is, the budget and every point measured."""

    value: float
    parameter: str
    budget: QualityBudget
    points: tuple[GridPoint, ...]

    @property
    def params(self) -> dict:
        """The rule's parameter as chosen: {parameter: value}."""
        return {self.parameter: self.value}

    def chosen(self) -> GridPoint:
        return next(p for p in self.points if p.value == self.value)

    def describe(self, rule: str) -> str:
        p, b = self.chosen(), self.budget
        within = sum(q.cost(b.metric) <= b.margin * b.per_token for q in self.points)
        return (f"quality budget: {rule} at {self.parameter} = {self.value:g}, {b.metric} {p.cost(b.metric):.4g} per "
                f"token on "
                f"the calibration prompts (budget {b.per_token:g}, chosen within {b.margin:g} of it), tau {p.tau:.2f}; "
                f"{within} of {len(self.points)} values were within, the longest tau taken")

    def to_dict(self) -> dict:
        b = self.budget
        return {"parameter": self.parameter, "value": self.value, "metric": b.metric, "per_token": b.per_token,
                "margin": b.margin, "points": [p.to_dict() for p in self.points]}


def measure_grid(gen: SpeculativeGenerator, prompts: list[torch.Tensor], sampling_at: Callable[[float], SamplingConfig],
                 grid: tuple[float, ...], max_new_tokens: int) -> tuple[GridPoint, ...]:
    """Each value's costs and tau from decoding `prompts` ([1, n] each) with `gen` as it stands (its kernels and
    tree), seeded per prompt alike for every value; it drafts even where its speculation is off (the cost is
    the rule's, wherever it is used)."""
    speculate, gen.speculate = gen.speculate, True
    try:
        return _decode_grid(gen, prompts, sampling_at, grid, max_new_tokens)
    finally:
        gen.speculate = speculate


def _decode_grid(gen: SpeculativeGenerator, prompts: list[torch.Tensor],
                 sampling_at: Callable[[float], SamplingConfig], grid: tuple[float, ...],
                 max_new_tokens: int) -> tuple[GridPoint, ...]:
    points = []
    for value in grid:
        sampling, stats, tokens, cycles = sampling_at(value), VerifyStats(), 0, 0
        for seed, prompt in enumerate(prompts):
            for out in gen.generate([prompt], sampling, max_new_tokens=max_new_tokens,
                                    generator=seeded(gen, sampling, seed)):
                stats.merge(out.stats)
                tokens, cycles = tokens + max(len(out.tokens) - 1, 0), cycles + out.num_cycles
        points.append(GridPoint(value, stats.cost(), tokens / max(cycles, 1), tokens))
    return tuple(points)


def choose(points: tuple[GridPoint, ...], budget: QualityBudget, parameter: str) -> Choice:
    """The value of the longest tau among those within `budget.margin` x the budget (ties: the cheaper); a
    ValueError naming the cheapest value's cost where none is within."""
    bound, metric = budget.margin * budget.per_token, budget.metric
    within = [p for p in points if p.cost(metric) <= bound]
    if not within:
        cheapest = min(points, key=lambda p: p.cost(metric))
        raise ValueError(f"no {parameter} of the grid {[p.value for p in points]} keeps {budget.metric} within "
                         f"{budget.margin:g} x {budget.per_token:g} per token on the calibration prompts (the "
                         f"cheapest, {parameter} = {cheapest.value:g}, costs {cheapest.cost(metric):.4g}): loosen the "
                         "budget, add stricter values to quality_budget.grid, or decode with strict")
    best = max(within, key=lambda p: (p.tau, -p.cost(metric)))
    return Choice(best.value, parameter, budget, points)


def choose_value(gen: SpeculativeGenerator, prompts: list[torch.Tensor], rule: str, params: dict,
                 sampling: SamplingConfig, budget: QualityBudget, max_new_tokens: int,
                 cache_dir: Path | None = None) -> Choice:
    """`rule`'s main parameter chosen by `budget` (see the module docstring) on `prompts`, its other parameters
    `params`, at `sampling`'s temperature and filters, with `gen`'s kernels and tree. The grid's measurement is
    kept per machine, models, kernels, tree, decoding and prompts (under `cache_dir`, default $MARS_CACHE_DIR/
    budgets), so another budget reads it without decoding again."""
    grid = budget.check(rule, sampling)
    parameter = rule_class(rule).label
    others = {k: v for k, v in params.items() if k != parameter}

    def sampling_at(value: float) -> SamplingConfig:
        return SamplingConfig(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                              rule=make_rule(rule, **{**others, parameter: value}))
    key = {**records.fingerprint(gen.target.model, gen.head), "kernels": gen.tree_kernels.label,
           "tree": gen.tree.label, "rule": rule, "params": others, "grid": list(grid),
           "sampling": [sampling.temperature, sampling.top_p, sampling.top_k], "max_new_tokens": max_new_tokens,
           "prompts": records.prompt_digest(prompts)}
    path = records.cache_path(key, cache_dir or records.default_cache().with_name("budgets"))
    if path.exists():
        points = tuple(GridPoint.from_dict(d) for d in json.loads(path.read_text())["points"])
    else:
        points = measure_grid(gen, prompts, sampling_at, grid, max_new_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "points": [p.to_dict() for p in points]}, indent=1, default=str))
    return choose(points, budget, parameter)
