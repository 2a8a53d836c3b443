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


@dataclass
class DraftTree:
    """A token tree, nodes in breadth-first order (parents before children, siblings in draft order).

    Node 0 is the root: the last token already decided but not yet seen by the target.
    `ancestors[i, j]` is True when j is i or one of its ancestors; it is the tree attention mask.
    """

    tokens: torch.Tensor  # [n] target token ids
    parents: torch.Tensor  # [n], parents[0] = -1
    depths: torch.Tensor  # [n], depths[0] = 0
    scores: torch.Tensor  # [n] cumulative draft log-probability, root 0
    ancestors: torch.Tensor = field(init=False)  # [n, n] bool
    children: list[list[int]] = field(init=False)  # per node, in draft order

    def __post_init__(self):
        n = self.tokens.shape[0]
        parents = self.parents.tolist()
        if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
            raise ValueError("tree nodes must come after their parents (node 0 is the root)")
        anc = torch.eye(n, dtype=torch.bool)
        self.children = [[] for _ in range(n)]
        for i in range(1, n):
            anc[i] |= anc[parents[i]]
            self.children[parents[i]].append(i)
        self.ancestors = anc

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, inclusive."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    @classmethod
    def root_only(cls, token: int) -> DraftTree:
        return cls(torch.tensor([token]), torch.tensor([-1]), torch.tensor([0]), torch.tensor([0.0]))


def _stable_order(keys: list[torch.Tensor], descending: list[bool]) -> torch.Tensor:
    """Indices sorting by keys[0], then keys[1], ... (lexicographic, stable)."""
    order = torch.arange(keys[0].shape[0])
    for key, desc in reversed(list(zip(keys, descending, strict=True))):
        order = order[torch.sort(key[order], descending=desc, stable=True).indices]
    return order


@dataclass
class Candidates:
    """Every node `expand` drafted, in drafting order: level by level, each frontier node's children
    by decreasing draft probability. `parents[i]` indexes these candidates (-1: a child of the root)."""

    tokens: torch.Tensor  # [m] target token ids
    parents: torch.Tensor  # [m]
    depths: torch.Tensor  # [m], >= 1
    scores: torch.Tensor  # [m] cumulative draft log-probability


@torch.inference_mode()
def expand(head: DraftHead, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int, branching: int,
           keep_growing: Callable[[int, torch.Tensor], bool] | None = None) -> Candidates:
    """Draft `depth` levels below the root with the head (EAGLE-2 growth); see the module docstring.

    hidden [H], logprobs [V_d]: the head's output at its last committed position, which predicts
    the root's child. `keep_growing(level, frontier_scores)`, if given, is asked before each level
    after the first with the cumulative log-probabilities of the nodes that level would expand;
    growth stops at the first False. Leaves the head's tentative cache rolled back.
    """
    k = min(branching, logprobs.shape[-1])
    lp, ids = logprobs.topk(k)
    cand_tokens = [head.to_target_ids(ids).cpu()]
    cand_scores = [lp.cpu()]
    cand_parents = [torch.full((k,), -1)]
    cand_depths = [torch.ones(k, dtype=torch.long)]
    frontier = torch.arange(k)  # candidate indices to expand next
    frontier_hidden = hidden[None].expand(k, -1)
    slot_of: dict[int, int] = {}  # candidate index -> tentative slot in the draft cache
    parent_of: list[int] = [-1] * k
    n_cand = k
    for level in range(2, depth + 1):
        tokens_all = torch.cat(cand_tokens)
        scores_all = torch.cat(cand_scores)
        if keep_growing is not None and not keep_growing(level, scores_all[frontier]):
            break
        t, kf = len(slot_of), frontier.shape[0]
        mask = torch.zeros(kf, t + kf, dtype=torch.bool)
        for row, c in enumerate(frontier.tolist()):
            mask[row, t + row] = True
            a = parent_of[c]
            while a >= 0:
                mask[row, slot_of[a]] = True
                a = parent_of[a]
            slot_of[c] = t + row
        frontier_tokens = tokens_all[frontier].to(head.device)
        out_hidden, out_lp = head.propose(frontier_hidden, frontier_tokens, level - 1, mask.to(head.device))
        child_lp, child_ids = out_lp.topk(k, dim=-1)  # [kf, k]
        child_scores = (scores_all[frontier][:, None] + child_lp.cpu()).flatten()
        child_parents = frontier[:, None].expand(kf, k).flatten()
        cand_tokens.append(head.to_target_ids(child_ids).flatten().cpu())
        cand_scores.append(child_scores)
        cand_parents.append(child_parents)
        cand_depths.append(torch.full((kf * k,), level))
        parent_of.extend(child_parents.tolist())
        best = child_scores.topk(min(k, child_scores.shape[0])).indices
        frontier = n_cand + best
        frontier_hidden = out_hidden[best // k]
        n_cand += kf * k
    head.rollback()
    return Candidates(torch.cat(cand_tokens), torch.cat(cand_parents), torch.cat(cand_depths), torch.cat(cand_scores))


def rerank(candidates: Candidates, root_token: int, total_tokens: int) -> DraftTree:
    """The `total_tokens` best candidates by cumulative log-probability, as a tree below `root_token`.

    A child's score never exceeds its parent's (log-probs <= 0) and ties go to the shallower node,
    so every kept node's parent is kept too. Nodes come out breadth-first, siblings in draft order.
    """
    c = candidates
    keep = _stable_order([c.scores, c.depths], [True, False])[:total_tokens]
    keep = keep[_stable_order([c.depths[keep], c.scores[keep]], [False, True])]
    new_index = {old: i + 1 for i, old in enumerate(keep.tolist())}
    tree_parents = [-1] + [0 if p < 0 else new_index[p] for p in c.parents[keep].tolist()]
    return DraftTree(
        tokens=torch.cat([torch.tensor([root_token]), c.tokens[keep]]),
        parents=torch.tensor(tree_parents),
        depths=torch.cat([torch.tensor([0]), c.depths[keep]]),
        scores=torch.cat([torch.tensor([0.0]), c.scores[keep]]),
    )


def grow_tree(head: DraftHead, root_token: int, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int,
              branching: int, total_tokens: int,
              keep_growing: Callable[[int, torch.Tensor], bool] | None = None) -> DraftTree:
    """An EAGLE-2 tree below `root_token`: `expand` for up to `depth` levels, then `rerank` to `total_tokens` nodes."""
    if depth < 1 or total_tokens < 1:
        return DraftTree.root_only(root_token)
    return rerank(expand(head, hidden, logprobs, depth, branching, keep_growing), root_token, total_tokens)
