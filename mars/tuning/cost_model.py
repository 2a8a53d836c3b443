"""A speculative cycle's cost from its parts, and every candidate's speed predicted from them.

A cycle drafts a tree (the head, level by level), verifies it (one target forward over its rows), and keeps the
accepted path (bookkeeping, the head's catch-up). Its speed is tau / cycle seconds, where
- tau, tokens per cycle, depends on the tree, the head, the rule and the prompts, never on the kernels;
- the forward's and the draft's costs depend on the kernels and the tree's rows, never on the rule.
So a calibration measures each once and multiplies, instead of decoding every kernels x tree pair end to end
(Sequoia, Chen et al. 2024, chooses a tree the same way: an acceptance profile against the hardware's cost of a
tree of that size). Here:
- `Parts`, per kernel set: a plain step, and for every tree its drafting and its forward, timed round robin over
  the kernel sets, each part paired with the plain step timed at the start of its round (a burst of load moves
  both), the median over repeats;
- `Profile`, per tree and rule: tau and where drafts were accepted (by depth and by sibling rank), from a short
  online run at one kernel set, and its cycle's measured seconds there;
- `predict`: cycle(K, T) = parts(K, T) + overhead(T), the overhead (what the parts leave out: bookkeeping, the
  head's catch-up, the prompt's share) read off tree T's profile, its measured cycle against its parts where it
  ran; speed = tau(T) / cycle(K, T).
The model ranks; end-to-end paired timing (`mars.tuning.search`) decides among the few it cannot separate.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from eagle.tree import DraftTree
from mars.accounting.stats import VerifyStats
from mars.accounting.timing import ForeignLoad
from mars.adapter import synchronize
from mars.decoding.drafting import Drafter
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.rows import prompts_behind
from mars.decoding.settings import Kernels, TreeShape
from mars.tuning.pairs import Unit, quietly
from mars.verification.sampling import SamplingConfig

REPEATS = 2  # timed rounds of the parts (after one untimed round that warms every shape); the median over them


@dataclass(frozen=True)
class Parts:
    """What one kernel set's cycle parts cost here. `step_s`: a plain decoding step (one row per prompt);
    `draft`: {tree label: one cycle's drafting, in plain steps}; `rows`, `forward`: a target forward over that
    many rows per prompt, in plain steps (a tree's forward costs what its rows cost: between the sizes timed,
    linearly)."""

    kernels: Kernels
    step_s: float
    draft: dict[str, float]
    rows: tuple[int, ...] = ()
    forward: tuple[float, ...] = ()

    def forward_steps(self, rows: int) -> float:
        """A forward over `rows` rows per prompt, in plain steps: linear between the sizes timed and beyond."""
        xs, ys = (1, *self.rows), (1.0, *self.forward)
        i = max(1, min(len(xs) - 1, next((j for j, x in enumerate(xs) if x >= rows), len(xs) - 1)))
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])

    def cycle_s(self, tree: TreeShape) -> float | None:
        """Seconds of `tree`'s draft and forward at these kernels (None: not timed, e.g. the adaptive tree)."""
        if tree.label not in self.draft or not self.rows:
            return None
        return self.step_s * (self.draft[tree.label] + self.forward_steps(tree.total_tokens + 1))

    def to_dict(self) -> dict:
        return {"kernels": self.kernels.__dict__, "step_s": round(self.step_s, 6),
                "draft": {k: round(v, 4) for k, v in self.draft.items()}, "rows": list(self.rows),
                "forward": [round(v, 4) for v in self.forward]}

    @classmethod
    def from_dict(cls, d: dict) -> Parts:
        return cls(Kernels(**d["kernels"]), d["step_s"], dict(d["draft"]), tuple(d["rows"]), tuple(d["forward"]))


@dataclass(frozen=True)
class Profile:
    """A tree's acceptance under one rule and sampling, from an online run: `tau` (tokens per cycle),
    `cycles`, `by_depth` ({depth: P(a draft accepted there | its parent was)}), `by_rank` ({sibling rank r: P(the
    accepted child is its parent's r-th)}), and `cycle_s`, its measured seconds per cycle at the kernels it ran on
    (`kernels`)."""

    tree: TreeShape
    tau: float
    cycles: int
    tau_units: tuple[float, ...]
    by_depth: dict[int, float]
    by_rank: dict[int, float]
    cycle_s: float
    kernels: Kernels

    def to_dict(self) -> dict:
        return {"tree": self.tree.__dict__, "tau": round(self.tau, 4), "cycles": self.cycles,
                "tau_units": [round(t, 3) for t in self.tau_units],
                "by_depth": {str(k): round(v, 4) for k, v in self.by_depth.items()},
                "by_rank": {str(k): round(v, 4) for k, v in self.by_rank.items()},
                "cycle_s": round(self.cycle_s, 6), "kernels": self.kernels.__dict__}

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        return cls(TreeShape(**d["tree"]), d["tau"], d["cycles"], tuple(d["tau_units"]),
                   {int(k): v for k, v in d["by_depth"].items()}, {int(k): v for k, v in d["by_rank"].items()},
                   d["cycle_s"], Kernels(**d["kernels"]))


@dataclass(frozen=True)
class Prediction:
    """One candidate's predicted speed (tokens/s) and the cycle it rests on."""

    kernels: Kernels
    tree: TreeShape
    tokens_per_s: float
    cycle_s: float
    tau: float

    @property
    def label(self) -> str:
        return f"{self.kernels.label} {self.tree.label}"

    def to_dict(self) -> dict:
        return {"kernels": self.kernels.__dict__, "tree": self.tree.__dict__,
                "tokens_per_s": round(self.tokens_per_s, 2), "cycle_s": round(self.cycle_s, 6),
                "tau": round(self.tau, 4)}

    @classmethod
    def from_dict(cls, d: dict) -> Prediction:
        return cls(Kernels(**d["kernels"]), TreeShape(**d["tree"]), d["tokens_per_s"], d["cycle_s"], d["tau"])


def _timed(devices: set[torch.device], fn, *args):
    """(fn(*args), its seconds), the devices synchronised around it (a GPU runs ahead of the host: time its
    kernels, not their launch)."""
    synchronize(devices)
    start = time.perf_counter()
    out = fn(*args)
    synchronize(devices)
    return out, time.perf_counter() - start


def _cycle_state(gen: SpeculativeGenerator, unit: Unit, capacity: int) -> tuple[torch.Tensor, ...]:
    """The state a first cycle drafts from, as the loop makes it: the prompts prefilled, the roots (the
    target's greedy first tokens) [B], and the head caught up on the prompts: hidden [B, H], logprobs [B, V_d]."""
    target, head = gen.target, gen.head
    prompts = [p.reshape(-1).to(target.devices.inputs) for p in unit]
    logits, features = target.prefill_rows(prompts, capacity)
    roots = logits.argmax(-1).to(head.device)
    head.reset_rows(len(prompts), head.device)
    hidden, logprobs = head.extend_rows(*prompts_behind(prompts, features, roots,
                                                        target.rows.device if target.rows is not None else None))
    return roots, hidden, logprobs


def row_grid(trees: list[TreeShape]) -> tuple[int, ...]:
    """The forward sizes to time for `trees` (rows per prompt): the smallest and the largest tree's, and the
    powers of two plus one between (a cost curve in rows is smooth: a few points and straight lines between)."""
    sizes = sorted({t.total_tokens + 1 for t in trees})
    if not sizes:
        return ()
    inner = [r for r in (9, 17, 33) if sizes[0] < r < sizes[-1]]
    return tuple(sorted({sizes[0], *inner, sizes[-1]}))


def _chain_forest(roots: torch.Tensor, rows: int) -> DraftTree:
    """A chain of `rows` nodes below each root (B = len(roots)): a forward's cost by its rows."""
    b, device = roots.shape[0], roots.device
    steps = torch.arange(rows, device=device)
    return DraftTree.forest(roots[:, None].expand(b, rows).contiguous(), (steps - 1).expand(b, rows),
                            steps.expand(b, rows), torch.zeros(b, rows, device=device), rows - 1,
                            own=torch.ones(1, rows, rows, dtype=torch.bool, device=device).tril())


@torch.inference_mode()
def measure_parts(gens: dict[Kernels, SpeculativeGenerator], trees: tuple[TreeShape, ...], unit: Unit,
                  sampling: SamplingConfig, candidates: set[Kernels], repeats: int = REPEATS) -> dict[Kernels, Parts]:
    """Every kernel set's `Parts` on `unit`'s prompts: the plain step everywhere, and at the `candidates` the
    forwards over `row_grid` rows and `trees`' drafts (fixed trees; an adaptive tree is sized by its own policy
    and has none). Round robin over the kernel sets, so that the machine's drift and bursts fall on each alike;
    every draft and forward is divided by the plain step timed at the start of its round at its kernels."""
    every = [t for t in trees if not t.adaptive]
    grid = row_grid(every)
    capacity = max(p.numel() for p in unit) + max(grid, default=1) + 4
    states, drafters = {}, {}
    for k, gen in gens.items():
        with gen.computing(plain=False):
            states[k] = _cycle_state(gen, unit, capacity)
        drafters[k] = {t: Drafter(gen.head, t, sampling, None, lambda: None, gen.rank_acceptance)
                       for t in (every if k in candidates else [])}
    steps: dict[Kernels, list[float]] = {k: [] for k in gens}
    draft: dict[Kernels, dict[str, list[float]]] = {k: {t.label: [] for t in drafters[k]} for k in gens}
    forward: dict[Kernels, dict[int, list[float]]] = {k: {r: [] for r in grid} if drafters[k] else {} for k in gens}
    chains = {k: {r: _chain_forest(states[k][0], r) for r in forward[k]} for k in gens}
    for r in range(repeats + 1):  # the first round warms every shape up, untimed
        for k, gen in gens.items():
            roots, hidden, logprobs = states[k]
            devices = gen.target.all_devices | {gen.head.device}
            with gen.computing(plain=False):
                step = _timed(devices, gen.target.score_rows, DraftTree.roots_only(roots))[1]
                for rows, chain in chains[k].items():
                    seconds = _timed(devices, gen.target.score_rows, chain)[1]
                    if r:
                        forward[k][rows].append(seconds / step)
                for tree, drafter in drafters[k].items():
                    drafter.plan(tree.depth + 1)
                    drafted = _timed(devices, drafter.draft, roots, hidden, logprobs)[1]
                    gen.head.rollback()
                    if r:
                        draft[k][tree.label].append(drafted / step)
            if r:
                steps[k].append(step)
    for gen in gens.values():
        gen.target.end_sequence()
        gen.head.reset()
    return {k: Parts(k, statistics.median(steps[k]), {label: statistics.median(v) for label, v in draft[k].items()},
                     tuple(forward[k]), tuple(statistics.median(v) for v in forward[k].values())) for k in gens}


@torch.inference_mode()
def profile_tree(gen: SpeculativeGenerator, tree: TreeShape, units: list[Unit], sampling: SamplingConfig,
                 max_new_tokens: int, kernels: Kernels, load: ForeignLoad | None = None) -> Profile:
    """`tree`'s acceptance under `sampling` (its rule included) from decoding `units` with it, seeded per unit
    as the timed calls are; a decode another process contended is timed again once quiet (`load`)."""
    gen.use_tree(tree)
    tokens = cycles = 0
    seconds = 0.0
    per_unit, stats = [], VerifyStats()
    for index, unit in enumerate(units):
        outs = _quiet_decode(gen, unit, sampling, max_new_tokens, index, load)
        unit_tokens = sum(max(len(o.tokens) - 1, 0) for o in outs)
        unit_cycles = sum(o.num_cycles for o in outs)
        tokens, cycles = tokens + unit_tokens, cycles + unit_cycles
        # a batch's cycles run together: its seconds over its longest row's cycles
        seconds += max(o.seconds for o in outs) / max(max(o.num_cycles for o in outs), 1)
        per_unit.append(unit_tokens / max(unit_cycles, 1))
        for o in outs:
            stats.merge(o.stats)
    return Profile(tree, tokens / max(cycles, 1), cycles, tuple(per_unit), stats.acceptance_rate_by_depth,
                   stats.acceptance_by_rank, seconds / max(len(units), 1), kernels)


def _quiet_decode(gen: SpeculativeGenerator, unit: Unit, sampling: SamplingConfig, max_new_tokens: int, seed: int,
                  load: ForeignLoad | None) -> list:
    """`gen.generate` on `unit`, seeded, decoded again (once quiet) while another process contended it."""
    def decode() -> list:
        rng = None if sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)
        return gen.generate(unit, sampling, max_new_tokens=max_new_tokens, generator=rng)
    return quietly(decode, lambda outs: max(o.seconds for o in outs), load)[0]


def overhead_s(parts: Parts, profile: Profile) -> float | None:
    """What `profile`'s measured cycle cost beyond its draft and forward at `parts`' kernels (those it ran on):
    the loop's bookkeeping, the head's catch-up and the prompt's share, which grow with the tree (accepting over
    more nodes) but not with the kernels. None: not timed there, or an adaptive tree."""
    cycle = parts.cycle_s(profile.tree) if parts.kernels == profile.kernels else None
    return None if cycle is None else max(profile.cycle_s - cycle, 0.0)


def predict(parts: dict[Kernels, Parts], profiles: list[Profile]) -> list[Prediction]:
    """Every kernels x tree pair's predicted speed, fastest first (ties: the cheaper cycle first): at the kernels a
    profile ran on, its measured cycle; elsewhere the parts there plus that tree's own overhead (`overhead_s`).
    An adaptive tree is predicted only where its profile ran (its cycle sizes itself)."""
    found = []
    for profile in profiles:
        home = parts.get(profile.kernels)
        overhead = overhead_s(home, profile) if home is not None else None
        for k, part in parts.items():
            cycle = part.cycle_s(profile.tree)
            if k == profile.kernels:
                cycle = profile.cycle_s
            elif cycle is None or overhead is None:
                continue
            else:
                cycle += overhead
            found.append(Prediction(k, profile.tree, profile.tau / cycle, cycle, profile.tau))
    return sorted(found, key=lambda p: (-p.tokens_per_s, p.tree.total_tokens, p.tree.depth))


def typical_overhead(parts: Parts, profiles: list[Profile]) -> float:
    """The median overhead of the profiles so far at `parts`' kernels: a tree not yet profiled is bounded with
    it (`speed_bound`)."""
    gaps = [g for p in profiles if (g := overhead_s(parts, p)) is not None]
    return statistics.median(gaps) if gaps else 0.0


def speed_bound(parts: Parts, tree: TreeShape, overhead: float) -> float | None:
    """The fastest `tree` could run at `parts`' kernels: every draft accepted (tau = depth + 1). An adaptive tree
    sizes each cycle up to its caps or down to a plain step: at most its caps' forward, its drafting left out."""
    if not parts.rows:
        return None
    if tree.adaptive:
        return (tree.depth + 1) / (parts.step_s * parts.forward_steps(tree.total_tokens + 1) + overhead)
    cycle = parts.cycle_s(tree)
    return None if cycle is None else (tree.depth + 1) / (cycle + overhead)
