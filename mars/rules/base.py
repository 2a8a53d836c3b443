"""What a verification rule is: parameters, and where and how it relaxes the strict rule.

Vocabulary (one drafted tree of n nodes, vocabulary V):
- node i's *children* are the drafted tokens after it, tried in draft order; row i of the target's
  logits judges them.
- p_i: the target's distribution at node i that the rule judges with: the processed distribution
  (temperature, top-k, top-p) when sampling, the temperature-1 softmax of the logits when greedy.
- *strict*: greedy exact match, or lossless tree speculative sampling (`mars.verification.verify`).
- a rule *relaxes* by accepting a child the strict rule would not (always or more often).

A rule says where and how through a `Relaxation` over all nodes at once; `mars.verification.verify` turns it into
a verdict (the same code for every rule) and `mars.accounting.cost` into the exact distribution it emits. A
rule that relaxes nowhere gives strict's verdict, draw for draw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch

from mars.rules.rejection import Trial, recursive_trial, topk_trial

# What is drawn at a node whose children were all rejected (`Relaxation.fallback`).
RESIDUAL = 0  # the residual: p with every rejected child zeroed, renormalised (strict: lossless)
TARGET = 1  # p itself, as if no child had been tried
ARGMAX = 2  # the target's most likely token


@dataclass
class TargetView:
    """The target's view of a tree, computed once and shared by the rule, verification and cost.

    logits [n, V]: processed logits (greedy: the raw logits). tokens [n]: node tokens.
    kids [n, n] bool: j is a child of i (columns in draft order). greedy: temperature 0.
    draft [n, V] or None: the distribution node i's children were sampled from, without replacement
    (`eagle.sampled_trees.sample_tree`); None when children are the head's deterministic top-k.
    width: the most children any node has (needed with `draft`; known on the host from the tree's shape).
    """

    logits: torch.Tensor
    tokens: torch.Tensor
    kids: torch.Tensor
    greedy: bool
    draft: torch.Tensor | None = None
    width: int | None = None

    @cached_property
    def probs(self) -> torch.Tensor:
        """[n, V] p_i (greedy: at temperature 1)."""
        return self.logits.softmax(dim=-1)

    @cached_property
    def top1(self) -> torch.Tensor:
        """[n] the argmax (lowest id among ties): what plain greedy decoding emits."""
        return self.logits.argmax(dim=-1)

    @cached_property
    def top_two(self) -> torch.return_types.topk:
        """values, indices [n, 2]: the two largest logits (their order among ties unspecified)."""
        return self.logits.topk(2, dim=-1)

    @cached_property
    def top2(self) -> torch.Tensor:
        """[n] the second most likely token (one with the second-largest logit)."""
        top = self.top_two.indices
        return torch.where(top[:, 0] == self.top1, top[:, 1], top[:, 0])

    @cached_property
    def pmax(self) -> torch.Tensor:
        """[n] max_x p_i(x)."""
        return self.probs.max(dim=-1).values

    @cached_property
    def entropy(self) -> torch.Tensor:
        """[n] H(p_i) in nats (tokens filtered out by top-k/top-p contribute 0)."""
        return -torch.special.xlogy(self.probs, self.probs).sum(dim=-1)

    @cached_property
    def child_probs(self) -> torch.Tensor:
        """[n, n] p_i(token of j) where j is a child of i, else 0."""
        return self.kids * self.probs[:, self.tokens]

    @cached_property
    def trial(self) -> Trial:
        """The strict trial of every node's children (`mars.rules.rejection`): acceptance ratios and residuals."""
        if self.draft is None:
            return topk_trial(self.probs, self.kids, self.tokens)
        if self.width is None:
            raise ValueError("a view of sampled drafts needs the tree's width (most children of a node)")
        return recursive_trial(self.probs, self.draft, self.kids, self.tokens, self.width)

    def children_among(self, chosen: torch.Tensor) -> torch.Tensor:
        """[n, n] bool: j is a child of i whose token is in row i of `chosen` [n, m] (token ids)."""
        return self.kids & (self.tokens[None, :, None] == chosen[:, None, :]).any(dim=-1)

    def vocab_among(self, chosen: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
        """[L, V] bool: the tokens in rows `nodes` [L] of `chosen` [n, m] (what `children_among` is
        for the drafted children, over the whole vocabulary)."""
        mask = torch.zeros(nodes.shape[0], self.logits.shape[-1], dtype=torch.bool, device=self.logits.device)
        return mask.scatter_(1, chosen[nodes], True)


@dataclass
class Relaxation:
    """Where and how a rule departs from strict verification, for every node of a tree at once.

    outright [n, n] bool: child j of node i is accepted with certainty when it is tried. Children are
    tried in draft order, so an earlier child that strict's test accepts still wins (and keeps the
    deeper subtree a sampled tree grows behind its first draws).
    gate [n] float, relax_allowed [n] bool: the rule's gate metric (recorded per verified position,
    e.g. for histograms) and whether it let the rule relax there.
    The other children:
    tolerance [n] float >= 0: tried with the strict test loosened by it,
        accepting c with probability min(1, r(c) / sum(r) + tolerance) under the residual r (greedy
        ignores it). None: 0 everywhere (strict).
    tested [n] bool: whether children are tried at all (None: everywhere). An untested node rejects
        every child.
    fallback [n] long: what is drawn after every child is rejected: RESIDUAL, TARGET or ARGMAX
        (None: RESIDUAL everywhere, strict's). Sampling only; greedy always emits the argmax.
    counters: per-node facts the rule counts in `VerifyStats.counters` (name -> [n] bool).
    accepts: nodes [L] -> [L, V] bool, the tokens the rule accepts outright at each of `nodes`
        whichever were drafted (`outright` is its restriction to the drafted children). A rule with
        outright acceptances gives it, so that the cost of a sampled node with one child is exact
        (`mars.accounting.cost.sampling_cost`); None: no token is accepted outright anywhere.
    """

    outright: torch.Tensor
    gate: torch.Tensor
    relax_allowed: torch.Tensor
    tolerance: torch.Tensor | None = None
    tested: torch.Tensor | None = None
    fallback: torch.Tensor | None = None
    counters: dict[str, torch.Tensor] = field(default_factory=dict)
    accepts: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def none(cls, view: TargetView) -> Relaxation:
        """The strict rule: no relaxation anywhere."""
        n = view.tokens.shape[0]
        zeros = torch.zeros(n, device=view.logits.device)
        return cls(torch.zeros_like(view.kids), zeros, zeros.bool())

    def active(self, nodes: torch.Tensor | None = None, accepting: torch.Tensor | None = None) -> torch.Tensor:
        """[n] bool (or [L] at `nodes` [L]): where this relaxation can change what is emitted (elsewhere
        pi = p exactly). accepting [L] bool: where it accepts some token outright; default: some
        drafted child (`outright`); `mars.accounting.cost` asks about any token a draw could bring (`accepts`)."""
        at = slice(None) if nodes is None else nodes
        active = self.outright.any(dim=1)[at] if accepting is None else accepting
        if self.tolerance is not None:
            active = active | (self.tolerance[at] > 0)
        if self.tested is not None:
            active = active | ~self.tested[at]
        if self.fallback is not None:
            active = active | (self.fallback[at] != RESIDUAL)
        return active


@dataclass(frozen=True)
class Rule:
    """A verification rule: a frozen dataclass of its parameters and `relax`.

    Subclass, declare the parameters as fields (with defaults and checks in `__post_init__`) and
    register it with `mars.rules.register`. `name` is what `method=<name>` and reports call it.
    `greedy_form`: whether the rule has a greedy form (its source defines one).
    `label`: the parameter that names the rule in a table ("mars@0.9"), if one does.

    Two declarations say at which parameters the rule's tests run it (`tests/test_rules.py` takes
    every built-in rule from the registry with them, so a new rule is tested as soon as it is
    registered, and a built-in rule that leaves either at None fails a test naming it):
    `never_relaxes`: parameters at which it relaxes nowhere, so that it gives strict's verdict draw
        for draw, greedy and sampling (tested): e.g. {"beta": 0.0}; {} if its defaults never relax.
    `relaxing`: parameter sets at which it does relax where the target is unsure (top-1 probability
        around one half), each run through the tests that check its exact emitted distribution
        against what it emits and that it moves away from p there; several sets when a parameter
        changes how it relaxes (e.g. one per fallback). () for a rule that is lossless (strict).
    """

    name: ClassVar[str] = ""
    greedy_form: ClassVar[bool] = True
    label: ClassVar[str | None] = None
    never_relaxes: ClassVar[dict | None] = None
    relaxing: ClassVar[tuple[dict, ...] | None] = None
    # The parameter sets the rule zoo (eval.reporting.zoo_sweep) runs it at, from the mildest to the most
    # aggressive, each relaxing at least as much as the one before (tests/test_zoo.py checks it on a random
    # tree); () keeps the rule out of the zoo.
    sweep: ClassVar[tuple[dict, ...]] = ()
    # The values of its main parameter (`label`) a quality budget chooses among (`mars.tuning.quality_budget`);
    # () : a budget gives its own grid.
    budget_grid: ClassVar[tuple[float, ...]] = ()

    def relax(self, view: TargetView) -> Relaxation:  # pragma: no cover - every rule overrides it
        raise NotImplementedError

    def gate_scale(self) -> tuple[str, float, float, float | None]:
        """How to histogram the gate metric: (its name, low and high ends of the plotted range, the
        threshold to mark or None)."""
        return (f"{self.name} gate", 0.0, 1.0, None)

    @property
    def lossless(self) -> bool:
        """True for rules that never change the target's distribution (strict): their cost is 0."""
        return False

    def params(self) -> dict:
        """The parameters, JSON-ready."""
        return dataclasses.asdict(self)

    @property
    def display(self) -> str:
        """How tables name this rule at these parameters: mars@0.9, typical@0.09, or its name; the
        other parameters where they differ from their defaults, e.g. mars@0.9[margin=prob_ratio]."""
        defaults = type(self)()
        text = self.name + (f"@{getattr(self, self.label):g}" if self.label else "")
        others = [f"{f.name}={getattr(self, f.name):g}" if isinstance(getattr(self, f.name), float)
                  else f"{f.name}={getattr(self, f.name)}"
                  for f in dataclasses.fields(self) if f.name != self.label
                  and getattr(self, f.name) != getattr(defaults, f.name)]
        return text + (f"[{','.join(others)}]" if others else "")


def check_range(rule: Rule, name: str, lo: float, hi: float, meaning: str) -> None:
    """Raise a ValueError naming the parameter, its range and what it means, if it is outside it."""
    value = getattr(rule, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ValueError(f"{rule.name}.{name}={value!r} is outside [{lo}, {hi}] ({meaning})")


def check_choice(rule: Rule, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(rule, name)
    if value not in choices:
        raise ValueError(f"unknown {rule.name}.{name} {value!r}; valid: {', '.join(choices)}")
