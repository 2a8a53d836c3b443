"""EAGLE-2 dynamic draft trees.

Two phases:
- `expand` (growth): the root's children are the draft's `branching` most likely next tokens. For
  `depth - 1` more levels, the `branching` nodes of the newest level with the highest cumulative
  draft log-probability are fed to the draft head, each proposing its own `branching` children.
- `rerank`: all candidates are ranked by cumulative log-probability and the best `total_tokens`
  form the tree that the target verifies.
`grow_tree` is the two in sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eagle.heads import DraftHead


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """parents [n] (parents[0] = -1, parents before children) -> [n, n] bool, True where j is i or one
    of its ancestors. Computed on the parents' device by squaring the one-step relation (no host read):
    after m squarings every ancestor up to 2**m levels up is marked."""
    n = parents.shape[0]
    rows = torch.arange(n, device=parents.device)
    reach = torch.eye(n, device=parents.device)
    reach[rows[1:], parents[1:]] = 1.0
    for _ in range(max(n - 1, 1).bit_length()):
        reach = ((reach @ reach) > 0).float()
    return reach > 0


@dataclass
class DraftTree:
    """A token tree, nodes in breadth-first order (parents before children, siblings in draft order).

    Node 0 is the root: the last token already decided but not yet seen by the target. Tensors live
    on the draft's device; building a tree reads nothing back to the host.
    `ancestors[i, j]` is True when j is i or one of its ancestors; it is the tree attention mask.
    `levels`: how many draft levels were grown for it (its depth is at most that).
    """

    tokens: torch.Tensor  # [n] target token ids
    parents: torch.Tensor  # [n], parents[0] = -1
    depths: torch.Tensor  # [n], depths[0] = 0
    scores: torch.Tensor  # [n] cumulative draft log-probability, root 0
    levels: int | None = None  # None: the deepest node's depth (read from `depths`)
    ancestors: torch.Tensor = field(init=False)  # [n, n] bool

    def __post_init__(self):
        if self.levels is None:
            self.levels = int(self.depths.max())
        self.ancestors = ancestor_matrix(self.parents)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

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
        depths = [0]
        for p in parents[1:]:
            depths.append(depths[p] + 1)
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
    lp, ids = logprobs.topk(k)
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
        child_lp, child_ids = out_lp.topk(k, dim=-1)  # [kf, k]
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
