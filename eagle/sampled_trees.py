"""Trees of sampled children, for temperature > 0: each node's children drawn from the head's processed
distribution q without replacement (Gumbel-top-k), into a shape fixed before any draw (`Topology`).

Why a fixed shape and not EAGLE-2's reranking (`eagle.tree`): the strict trial (`mars.rules.rejection`)
is lossless only if, given everything before, the children kept at a node are the first draws of a
without-replacement sample from q. Keeping the best nodes by cumulative draft probability keeps a
node's children according to their own draws (a likely child survives where an unlikely one is
dropped), which biases the emitted distribution. A shape chosen from expected acceptance per sibling
rank (`best_topology`, Sequoia's idea of the best tree for a positional acceptance vector) depends on
no draw, keeps every node's children a prefix in draw order, and still spends the node budget where
acceptance is likely: deep along first children, wide near the root.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from eagle.heads import DraftHead
from eagle.tree import DraftTree, depths_of, one_row, row_proposer

# P(the r-th drawn child is the one accepted | its parent has children), by rank, for sampled drafting
# when nothing better is known. Measured with the embedded pair at temperature 1, strict, on the 8
# calibration prompts x 96 tokens (596 positions, a shape of 36 nodes with 5-6 children per node):
# 0.594, 0.027, 0.023, 0.007, 0.013, 0.003 (`GenerationOutput.stats.acceptance_by_rank`). A second draw
# rarely helps: after the first is rejected, the residual lies where q is small, and so do q's next draws.
# Smoothed below; only the order of the values shapes the tree, so deep chains win over wide trees.
RANK_ACCEPTANCE = (0.59, 0.03, 0.02, 0.01, 0.008, 0.005, 0.003, 0.002)


@dataclass(frozen=True)
class Topology:
    """A tree shape fixed before drafting: nodes breadth-first, node 0 the root.

    parents[i] its parent, ranks[i] its place among its siblings in draw order (0 = first drawn).
    Siblings are always a prefix of ranks 0, 1, 2, ... (`best_topology` guarantees it).
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(depths_of(self.parents))

    @property
    def levels(self) -> int:
        return max(self.depths)

    @property
    def width(self) -> int:
        counts = [0] * self.size
        for p in self.parents[1:]:
            counts[p] += 1
        return max(counts)

    def truncated(self, depth: int) -> Topology:
        """The nodes at depth <= `depth` (breadth-first order keeps them a prefix)."""
        keep = sum(d <= depth for d in self.depths)
        return Topology(self.parents[:keep], self.ranks[:keep])


@lru_cache(maxsize=64)
def best_topology(total_tokens: int, depth: int, branching: int,
                  rank_acceptance: tuple[float, ...] = RANK_ACCEPTANCE) -> Topology:
    """The `total_tokens` non-root nodes (depth <= `depth`, at most `branching` children each) with the
    highest chance of lying on the accepted path, when the child of rank r is the accepted one with
    probability rank_acceptance[r] independently at each node: a node's value is the product along
    its path. Grown best-first, so a node enters only after its parent and its previous sibling
    (siblings stay a prefix in draw order); ties go to the earlier-found node."""
    if total_tokens < 1 or depth < 1 or branching < 1:
        return Topology((-1,), (0,))
    rates = [rank_acceptance[min(r, len(rank_acceptance) - 1)] for r in range(branching)]
    chosen: list[tuple[int, int, int]] = []  # (parent index in `chosen` + 1, rank, depth); root is 0
    frontier = [(-rates[0], 0, 0, 0, 1)]  # (-value, order, parent, rank, depth)
    order = 1
    while frontier and len(chosen) < total_tokens:
        negative, _, parent, rank, d = heapq.heappop(frontier)
        chosen.append((parent, rank, d))
        me = len(chosen)
        if rank + 1 < branching:
            heapq.heappush(frontier, (negative / rates[rank] * rates[rank + 1], order, parent, rank + 1, d))
            order += 1
        if d < depth:
            heapq.heappush(frontier, (negative * rates[0], order, me, 0, d + 1))
            order += 1
    # Breadth-first: by depth, then by the parent's new position, then by rank.
    new = {0: 0}
    parents, ranks = [-1], [0]
    level = [0]
    while level:
        nxt = []
        for node in level:
            kids = sorted((i for i in range(1, len(chosen) + 1) if chosen[i - 1][0] == node),
                          key=lambda i: chosen[i - 1][1])
            for kid in kids:
                new[kid] = len(parents)
                parents.append(new[node])
                ranks.append(chosen[kid - 1][1])
                nxt.append(kid)
        level = nxt
    return Topology(tuple(parents), tuple(ranks))


@dataclass(frozen=True)
class _Level:
    """What drafting one level of a `Topology` needs, as device tensors."""

    nodes: slice  # this level's nodes (breadth-first: a contiguous range)
    feed: torch.Tensor | None  # [kf] the previous level's nodes with children, fed to the head (None: the root)
    row: torch.Tensor  # [m] each node's parent's row among `feed` (0 for the root's children)
    rank: torch.Tensor  # [m] its rank among its siblings
    draws: int  # how many to draw per parent (the most children of one of them)
    mask: torch.Tensor | None  # [kf, t + kf] the head's tentative-cache mask for `feed`


@dataclass(frozen=True)
class SampledShape:
    """A `Topology` laid out on a device for `sample_trees` (built once per shape: no upload per tree)."""

    topology: Topology
    parents: torch.Tensor  # [n]
    depths: torch.Tensor  # [n]
    by_level: tuple[_Level, ...]  # levels 1, 2, ... (`levels` is a count elsewhere: `Topology.levels`)


def _ancestors(parents: tuple[int, ...], node: int) -> set[int]:
    out = set()
    while node > 0:
        out.add(node)
        node = parents[node]
    return out


@lru_cache(maxsize=64)
def sampled_shape(topology: Topology, device: torch.device) -> SampledShape:
    """`topology` on `device`: per level, which nodes the head is fed, each node's parent row and rank,
    and the head's attention mask over its tentative cache (ancestors and self)."""
    parents, ranks, depths = topology.parents, topology.ranks, topology.depths
    fed: list[int] = []  # nodes in the head's tentative cache, in feeding order
    by_level = []
    for d in range(1, topology.levels + 1):
        members = [i for i in range(topology.size) if depths[i] == d]
        feed = sorted({parents[i] for i in members}) if d > 1 else []
        mask = None
        if feed:
            fed = fed + feed
            mask = torch.tensor([[slot in _ancestors(parents, f) for slot in fed] for f in feed], device=device)
        by_level.append(_Level(slice(members[0], members[-1] + 1),
                               torch.tensor(feed, device=device) if feed else None,
                               torch.tensor([feed.index(parents[i]) if feed else 0 for i in members], device=device),
                               torch.tensor([ranks[i] for i in members], device=device),
                               max(ranks[i] for i in members) + 1, mask))
    return SampledShape(topology, torch.tensor(parents, device=device), torch.tensor(depths, device=device),
                        tuple(by_level))


def gumbel_top(probs: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """[rows, count] draws without replacement from each row of `probs` [rows, V], in draw order
    (Gumbel-top-k: the order of log q + Gumbel noise is that of sequential sampling without replacement)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device).clamp(min=torch.finfo(probs.dtype).tiny)
    keys = probs.log() - (-u.log()).log()
    return keys.topk(count, dim=-1).indices


def sample_tree(head: DraftHead, root_token: torch.Tensor, hidden: torch.Tensor | None,
                logprobs: torch.Tensor | None, shape: SampledShape, process: Callable[[torch.Tensor], torch.Tensor],
                generator: torch.Generator | None = None) -> DraftTree:
    """`sample_trees` for one sequence: root_token a one-element tensor on the head's device,
    hidden [H], logprobs [V_d]."""
    return sample_trees(head, root_token.reshape(1), one_row(hidden), one_row(logprobs), shape, process, generator)


@torch.inference_mode()
def sample_trees(head: DraftHead, roots: torch.Tensor, hidden: torch.Tensor | None, logprobs: torch.Tensor | None,
                 shape: SampledShape, process: Callable[[torch.Tensor], torch.Tensor],
                 generator: torch.Generator | None = None) -> DraftTree:
    """One tree of `shape` (`sampled_shape(topology, head's device)`) per row below roots [B], each
    node's children drawn without replacement from q = softmax(process(the head's log-probs there)),
    every row drafted by the same head calls, as a forest (`DraftTree.forest`).

    hidden [B, H], logprobs [B, V_d]: each row's head output at its last committed position (as for
    `grow_trees`; None when the shape is the root alone). `process` applies the sampling settings
    (temperature, top-k, top-p) to log-probabilities [.., V_d]. Each row's children are drawn from its
    own q, independently of the other rows. The forest keeps q of every node with children, over
    target ids (`DraftTree.draft_probs`), for the strict trial (`mars.rules.rejection`). Leaves the head's
    tentative cache rolled back; reads nothing.
    """
    topology, propose = shape.topology, row_proposer(head)
    if topology.size == 1:
        return DraftTree.roots_only(roots)
    device = logprobs.device
    b, n, vocab = roots.shape[0], topology.size, head.config.vocab_size
    to_target = head.to_target_ids(torch.arange(logprobs.shape[-1], device=device))
    tokens = torch.cat([roots[:, None], roots.new_zeros(b, n - 1)], dim=1)
    scores = torch.zeros(b, n, device=device)
    draft = torch.zeros(b, n, vocab, device=device)
    node_hidden = hidden[:, None].expand(b, n, -1).clone()  # the head output that predicted each node's children
    for d, level in enumerate(shape.by_level, start=1):
        if level.feed is None:  # the root's children: the head's prediction at the committed position
            parent_nodes, out_hidden, parents_lp = shape.parents[:1].clamp(min=0), hidden[:, None], logprobs[:, None]
        else:
            parent_nodes = level.feed
            out_hidden, parents_lp = propose(node_hidden[:, parent_nodes], tokens[:, parent_nodes], d - 1, level.mask)
        q = process(parents_lp.float()).softmax(dim=-1)  # [B, kf, V_d]
        drawn = gumbel_top(q.flatten(0, 1), level.draws, generator).view(b, -1, level.draws)  # in draw order
        ids = drawn[:, level.row, level.rank]  # [B, m] draft ids of this level's nodes
        draft[:, parent_nodes] = q.new_zeros(b, q.shape[1], vocab).index_copy_(2, to_target, q)
        tokens[:, level.nodes] = to_target[ids]
        chosen = q[:, level.row].gather(2, ids[..., None])[..., 0]  # [B, m] q of each drawn child
        scores[:, level.nodes] = scores[:, parent_nodes[level.row]] + chosen.log()
        node_hidden[:, level.nodes] = out_hidden[:, level.row]
    head.rollback()
    return DraftTree.forest(tokens, shape.parents.expand(b, -1), shape.depths.expand(b, -1), scores,
                            topology.levels, draft_probs=draft, width=topology.width)
