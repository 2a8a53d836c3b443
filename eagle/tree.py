"""Draft trees: EAGLE-2 dynamic top-k trees, and trees of sampled children for temperature > 0.

EAGLE-2 (deterministic children, what greedy verification wants). Two phases:
- `expand` (growth): the root's children are the draft's `branching` most likely next tokens. For
  `depth - 1` more levels, the `branching` nodes of the newest level with the highest cumulative
  draft log-probability are fed to the draft head, each proposing its own `branching` children.
- `rerank`: all candidates are ranked by cumulative log-probability and the best `total_tokens`
  form the tree that the target verifies.
`grow_tree` is the two in sequence. The log-probabilities that rank are the head's at its fitted
confidence temperature (`confidence`), so that they track acceptance.

Sampled drafting (`sample_tree`, temperature > 0): each node's children are drawn from the head's
processed distribution q without replacement (Gumbel-top-k), into a shape fixed before any draw
(`Topology`). Why a fixed shape and not EAGLE-2's reranking: the strict trial (`mars.rejection`)
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from eagle.heads import DraftHead


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """parents [n] (-1 at a root, parents before children) -> [n, n] bool, True where j is i or one
    of its ancestors; [B, n] -> [B, n, n], tree by tree. Computed on the parents' device by squaring
    the one-step relation (no host read): after m squarings every ancestor up to 2**m levels up is marked."""
    n = parents.shape[-1]
    rows = torch.arange(n, device=parents.device).expand_as(parents)
    reach = torch.eye(n, device=parents.device).expand(*parents.shape[:-1], n, n).clone()
    reach.scatter_(-1, torch.where(parents < 0, rows, parents)[..., None], 1.0)  # a root's "parent" is itself
    for _ in range(max(n - 1, 1).bit_length()):
        reach = ((reach @ reach) > 0).float()
    return reach > 0


def depths_of(parents: Sequence[int]) -> list[int]:
    """Each node's depth from host parent indices (parents[0] = -1, parents before children)."""
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return depths


@dataclass
class DraftTree:
    """A token tree, nodes in breadth-first order (parents before children, siblings in draft order).

    Node 0 is the root: the last token already decided but not yet seen by the target. Tensors live
    on the draft's device; building a tree reads nothing back to the host.
    `ancestors[i, j]` is True when j is i or one of its ancestors; it is the tree attention mask.
    `levels`: how many draft levels were grown for it (its depth is at most that).
    Sampled drafting (`sample_tree`) also keeps `draft_probs`, the distribution each node's children
    were drawn from, and `width`, the most children of any node (a host int, from the shape).

    Batched decoding verifies B trees of one size at once as a *forest* (`batch` = B): the trees'
    nodes one after another (row b's at b * size/B ..), each root's parent -1, parents indexing the
    forest; `ancestors` is block-diagonal, so every node-wise computation judges each tree alone.
    """

    tokens: torch.Tensor  # [n] target token ids
    parents: torch.Tensor  # [n], parents[0] = -1
    depths: torch.Tensor  # [n], depths[0] = 0
    scores: torch.Tensor  # [n] cumulative draft log-probability, root 0
    levels: int | None = None  # None: the deepest node's depth (read from `depths`)
    draft_probs: torch.Tensor | None = None  # [n, V] over target ids (sampled drafting; None: top-k children)
    width: int | None = None
    batch: int = 1  # trees in this forest (batched decoding), each of size // batch nodes
    ancestors: torch.Tensor | None = None  # [n, n] bool (None: computed from `parents`)

    def __post_init__(self):
        if self.levels is None:
            self.levels = int(self.depths.max())
        if self.ancestors is None:
            self.ancestors = ancestor_matrix(self.parents)

    @property
    def size(self) -> int:
        """Nodes (of every tree of a forest)."""
        return self.tokens.shape[0]

    @property
    def nodes_per_tree(self) -> int:
        return self.size // self.batch

    @property
    def roots(self) -> torch.Tensor:
        """[batch] the roots' node indices."""
        return torch.arange(self.batch, device=self.tokens.device) * self.nodes_per_tree

    def by_row(self, values: torch.Tensor) -> torch.Tensor:
        """Per-node values [size, ...] as [batch, nodes_per_tree, ...]."""
        return values.view(self.batch, self.nodes_per_tree, *values.shape[1:])

    @property
    def row_ancestors(self) -> torch.Tensor:
        """[batch, n, n] each tree's own ancestor matrix (the diagonal blocks of `ancestors`)."""
        b, n = self.batch, self.nodes_per_tree
        return self.ancestors.view(b, n, b, n).diagonal(dim1=0, dim2=2).permute(2, 0, 1)

    @classmethod
    def forest(cls, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, scores: torch.Tensor,
               levels: int, draft_probs: torch.Tensor | None = None, width: int | None = None) -> DraftTree:
        """B trees of n nodes each, given row by row (tokens, parents with -1 at the root, depths,
        scores [B, n], draft_probs [B, n, V]), as one forest."""
        b, n = tokens.shape
        offset = torch.arange(b, device=parents.device)[:, None] * n
        own = ancestor_matrix(parents)  # [B, n, n], tree by tree: (B n)^2 work, not (B n)^3
        block = torch.eye(b, dtype=torch.bool, device=parents.device)[:, None, :, None] & own[:, :, None, :]
        return cls(tokens.reshape(-1), torch.where(parents < 0, -1, parents + offset).reshape(-1), depths.reshape(-1),
                   scores.reshape(-1), levels, None if draft_probs is None else draft_probs.reshape(b * n, -1),
                   width, b, block.reshape(b * n, b * n))

    @property
    def children(self) -> list[list[int]]:
        """Per node, its children in draft order (read on the host: for tests and analysis)."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()[1:], start=1):
            kids[p].append(i)
        return kids

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, inclusive (read on the host)."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    @classmethod
    def checked(cls, tokens: list[int], parents: list[int], scores: list[float] | None = None) -> DraftTree:
        """A tree from host lists, validated (parents[0] = -1, every parent before its child)."""
        if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
            raise ValueError("tree nodes must come after their parents (node 0 is the root)")
        depths = depths_of(parents)
        return cls(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths),
                   torch.tensor(scores) if scores is not None else torch.zeros(len(tokens)), max(depths))

    @classmethod
    def root_only(cls, token: int | torch.Tensor) -> DraftTree:
        """A lone root: `token` an int, or a one-element tensor on the device the tree should live on."""
        root = torch.as_tensor(token).reshape(1)
        zero = torch.zeros(1, dtype=torch.long, device=root.device)
        return cls(root, zero - 1, zero, zero.float(), 0)


def _stable_order(keys: list[torch.Tensor], descending: list[bool]) -> torch.Tensor:
    """Indices sorting by keys[0], then keys[1], ... (lexicographic, stable)."""
    order = torch.arange(keys[0].shape[0], device=keys[0].device)
    for key, desc in reversed(list(zip(keys, descending, strict=True))):
        order = order[torch.sort(key[order], descending=desc, stable=True).indices]
    return order


@dataclass
class Candidates:
    """Every node `expand` drafted, in drafting order: level by level, each frontier node's children
    by decreasing draft probability. `parents[i]` indexes these candidates (-1: a child of the root).
    Tensors on the draft's device."""

    tokens: torch.Tensor  # [m] target token ids
    parents: torch.Tensor  # [m]
    depths: torch.Tensor  # [m], >= 1
    scores: torch.Tensor  # [m] cumulative draft log-probability
    levels: int  # levels drafted


def confidence(head: DraftHead, logprobs: torch.Tensor) -> torch.Tensor:
    """[..., V_d] the log-probabilities that rank top-k candidates: the head's `logprobs` [..., V_d]
    at its fitted `confidence_temperature` T (log_softmax(logprobs / T) = log_softmax(logits / T)).

    EAGLE-2 keeps the nodes of highest cumulative draft probability on the premise that it tracks the
    chance the target accepts them. A head trained to match the target's distribution is
    under-confident for greedy verification, which accepts its top-1 whenever it is the target's argmax:
    the embedded head's top-1 has probability 0.39 on average and is the argmax 88% of the time, so at
    T = 1 its trees keep siblings instead of depth (fitted T = 0.18; `eagle.train.confidence`). T changes
    which nodes are kept, never the order of one node's children, and never what verification accepts:
    output is unchanged under strict rules; only tau moves."""
    temperature = head.config.confidence_temperature
    return logprobs if temperature == 1.0 else torch.log_softmax(logprobs / temperature, dim=-1)


@torch.inference_mode()
def expand(head: DraftHead, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int, branching: int,
           keep_growing: Callable[[int, torch.Tensor], bool | torch.Tensor] | None = None) -> Candidates:
    """Draft `depth` levels below the root with the head (EAGLE-2 growth); see the module docstring.

    hidden [H], logprobs [V_d]: the head's output at its last committed position, which predicts
    the root's child. `keep_growing(level, frontier_scores)`, if given, is asked before each level
    after the first with the cumulative log-probabilities of the nodes that level would expand, and
    the tree keeps the levels before the first refusal. A Python bool is a decision made on the host
    (growth stops at once; reading the scores costs a sync per level on a GPU). A tensor (a one-element
    bool on the device) defers: every level is drafted and the decisions are read together after the
    last, one sync per tree, then the refused levels are dropped. Everything else stays on the head's
    device. Leaves the head's tentative cache rolled back.
    """
    device = logprobs.device
    k = min(branching, logprobs.shape[-1])
    lp, ids = confidence(head, logprobs).topk(k)
    tokens, scores = [head.to_target_ids(ids)], [lp]
    parents = [torch.full((k,), -1, device=device)]
    depths = [torch.ones(k, dtype=torch.long, device=device)]
    frontier = torch.arange(k, device=device)  # candidate indices to expand next
    frontier_hidden = hidden[None].expand(k, -1)
    # The head's tentative cache holds the nodes fed so far (one slot each, level by level);
    # `fed[s, t]`: slot t is slot s or one of its ancestors. `parent_slot`: each frontier node's
    # parent's slot (None while the frontier is the root's children, whose parent was never fed).
    fed = torch.zeros(0, 0, dtype=torch.bool, device=device)
    parent_slot: torch.Tensor | None = None
    count, levels = k, 1
    drafted = [k]  # candidates drafted by the end of each level
    deferred: list[tuple[int, torch.Tensor]] = []  # (level, device decision), read after drafting
    for level in range(2, depth + 1):
        frontier_scores = torch.cat(scores)[frontier]
        if keep_growing is not None:
            grow = keep_growing(level, frontier_scores)
            if isinstance(grow, torch.Tensor):
                deferred.append((level, grow.reshape(())))
            elif not grow:
                break
        t, kf = fed.shape[0], frontier.shape[0]
        seen = fed[parent_slot] if parent_slot is not None else fed.new_zeros(kf, t)
        mask = torch.cat([seen, torch.eye(kf, dtype=torch.bool, device=device)], dim=1)  # [kf, t + kf]
        fed = torch.cat([torch.cat([fed, fed.new_zeros(t, kf)], dim=1), mask], dim=0)
        out_hidden, out_lp = head.propose(frontier_hidden, torch.cat(tokens)[frontier], level - 1, mask)
        child_lp, child_ids = confidence(head, out_lp).topk(k, dim=-1)  # [kf, k]
        child_scores = (frontier_scores[:, None] + child_lp).flatten()
        tokens.append(head.to_target_ids(child_ids).flatten())
        scores.append(child_scores)
        parents.append(frontier[:, None].expand(kf, k).flatten())
        depths.append(torch.full((kf * k,), level, device=device))
        best = child_scores.topk(min(k, child_scores.shape[0])).indices
        frontier, parent_slot = count + best, t + best // k
        frontier_hidden = out_hidden[best // k]
        count, levels = count + kf * k, level
        drafted.append(count)
    head.rollback()
    candidates = Candidates(torch.cat(tokens), torch.cat(parents), torch.cat(depths), torch.cat(scores), levels)
    if deferred:
        grown = torch.stack([grow for _, grow in deferred]).tolist()  # the tree's one read
        refused = [level for (level, _), ok in zip(deferred, grown, strict=True) if not ok]
        if refused:
            # Candidates come level by level and parents before children: a prefix is a whole tree.
            levels = refused[0] - 1
            n = drafted[levels - 1]
            candidates = Candidates(candidates.tokens[:n], candidates.parents[:n], candidates.depths[:n],
                                    candidates.scores[:n], levels)
    return candidates


def rerank(candidates: Candidates, root_token: int | torch.Tensor, total_tokens: int) -> DraftTree:
    """The `total_tokens` best candidates by cumulative log-probability, as a tree below `root_token`
    (an int, or a one-element tensor on the candidates' device).

    A child's score never exceeds its parent's (log-probs <= 0) and ties go to the shallower node,
    so every kept node's parent is kept too. Nodes come out breadth-first, siblings in draft order.
    """
    c = candidates
    device = c.tokens.device
    keep = _stable_order([c.scores, c.depths], [True, False])[:total_tokens]
    keep = keep[_stable_order([c.depths[keep], c.scores[keep]], [False, True])]
    new_index = torch.zeros(c.tokens.shape[0], dtype=torch.long, device=device)
    new_index[keep] = torch.arange(1, keep.shape[0] + 1, device=device)
    kept_parents = c.parents[keep]
    root = torch.as_tensor(root_token, device=device).reshape(1)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.cat([root, c.tokens[keep]]),
        parents=torch.cat([zero - 1, torch.where(kept_parents < 0, 0, new_index[kept_parents.clamp(min=0)])]),
        depths=torch.cat([zero, c.depths[keep]]),
        scores=torch.cat([zero.float(), c.scores[keep]]),
        levels=c.levels,
    )


def grow_tree(head: DraftHead, root_token: int | torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor,
              depth: int, branching: int, total_tokens: int,
              keep_growing: Callable[[int, torch.Tensor], bool] | None = None) -> DraftTree:
    """An EAGLE-2 tree below `root_token`: `expand` for up to `depth` levels, then `rerank` to `total_tokens` nodes."""
    if depth < 1 or total_tokens < 1:
        return DraftTree.root_only(root_token)
    return rerank(expand(head, hidden, logprobs, depth, branching, keep_growing), root_token, total_tokens)


def _stable_order_rows(keys: list[torch.Tensor], descending: list[bool]) -> torch.Tensor:
    """[B, m] indices sorting each row by keys[0], then keys[1], ... ([B, m] each; lexicographic, stable)."""
    order = torch.arange(keys[0].shape[1], device=keys[0].device).expand_as(keys[0])
    for key, desc in reversed(list(zip(keys, descending, strict=True))):
        order = order.gather(1, torch.sort(key.gather(1, order), dim=1, descending=desc, stable=True).indices)
    return order


@torch.inference_mode()
def grow_trees(head: DraftHead, roots: torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int,
               branching: int, total_tokens: int) -> DraftTree:
    """`grow_tree` for B sequences at once (batched decoding): one EAGLE-2 tree per row, every row
    drafted by the same head calls (`DraftHead.propose_rows`), returned as a forest of B trees of one
    size (`DraftTree.forest`). roots [B] the root tokens; hidden [B, H], logprobs [B, V_d] each row's
    head output at its last committed position. The same growth and reranking as `expand` / `rerank`,
    row by row in the tensors' first dimension; reads nothing."""
    b, device = roots.shape[0], roots.device
    if depth < 1 or total_tokens < 1:
        zero = torch.zeros(b, 1, dtype=torch.long, device=device)
        return DraftTree.forest(roots[:, None], zero - 1, zero, zero.float(), 0)
    k = min(branching, logprobs.shape[-1])
    lp, ids = confidence(head, logprobs).topk(k, dim=-1)  # [B, k]
    tokens, scores = [head.to_target_ids(ids)], [lp]
    parents = [torch.full((b, k), -1, device=device)]
    depths = [torch.ones(b, k, dtype=torch.long, device=device)]
    frontier = torch.arange(k, device=device).expand(b, k)  # candidate indices to expand next, per row
    frontier_hidden = hidden[:, None].expand(b, k, hidden.shape[-1])
    fed = torch.zeros(b, 0, 0, dtype=torch.bool, device=device)  # as in `expand`, per row
    parent_slot: torch.Tensor | None = None
    count, levels = k, 1
    for level in range(2, depth + 1):
        frontier_scores = torch.cat(scores, dim=1).gather(1, frontier)  # [B, kf]
        t, kf = fed.shape[1], frontier.shape[1]
        seen = fed.gather(1, parent_slot[:, :, None].expand(b, kf, t)) if parent_slot is not None \
            else fed.new_zeros(b, kf, t)
        mask = torch.cat([seen, torch.eye(kf, dtype=torch.bool, device=device).expand(b, kf, kf)], dim=2)
        fed = torch.cat([torch.cat([fed, fed.new_zeros(b, t, kf)], dim=2), mask], dim=1)
        out_hidden, out_lp = head.propose_rows(frontier_hidden, torch.cat(tokens, dim=1).gather(1, frontier),
                                               level - 1, mask)
        child_lp, child_ids = confidence(head, out_lp).topk(k, dim=-1)  # [B, kf, k]
        child_scores = (frontier_scores[:, :, None] + child_lp).flatten(1)
        tokens.append(head.to_target_ids(child_ids).flatten(1))
        scores.append(child_scores)
        parents.append(frontier[:, :, None].expand(b, kf, k).flatten(1))
        depths.append(torch.full((b, kf * k), level, device=device))
        best = child_scores.topk(min(k, child_scores.shape[1]), dim=-1).indices  # [B, k]
        frontier, parent_slot = count + best, t + best // k
        frontier_hidden = out_hidden.gather(1, (best // k)[:, :, None].expand(-1, -1, out_hidden.shape[-1]))
        count, levels = count + kf * k, level
    head.rollback()
    c_tokens, c_parents, c_depths, c_scores = (torch.cat(x, dim=1) for x in (tokens, parents, depths, scores))
    # Rerank each row (as `rerank`): the best `total_tokens` by score, then breadth-first.
    keep = _stable_order_rows([c_scores, c_depths], [True, False])[:, :total_tokens]
    keep = keep.gather(1, _stable_order_rows([c_depths.gather(1, keep), c_scores.gather(1, keep)], [False, True]))
    m = keep.shape[1]
    new_index = torch.zeros_like(c_tokens).scatter_(1, keep, torch.arange(1, m + 1, device=device).expand(b, m))
    kept_parents = c_parents.gather(1, keep)
    local = torch.where(kept_parents < 0, 0, new_index.gather(1, kept_parents.clamp(min=0)))
    zero = torch.zeros(b, 1, dtype=torch.long, device=device)
    return DraftTree.forest(torch.cat([roots[:, None], c_tokens.gather(1, keep)], dim=1),
                            torch.cat([zero - 1, local], dim=1), torch.cat([zero, c_depths.gather(1, keep)], dim=1),
                            torch.cat([zero.float(), c_scores.gather(1, keep)], dim=1), levels)


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
    """A `Topology` laid out on a device for `sample_tree` (built once per shape: no upload per tree)."""

    topology: Topology
    parents: torch.Tensor  # [n]
    depths: torch.Tensor  # [n]
    levels: tuple[_Level, ...]


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
    levels = []
    for d in range(1, topology.levels + 1):
        members = [i for i in range(topology.size) if depths[i] == d]
        feed = sorted({parents[i] for i in members}) if d > 1 else []
        mask = None
        if feed:
            fed = fed + feed
            mask = torch.tensor([[slot in _ancestors(parents, f) for slot in fed] for f in feed], device=device)
        levels.append(_Level(slice(members[0], members[-1] + 1), torch.tensor(feed, device=device) if feed else None,
                             torch.tensor([feed.index(parents[i]) if feed else 0 for i in members], device=device),
                             torch.tensor([ranks[i] for i in members], device=device),
                             max(ranks[i] for i in members) + 1, mask))
    return SampledShape(topology, torch.tensor(parents, device=device), torch.tensor(depths, device=device),
                        tuple(levels))


def gumbel_top(probs: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """[rows, count] draws without replacement from each row of `probs` [rows, V], in draw order
    (Gumbel-top-k: the order of log q + Gumbel noise is that of sequential sampling without replacement)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device).clamp(min=torch.finfo(probs.dtype).tiny)
    keys = probs.log() - (-u.log()).log()
    return keys.topk(count, dim=-1).indices


@torch.inference_mode()
def sample_tree(head: DraftHead, root_token: torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor,
                shape: SampledShape, process: Callable[[torch.Tensor], torch.Tensor],
                generator: torch.Generator | None = None) -> DraftTree:
    """A tree of `shape` (`sampled_shape(topology, head's device)`) below `root_token` (a one-element
    tensor on the head's device), each node's children drawn without replacement from
    q = softmax(process(the head's log-probs there)).

    hidden [H], logprobs [V_d]: the head's output at its last committed position (as for `expand`).
    `process` applies the sampling settings (temperature, top-k, top-p) to log-probabilities [.., V_d].
    The tree keeps q of every node with children, over target ids (`DraftTree.draft_probs`), for the
    strict trial (`mars.rejection`). Leaves the head's tentative cache rolled back; reads nothing.
    """
    if shape.topology.size == 1:
        return DraftTree.root_only(root_token)

    def propose(node_hidden, tokens, depth, mask):  # one tree: the head's own calls, a batch of one around them
        out, lp = head.propose(node_hidden[0], tokens[0], depth, mask)
        return out[None], lp[None]

    tokens, scores, draft = _draw(head, propose, root_token.reshape(1), hidden[None], logprobs[None], shape, process,
                                  generator)
    topology = shape.topology
    return DraftTree(tokens[0], shape.parents, shape.depths, scores[0], topology.levels, draft[0], topology.width)


@torch.inference_mode()
def sample_trees(head: DraftHead, roots: torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor,
                 shape: SampledShape, process: Callable[[torch.Tensor], torch.Tensor],
                 generator: torch.Generator | None = None) -> DraftTree:
    """`sample_tree` for B sequences at once (batched decoding): one tree of `shape` per row below
    roots [B], every row drafted by the same head calls (`DraftHead.propose_rows`), as a forest
    (`DraftTree.forest`). hidden [B, H], logprobs [B, V_d]: each row's head output at its last
    committed position. Each row's children are drawn from its own q, independently of the other rows."""
    b, topology = roots.shape[0], shape.topology
    if topology.size == 1:
        zero = torch.zeros(b, 1, dtype=torch.long, device=roots.device)
        return DraftTree.forest(roots[:, None], zero - 1, zero, zero.float(), 0)
    tokens, scores, draft = _draw(head, head.propose_rows, roots, hidden, logprobs, shape, process, generator)
    return DraftTree.forest(tokens, shape.parents.expand(b, -1), shape.depths.expand(b, -1), scores,
                            topology.levels, draft, topology.width)


def _draw(head: DraftHead, propose: Callable, roots: torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor,
          shape: SampledShape, process: Callable[[torch.Tensor], torch.Tensor],
          generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draws of `sample_tree` / `sample_trees` for rows [B]: (tokens [B, n], scores [B, n], q over target
    ids [B, n, V]). propose(hidden [B, kf, H], tokens [B, kf], depth, mask [kf, t + kf]) -> ([B, kf, H],
    [B, kf, V_d]): the head's tentative level for every row."""
    topology, device = shape.topology, logprobs.device
    b, n, vocab = roots.shape[0], topology.size, head.config.vocab_size
    to_target = head.to_target_ids(torch.arange(logprobs.shape[-1], device=device))
    tokens = torch.cat([roots[:, None], roots.new_zeros(b, n - 1)], dim=1)
    scores = torch.zeros(b, n, device=device)
    draft = torch.zeros(b, n, vocab, device=device)
    node_hidden = hidden[:, None].expand(b, n, -1).clone()  # the head output that predicted each node's children
    for d, level in enumerate(shape.levels, start=1):
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
    return tokens, scores, draft
