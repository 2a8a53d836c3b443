"""Draft trees: the `DraftTree` every grower returns, and EAGLE-2 dynamic top-k trees.

EAGLE-2 (deterministic children, what greedy verification wants). `grow_trees` drafts one tree per
sequence of a batch with the same head calls (`grow_tree`: one sequence, the batch of one), in two phases:
- growth (`_draft`): the root's children are the draft's `branching` most likely next tokens. For
  `depth - 1` more levels, the `branching` nodes of the newest level with the highest cumulative
  draft log-probability are fed to the draft head, each proposing its own `branching` children.
- reranking (`_rerank`): all candidates are ranked by cumulative log-probability and the best
  `total_tokens` form the tree that the target verifies.
The log-probabilities that rank are the head's at its fitted confidence temperature
(`confidence_logprobs`), so that they track acceptance. At branching 1 (a chain, what calibration
often picks on CPUs) `_draft_chain` grows the same tree in fewer operations: no tree masks, no reranking.

Trees of sampled children, for temperature > 0, are `eagle.sampled_trees`'s; both growers return a
`DraftTree` (a forest of B trees, one per sequence) and drive the head through `row_proposer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    Sampled drafting (`eagle.sampled_trees`) also keeps `draft_probs`, the distribution each node's children
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
               levels: int, *, draft_probs: torch.Tensor | None = None, width: int | None = None,
               own: torch.Tensor | None = None) -> DraftTree:
        """B trees of n nodes each, given row by row (tokens, parents with -1 at the root, depths,
        scores [B, n], draft_probs [B, n, V]), as one forest. own [B or 1, n, n]: each tree's ancestor
        matrix where the caller knows it (None: computed from `parents`)."""
        b, n = tokens.shape
        if own is None:
            own = ancestor_matrix(parents)  # [B, n, n], tree by tree: (B n)^2 work, not (B n)^3
        if b == 1:  # one tree (decoding one sequence, the hot path): nothing to offset or lay out
            ancestors = own[0]
        else:
            parents = torch.where(parents < 0, -1, parents + torch.arange(b, device=parents.device)[:, None] * n)
            own = own.expand(b, n, n)
            block = torch.eye(b, dtype=torch.bool, device=parents.device)[:, None, :, None] & own[:, :, None, :]
            ancestors = block.reshape(b * n, b * n)
        return cls(tokens.reshape(-1), parents.reshape(-1), depths.reshape(-1), scores.reshape(-1), levels,
                   None if draft_probs is None else draft_probs.reshape(b * n, -1), width, b, ancestors)

    @classmethod
    def roots_only(cls, tokens: int | torch.Tensor) -> DraftTree:
        """A forest of lone roots, one per row: tokens [B] (or an int, one root), on the device the forest
        should live on. What a plain decoding step verifies (nothing drafted)."""
        roots = torch.as_tensor(tokens).reshape(-1)
        b, device = roots.shape[0], roots.device
        zero = torch.zeros(b, dtype=torch.long, device=device)
        alone = torch.eye(b, dtype=torch.bool, device=device)  # each root is its own only ancestor
        return cls(roots, zero - 1, zero, zero.float(), 0, batch=b, ancestors=alone)

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


def _stable_order(first: torch.Tensor, second: torch.Tensor, descending: tuple[bool, bool]) -> torch.Tensor:
    """[B, m] indices sorting each row by first [B, m], ties by second [B, m] (stable: ties of both keep
    their order): a stable sort by the second key, then a stable sort of that order by the first."""
    order = torch.sort(second, dim=1, descending=descending[1], stable=True).indices
    return order.gather(1, torch.sort(first.gather(1, order), dim=1, descending=descending[0], stable=True).indices)


# propose(hidden [B, k, H], tokens [B, k], depth, ancestor_mask [B, k, t + k] or [k, t + k] for every row, or
#   None for k = 1 seeing every tentative entry) -> (hidden [B, k, H], logprobs [B, k, V_d]): one tentative
#   level of the head for every row.
Propose = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


def row_proposer(head: DraftHead) -> Propose:
    """The head's level call for rows: `propose_rows` when its cache holds a batch of sequences
    (`reset_rows`), else its one-sequence `propose` around a batch of one (decoding one prompt)."""
    if head.cache.rows is not None:
        return head.propose_rows

    def propose(hidden, tokens, depth, mask):
        out, lp = head.propose(hidden[0], tokens[0], depth, None if mask is None else mask.view(mask.shape[-2:]))
        return out[None], lp[None]

    return propose


def one_row(x: torch.Tensor | None) -> torch.Tensor | None:
    """x as a batch of one row; None (no head output: a cycle that drafts nothing) stays None."""
    return None if x is None else x[None]


def confidence_logprobs(head: DraftHead, logprobs: torch.Tensor) -> torch.Tensor:
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


# keep_growing(level, frontier_scores [B, k]) -> a host bool, or a 0-dim bool on the head's device:
# whether to draft `level` (>= 2), asked with the cumulative log-probabilities of the nodes it would expand.
KeepGrowing = Callable[[int, torch.Tensor], bool | torch.Tensor]


@dataclass
class Candidates:
    """Every node `_draft` drafted per row, in drafting order: level by level, each frontier node's
    children by decreasing draft probability. `parents[b, i]` indexes row b's candidates (-1: a child
    of the root). Tensors on the draft's device."""

    tokens: torch.Tensor  # [B, m] target token ids
    parents: torch.Tensor  # [B, m]
    depths: torch.Tensor  # [B, m], >= 1
    scores: torch.Tensor  # [B, m] cumulative draft log-probability
    levels: int  # levels drafted

    def prefix(self, m: int, levels: int) -> Candidates:
        """The first m candidates of each row: the first `levels` levels when m is their count."""
        return Candidates(self.tokens[:, :m], self.parents[:, :m], self.depths[:, :m], self.scores[:, :m], levels)


def _draft(head: DraftHead, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int, branching: int,
           keep_growing: KeepGrowing | None) -> Candidates:
    """EAGLE-2 growth of every row's tree (see the module docstring); hidden [B, H], logprobs [B, V_d].

    `keep_growing`, if given, is asked before each level after the first and the trees keep the levels
    before the first refusal. A Python bool is a decision made on the host (growth stops at once;
    reading the scores costs a sync per level on a GPU). A tensor (a 0-dim bool on the device, one for
    all rows) defers: every level is drafted and the decisions are read together after the last, one
    sync per forest, then the refused levels are dropped. Leaves the head's tentative cache rolled back.
    """
    propose, (b, vocab), device = row_proposer(head), logprobs.shape, logprobs.device
    k = min(branching, vocab)
    lp, ids = confidence_logprobs(head, logprobs).topk(k, dim=-1)  # [B, k]
    tokens, scores = [head.to_target_ids(ids)], [lp]
    parents = [torch.full((b, k), -1, device=device)]
    depths = [torch.ones(b, k, dtype=torch.long, device=device)]
    # The frontier, the nodes to expand next, is always k nodes: the root's children, then the best k of
    # the k * k children the previous frontier proposed. Its candidate indices, tokens, scores [B, k] and
    # the head outputs that predicted them [B, k, H]:
    frontier, frontier_tokens, frontier_scores = torch.arange(k, device=device).expand(b, k), tokens[0], lp
    frontier_hidden = hidden[:, None].expand(b, k, hidden.shape[-1])
    # The head's tentative cache holds the nodes fed so far (one slot each, level by level);
    # `fed[b, s, t]`: in row b, slot t is slot s or one of its ancestors. `parent_slot` [B, k]: each
    # frontier node's parent's slot (None while the frontier is the root's children, whose parent was never fed).
    fed = torch.zeros(b, 0, 0, dtype=torch.bool, device=device)
    itself = torch.eye(k, dtype=torch.bool, device=device).expand(b, k, k)
    parent_slot: torch.Tensor | None = None
    count, levels = k, 1
    drafted = [k]  # candidates per row by the end of each level
    deferred: list[tuple[int, torch.Tensor]] = []  # (level, device decision), read after drafting
    for level in range(2, depth + 1):
        if keep_growing is not None:
            grow = keep_growing(level, frontier_scores)
            if isinstance(grow, torch.Tensor):
                deferred.append((level, grow.reshape(())))
            elif not grow:
                break
        t = fed.shape[1]
        # What each frontier node sees of the cache [B, k, t + k]: its parent's slot and its ancestors', then itself.
        seen = fed.new_zeros(b, k, t) if parent_slot is None else fed.gather(1, parent_slot[..., None].expand(b, k, t))
        mask = torch.cat([seen, itself], dim=2)
        fed = torch.cat([torch.cat([fed, fed.new_zeros(b, t, k)], dim=2), mask], dim=1)  # [B, t + k, t + k]
        out_hidden, out_lp = propose(frontier_hidden, frontier_tokens, level - 1, mask)
        child_lp, child_ids = confidence_logprobs(head, out_lp).topk(k, dim=-1)  # [B, k, k]
        child_scores = (frontier_scores[:, :, None] + child_lp).flatten(1)  # [B, k * k]
        tokens.append(head.to_target_ids(child_ids).flatten(1))
        scores.append(child_scores)
        parents.append(frontier[:, :, None].expand(b, k, k).flatten(1))
        depths.append(torch.full((b, k * k), level, device=device))
        frontier_scores, best = child_scores.topk(k, dim=-1)  # [B, k] the next frontier, by index in this level
        proposer = best // k  # [B, k] which frontier node proposed each
        frontier, frontier_tokens, parent_slot = count + best, tokens[-1].gather(1, best), t + proposer
        frontier_hidden = out_hidden.gather(1, proposer[..., None].expand(-1, -1, out_hidden.shape[-1]))
        count, levels = count + k * k, level
        drafted.append(count)
    head.rollback()
    candidates = Candidates(*(torch.cat(x, dim=1) for x in (tokens, parents, depths, scores)), levels)
    return _without_refused(candidates, deferred, drafted)


def _without_refused(candidates: Candidates, deferred: list[tuple[int, torch.Tensor]],
                     drafted: list[int]) -> Candidates:
    """The candidates of the levels before the first one `keep_growing` refused on the device: its decisions
    read together, one sync per forest. `drafted`: candidates per row by the end of each level."""
    if deferred:
        grown = torch.stack([grow for _, grow in deferred]).tolist()  # the forest's one read
        refused = [level for (level, _), ok in zip(deferred, grown, strict=True) if not ok]
        if refused:  # candidates come level by level, parents before children: a prefix is a whole tree
            return candidates.prefix(drafted[refused[0] - 2], refused[0] - 1)
    return candidates


def _draft_chain(head: DraftHead, roots: torch.Tensor, hidden: torch.Tensor, logprobs: torch.Tensor,
                 length: int) -> DraftTree:
    """`_rerank(_draft(...))` at branching 1, in fewer operations: each row's chain of its head's most likely
    token at each of `length` levels (`grow_trees` passes min(depth, total_tokens): with one child per node the
    best `total_tokens` candidates are the shallowest). The newest node's ancestors are every node fed before
    it, so the head needs no tree mask, and the chain's ancestor matrix is lower-triangular.
    roots [B], hidden [B, H], logprobs [B, V_d] as in `grow_trees`. Leaves the head's tentative cache rolled back."""
    propose, (b, _), device = row_proposer(head), logprobs.shape, logprobs.device
    score, ids = confidence_logprobs(head, logprobs).topk(1, dim=-1)  # [B, 1]: `_draft`'s choice at k = 1
    tokens, scores = [head.to_target_ids(ids)], [score]
    node_hidden = hidden[:, None]  # [B, 1, H]: the head output that predicted the newest node
    for level in range(2, length + 1):
        node_hidden, out_lp = propose(node_hidden, tokens[-1], level - 1, None)
        lp, ids = confidence_logprobs(head, out_lp[:, 0]).topk(1, dim=-1)
        score = score + lp
        tokens.append(head.to_target_ids(ids))
        scores.append(score)
    head.rollback()
    n = length + 1
    zero = torch.zeros(b, 1, device=device)
    steps = torch.arange(n, device=device)
    return DraftTree.forest(torch.cat([roots.to(device)[:, None], *tokens], dim=1), (steps - 1).expand(b, n),
                            steps.expand(b, n), torch.cat([zero, *scores], dim=1), length,
                            own=torch.ones(1, n, n, dtype=torch.bool, device=device).tril())


def _rerank(c: Candidates, roots: torch.Tensor, total_tokens: int) -> DraftTree:
    """Each row's `total_tokens` best candidates by cumulative log-probability, as a tree below its
    root (roots [B], moved to the candidates' device), the rows a forest.

    A child's score never exceeds its parent's (log-probs <= 0) and ties go to the shallower node,
    so every kept node's parent is kept too. Nodes come out breadth-first, siblings in draft order.
    """
    (b, _), device = c.tokens.shape, c.tokens.device
    keep = _stable_order(c.scores, c.depths, (True, False))[:, :total_tokens]  # [B, m] the best
    keep = keep.gather(1, _stable_order(c.depths.gather(1, keep), c.scores.gather(1, keep), (False, True)))
    m = keep.shape[1]
    new_index = torch.zeros_like(c.tokens).scatter_(1, keep, torch.arange(1, m + 1, device=device).expand(b, m))
    kept_parents = c.parents.gather(1, keep)
    local = torch.where(kept_parents < 0, 0, new_index.gather(1, kept_parents.clamp(min=0)))
    zero = torch.zeros(b, 1, dtype=torch.long, device=device)
    return DraftTree.forest(torch.cat([roots.to(device)[:, None], c.tokens.gather(1, keep)], dim=1),
                            torch.cat([zero - 1, local], dim=1), torch.cat([zero, c.depths.gather(1, keep)], dim=1),
                            torch.cat([zero.float(), c.scores.gather(1, keep)], dim=1), c.levels)


@torch.inference_mode()
def grow_trees(head: DraftHead, roots: torch.Tensor, hidden: torch.Tensor | None, logprobs: torch.Tensor | None,
               depth: int, branching: int, total_tokens: int, *,
               keep_growing: KeepGrowing | None = None) -> DraftTree:
    """One EAGLE-2 tree per row, every row drafted by the same head calls, returned as a forest of B
    trees of one size (`DraftTree.forest`): up to `depth` levels of `branching` children (`_draft`),
    then each row's best `total_tokens` candidates (`_rerank`). See the module docstring.

    roots [B] the root tokens; hidden [B, H], logprobs [B, V_d] each row's head output at its last
    committed position, which predicts the root's child (None when nothing is drafted: depth or
    total_tokens 0). A head holding a batch (`reset_rows`) drafts with `propose_rows`, one holding one
    sequence with `propose` (B = 1). `keep_growing`: the adaptive policy's per-level decisions (`_draft`),
    one for all rows; decisions on the device are read once per forest, after drafting. Reads nothing else.
    """
    if depth < 1 or total_tokens < 1:
        return DraftTree.roots_only(roots)
    if branching == 1 and keep_growing is None:
        return _draft_chain(head, roots, hidden, logprobs, min(depth, total_tokens))
    return _rerank(_draft(head, hidden, logprobs, depth, branching, keep_growing), roots, total_tokens)


def grow_tree(head: DraftHead, root_token: int | torch.Tensor, hidden: torch.Tensor | None,
              logprobs: torch.Tensor | None, depth: int, branching: int, total_tokens: int,
              keep_growing: KeepGrowing | None = None) -> DraftTree:
    """`grow_trees` for one sequence: root_token an int or a one-element tensor (on the head's device to
    upload nothing), hidden [H], logprobs [V_d]; `keep_growing` is given frontier scores [1, k]."""
    return grow_trees(head, torch.as_tensor(root_token).reshape(1), one_row(hidden), one_row(logprobs), depth,
                      branching, total_tokens, keep_growing=keep_growing)
