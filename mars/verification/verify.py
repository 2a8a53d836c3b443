"""Verification: given the target's processed logits at every tree node and a rule, pick the path to keep.

`accept` is a pure function of (processed logits [n, V], tree, settings, RNG) and returns a
`Verdict`: the accepted path (tree node indices, starting at the root), the next token (the
target's bonus or correction token after the path), and one `Step` record per verified position.
The rule (`mars.rules`) only says where and how it relaxes the strict rule (a `Relaxation`); the
acceptance below is the same code for every rule.

Each form judges every node of the tree at once on the logits' device and reads the outcome back to
the host in one transfer (`_read`): on a GPU, verification costs one synchronisation however large
the tree (the sequential walk of the reference code cost several per node).

Cost accounting (`mars.accounting.cost`: TV/KL, argmax mismatch, regret) is measurement: nothing here decides by
it. By default it is computed in the cycle and packed into that read; with `defer_cost=True` it is
neither computed nor read: each verdict carries its share of the forest's pending cost, to settle
later (`mars.accounting.deferred`). A lossless rule has no cost and nothing pending.

Shared invariants, tested in `tests/test_verify.py` and `tests/test_rules.py`:
- `path[0] == 0` and each node in `path` is a child of the one before it; len(path) - 1 <= depth.
- The logits at node i are the target's prediction for the token *after* node i, so the child c
  of node i is judged by row i, and `next_token` comes from the row of the path's last node.
- A rule differs from strict only at nodes where it relaxes: elsewhere it makes the same decision
  with the same random draws, and a rule at parameters where it never relaxes is strict.
- `Step.relaxed` is a label, never a decision: the accepted child is one strict's own test rejects
  (greedy: not the top-1; sampling: strict's trial with the same draw fails).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eagle.tree import DraftTree
from mars.accounting.cost import Cost, cost_bound, fallback_distribution, greedy_cost, sampling_cost
from mars.accounting.deferred import ForestCost, PendingCost, cost_now_or_later
from mars.rules.base import Relaxation, TargetView
from mars.verification.sampling import SamplingConfig, draw


@dataclass
class Step:
    """One verified position: a path node whose children were judged, and the token it emitted."""

    depth: int  # depth of the node whose children were judged (0 = root)
    gate: float  # the rule's gate metric there (MARS: the margin)
    relax_allowed: bool  # the rule's gate let it relax here (`Relaxation.relax_allowed`)
    child_accepted: bool  # one of its children was accepted (the path goes on)
    relaxed: bool  # that child was accepted only because of the relaxation: strict's own test rejects it
    has_children: bool
    tv: float = 0.0  # TV(pi, p) of the emitted token's exact distribution (sampling)
    kl: float = 0.0  # KL(pi || p) (sampling; inf where pi leaves p's support)
    mismatch: bool = False  # greedy: the emitted token is not the target's argmax
    regret: float = 0.0  # greedy: log p_1 - log p(token) at temperature 1
    counters: dict[str, bool] = field(default_factory=dict)  # the rule's own per-position facts
    rank: int | None = None  # the accepted child's place among its siblings in draft order (0 = first)


@dataclass
class Verdict:
    path: list[int]  # tree nodes, root first
    next_token: int  # the target's token after the path
    steps: list[Step] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the accepted drafted tokens (path[1:]'s)
    cost_bound: bool = False  # the steps' tv/kl bound the cost from above (sampled drafts, `mars.accounting.cost`)
    # Deferred accounting (`defer_cost`): the steps' tv/kl/mismatch/regret stay 0, the cost is
    # `VerifyStats`'s once settled. None: computed in the cycle (or a lossless rule's: 0).
    pending: PendingCost | None = None

    @property
    def accepted(self) -> int:
        """Drafted tokens accepted (path[1:])."""
        return len(self.path) - 1

    @property
    def relaxed_tokens(self) -> int:
        """Of those, the ones accepted only because of the relaxation (`Step.relaxed`)."""
        return sum(s.relaxed for s in self.steps)


_FACTS = ("depth", "gate", "relax_allowed", "has_children", "relaxed", "rank")
_COSTS = ("tv", "kl", "mismatch", "regret")


def children(tree: DraftTree) -> torch.Tensor:
    """[n, n] bool: j is a child of i (columns in draft order)."""
    nodes = torch.arange(tree.size, device=tree.parents.device)
    return tree.parents[None, :] == nodes[:, None]


def _read(tree: DraftTree, relax: Relaxation, chain: torch.Tensor, relaxed: torch.Tensor, cost: Cost | None,
          scalars: list[torch.Tensor]) -> list[tuple[list[int], list[int], list[dict], list[float]]]:
    """The one device-to-host transfer of a verdict, for every tree of a forest at once: chain [B, L]
    node ids per tree, their tokens, the Step facts of each (relaxed [B, L]: the chain node's accepted
    child was accepted by the relaxation; `cost` per chain node, flattened, None when deferred) and
    `scalars` ([B] each). Per tree: (ids, tokens, facts, scalars)."""
    kids = children(tree)
    has_children = kids.any(dim=1)
    nodes = torch.arange(tree.size, device=chain.device)
    sibling_rank = (kids.long().cumsum(dim=1) - 1)[tree.parents.clamp(min=0), nodes]  # [n] place among siblings
    rank = sibling_rank[torch.cat([chain[:, 1:], chain[:, -1:]], dim=1)]  # of the chain node's accepted child
    flat = chain.flatten()
    costs = [] if cost is None else [cost.tv, cost.kl, cost.mismatch, cost.regret]
    columns = [tree.depths[flat], relax.gate[flat], relax.relax_allowed[flat], has_children[flat],
               relaxed.flatten(), rank.flatten(), *costs, *(relax.counters[k][flat] for k in relax.counters)]
    facts = torch.stack([c.double() for c in columns], dim=1)  # [B L, width]
    batch, length, width = chain.shape[0], chain.shape[1], len(columns)
    per_row = torch.cat([chain.double(), tree.tokens[chain].double(), facts.view(batch, length * width),
                         torch.stack(scalars, dim=1).double()], dim=1)
    names = [*_FACTS, *(_COSTS if costs else ()), *relax.counters]
    out = []
    for packed in per_row.tolist():
        rows = [dict(zip(names, packed[2 * length + i * width: 2 * length + (i + 1) * width], strict=True))
                for i in range(length)]
        out.append(([int(x) for x in packed[:length]], [int(x) for x in packed[length: 2 * length]], rows,
                    packed[2 * length + length * width:]))
    return out


def _steps(path: list[int], rows: list[dict], counters: list[str]) -> list[Step]:
    """The Steps of a path's read rows (cost 0 where it was not read: deferred)."""
    steps = []
    for j, row in enumerate(rows):
        child_accepted = j + 1 < len(path)
        steps.append(Step(int(row["depth"]), row["gate"], bool(row["relax_allowed"]), child_accepted,
                          child_accepted and bool(row["relaxed"]), bool(row["has_children"]), row.get("tv", 0.0),
                          row.get("kl", 0.0), bool(row.get("mismatch", 0.0)), row.get("regret", 0.0),
                          {k: bool(row[k]) for k in counters}, int(row["rank"]) if child_accepted else None))
    return steps


def _share(forest: ForestCost | None, row: int, length: int, first: int) -> PendingCost | None:
    """Tree `row`'s share of the forest's deferred cost: its chain of `length` entries, from `first` on."""
    return None if forest is None else forest.share(row * length + first)


def accept_greedy(view: TargetView, relax: Relaxation, tree: DraftTree, lossless: bool = False,
                  defer_cost: bool = False) -> list[Verdict]:
    """Greedy verification under a relaxation, of each tree of `tree` (a forest of `tree.batch`).

    A node is valid when its token is the target's top-1 at its parent, or the rule accepts it
    outright there (`relax.outright`). The accepted path is the deepest root-to-node path of valid
    nodes; ties go to the path with fewer relaxed tokens, then to the earliest node in draft order.
    The next token is the top-1 after the path. With no relaxation the output equals plain greedy
    decoding token for token. `lossless`: the rule never relaxes (skip its cost). `defer_cost`: leave
    the cost to each verdict's `pending` (see the module docstring).
    """
    n, device = tree.size, view.logits.device
    nodes = torch.arange(n, device=device)
    root = tree.parents < 0
    parent = torch.where(root, nodes, tree.parents)  # a root is its own parent
    exact = tree.tokens == view.top1[parent]
    relaxed_edge = ~exact & relax.outright[parent, nodes] & ~root
    valid = exact | relaxed_edge | root
    reachable = ~(tree.ancestors & ~valid[None, :]).any(dim=1)  # every node on its path is valid
    relaxed_count = (tree.ancestors & relaxed_edge[None, :]).sum(dim=1)
    m = tree.nodes_per_tree
    key = tree.depths * (m + 1) ** 2 - relaxed_count * (m + 1) - nodes % m  # deeper, fewer relaxed, earlier
    best = tree.by_row(torch.where(reachable, key, key.min() - 1)).argmax(dim=1) + tree.roots  # [B]
    up = [best]  # best, its parent, ... padded with the root
    for _ in range(tree.levels):
        up.append(parent[up[-1]])
    chain = torch.stack(up[::-1], dim=1)  # [B, levels + 1]: the root (repeated), ..., best
    relaxed = torch.cat([relaxed_edge[chain[:, 1:]], torch.zeros_like(chain[:, :1], dtype=torch.bool)], dim=1)
    emitted = torch.cat([tree.tokens[chain[:, 1:]], view.top1[best][:, None]], dim=1)
    cost, forest = cost_now_or_later(lambda: greedy_cost(view, chain.flatten(), emitted.flatten(), lossless), view,
                                     lossless, defer_cost)
    verdicts = []
    for row, (ids, tokens, rows, (depth, next_token)) in enumerate(_read(tree, relax, chain, relaxed, cost,
                                                                         [tree.depths[best], view.top1[best]])):
        first = len(ids) - int(depth) - 1
        verdicts.append(Verdict([i % m for i in ids[first:]], int(next_token),
                                _steps(ids[first:], rows[first:], list(relax.counters)), tokens[first + 1:],
                                pending=_share(forest, row, len(ids), first)))
    return verdicts


def _sampled_choices(view: TargetView, relax: Relaxation, tree: DraftTree,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's accepted child [n] (n: none) and whether the rule alone accepted it [n] (strict's own test,
    with the same draw, rejects it): one `rand(N, m)` for the forest, drawn first (`accept_sampling`'s draws)."""
    n, device = tree.size, view.logits.device
    nodes = torch.arange(n, device=device)
    kids, trial = view.kids, view.trial  # [n, n]
    u = torch.rand(n, tree.nodes_per_tree, generator=generator, device=device)
    rank = (kids.long().cumsum(dim=1) - 1).clamp(min=0)  # j's place among i's children
    draws = u.gather(1, rank.clamp(max=tree.nodes_per_tree - 1))  # [n, n] child j of i: u[i, rank of j]
    # Strict's own test of each child with its draw: what `relaxed` is measured against. It is a label:
    # the rule's `tested` mask decides, but a child the rule leaves untested may be one strict accepts.
    strict_ok = trial.testable & (draws < trial.ratio)  # [n, n]
    tested = trial.testable if relax.tested is None else trial.testable & relax.tested[:, None]
    passes = strict_ok if relax.tolerance is None else draws < trial.ratio + relax.tolerance[:, None]
    loose_ok = tested & passes  # [n, n] the rule's test: strict's, loosened by the tolerance, where it tests

    def first(ok: torch.Tensor) -> torch.Tensor:  # [n]: the first column where ok, n if none
        return torch.where(ok, nodes[None, :], n).min(dim=1).values

    # Children are tried in draft order; one the relaxation accepts outright is accepted when its turn
    # comes, so strict's choice of an earlier child (and the deeper subtree behind it) stands.
    chosen = first((relax.outright & kids) | loose_ok)
    relaxed = (chosen < n) & ~strict_ok.gather(1, chosen.clamp(max=n - 1)[:, None])[:, 0]
    return chosen, relaxed


def _follow(tree: DraftTree, chosen: torch.Tensor) -> torch.Tensor:
    """[B, levels + 1] each tree's path from its root along the accepted children `chosen` [n] (n: none), its
    last node repeated once the path stops: every path the same length, so all are followed at once."""
    n = tree.size
    walk = [tree.roots]
    for _ in range(tree.levels):
        step = chosen[walk[-1]]
        walk.append(torch.where(step < n, step, walk[-1]))
    return torch.stack(walk, dim=1)


def accept_sampling(view: TargetView, relax: Relaxation, tree: DraftTree, generator: torch.Generator | None,
                    lossless: bool = False, defer_cost: bool = False) -> list[Verdict]:
    """Tree speculative sampling under a relaxation, for deterministic (top-k) or sampled children, of
    each tree of `tree` (a forest of `tree.batch`).

    Strict (lossless): at the current node with target distribution p, try its children in draft
    order, child x accepted when u < its trial ratio (`view.trial`, `mars.rules.rejection`): r(x) for
    deterministic children (q = 1 on the drafted token; a rejected child's entry of r is zeroed and r
    renormalised), r(x) / q(x) for children sampled without replacement from q (recursive rejection
    sampling). If every child is rejected, the correction token is sampled from the last residual;
    if a node without children is reached, the bonus token is sampled from p. Either way each node
    emits a token distributed exactly as p (sampled drafts: over the draws as well).

    A relaxation changes that where it acts: the first child accepted outright wins; otherwise the
    test is loosened by `relax.tolerance` (u < ratio + tolerance), skipped where `relax.tested` is
    False, and the token after rejections drawn from `relax.fallback` (`mars.accounting.cost` gives the result).
    An accepted child counts as relaxed (`Step.relaxed`) where strict's own test, with the same draw,
    rejects it; where the rule skips the test, a child it accepts outright that strict would have
    accepted too is not relaxed. `lossless`: the rule never relaxes (skip its cost). `defer_cost`:
    leave the cost to each verdict's `pending` (see the module docstring; the draws are the same).

    Random draws, the same for every rule: `u = rand(N, m)` first (N nodes of the forest, m per tree),
    the j-th child (draft order) of node i uses u[i, j]; then one `multinomial` over the trees for
    each one's bonus or correction token. Every node's decision is computed at once, then the paths
    are followed from the roots.
    """
    chosen, relaxed = _sampled_choices(view, relax, tree, generator)
    chain = _follow(tree, chosen)  # [B, levels + 1]
    last = chain[:, -1]
    token = draw(fallback_distribution(view, relax, last), generator)[:, 0]  # [B]
    cost, forest = cost_now_or_later(lambda: sampling_cost(view, relax, chain.flatten(), lossless), view,
                                     lossless, defer_cost)
    bound = cost_bound(view, relax, lossless)
    m = tree.nodes_per_tree
    verdicts = []
    for row, (ids, tokens, rows, (depth, next_token)) in enumerate(_read(tree, relax, chain, relaxed[chain], cost,
                                                                         [tree.depths[last], token])):
        length = int(depth) + 1
        verdicts.append(Verdict([i % m for i in ids[:length]], int(next_token),
                                _steps(ids[:length], rows[:length], list(relax.counters)), tokens[1:length],
                                cost_bound=bound, pending=_share(forest, row, len(ids), 0)))
    return verdicts


def accept_rows(processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig,
                generator: torch.Generator | None = None, defer_cost: bool = False) -> list[Verdict]:
    """Verify every tree of a forest (`tree.batch` trees) under `cfg.rule`, one verdict per tree
    (paths in tree-local node indices); the same rule, draws and one device-to-host read for all.

    processed [N, V] = `process_logits(target logits over the forest's N nodes, cfg)`. defer_cost: the
    verdicts share one deferred cost computation (module docstring); it reads `processed`, the tree's
    tensors and its draft probabilities later, so none of them may be overwritten until it is settled.
    """
    view = TargetView(processed, tree.tokens, children(tree), cfg.greedy, tree.draft_probs, tree.width)
    relax = cfg.rule.relax(view)
    if cfg.greedy:
        return accept_greedy(view, relax, tree, lossless=cfg.rule.lossless, defer_cost=defer_cost)
    return accept_sampling(view, relax, tree, generator, lossless=cfg.rule.lossless, defer_cost=defer_cost)


def accept(processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig,
           generator: torch.Generator | None = None, defer_cost: bool = False) -> Verdict:
    """Verify `tree` under `cfg.rule`: the greedy form at temperature 0, else the sampling form.

    processed [n, V] = `process_logits(target logits over the tree, cfg)`; defer_cost as `accept_rows`.
    """
    return accept_rows(processed, tree, cfg, generator, defer_cost)[0]

