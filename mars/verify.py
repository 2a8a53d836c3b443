"""Acceptance rules: given the target's processed logits at every tree node, pick the path to keep.

Every rule is a pure function of (processed logits [n, V], tree, settings, RNG) and returns a
`Verdict`: the accepted path (tree node indices, starting at the root), the next token (the
target's bonus or correction token after the path), and one `Step` record per decision.

Shared invariants, tested in `tests/test_verify.py`:
- `path[0] == 0` and each node in `path` is a child of the one before it; len(path) - 1 <= depth.
- The logits at node i are the target's prediction for the token *after* node i, so the child c
  of node i is judged by row i, and `next_token` comes from the row of the path's last node.
- MARS differs from strict only at positions where the margin test passes: elsewhere it makes the
  same decision with the same random draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eagle.tree import DraftTree
from mars.sampling import Margins, SamplingConfig, margin_test, sample


@dataclass
class Step:
    """One verified position: the target's view at a path node, and what happened to its children."""

    depth: int  # depth of the node whose children were judged (0 = root)
    margin: float  # the margin metric's value there
    relax_allowed: bool  # the margin test passed (only acted on by rule "mars")
    accepted: bool  # a child was accepted
    relaxed: bool  # it was accepted only because of the relaxation
    nonfinite: bool
    negative: bool
    has_children: bool


@dataclass
class Verdict:
    path: list[int]
    next_token: int
    steps: list[Step] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return len(self.path) - 1

    @property
    def relaxed(self) -> int:
        return sum(s.relaxed for s in self.steps)


def _step(m: Margins, node: int, depth: int, accepted: bool, relaxed: bool, has_children: bool) -> Step:
    return Step(depth, float(m.value[node]), bool(m.passes[node]), accepted, relaxed,
                bool(m.nonfinite[node]), bool(m.negative[node]), has_children)


def accept_greedy(processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig) -> Verdict:
    """Greedy verification, strict or MARS.

    A node is valid when its token is the target's top-1 at its parent, or (rule "mars" only) the
    margin test passes at the parent and the token is the top-2 there. The accepted path is the
    deepest root-to-node path of valid nodes; ties go to the path with fewer relaxed (top-2)
    tokens, then to the earliest node in draft order. The next token is the top-1 after the path.
    With rule "strict" the output equals plain greedy decoding token for token.
    """
    m = margin_test(processed, cfg)
    tokens, parents, depths = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
    top1, top2 = m.top1.tolist(), m.top2.tolist()
    relax = m.passes.tolist() if cfg.rule == "mars" else [False] * tree.size
    relaxed_on_path = [0] + [-1] * (tree.size - 1)  # -1: not reachable through valid nodes
    best = 0
    for i in range(1, tree.size):
        p = parents[i]
        if relaxed_on_path[p] < 0:
            continue
        if tokens[i] == top1[p]:
            relaxed_on_path[i] = relaxed_on_path[p]
        elif relax[p] and tokens[i] == top2[p]:
            relaxed_on_path[i] = relaxed_on_path[p] + 1
        else:
            continue
        if (depths[i], -relaxed_on_path[i]) > (depths[best], -relaxed_on_path[best]):
            best = i
    path = tree.path_to(best)
    steps = []
    for j, node in enumerate(path):
        child = path[j + 1] if j + 1 < len(path) else None
        relaxed = child is not None and tokens[child] != top1[node]
        steps.append(_step(m, node, depths[node], child is not None, relaxed, bool(tree.children[node])))
    return Verdict(path, top1[best], steps)


def accept_sampling(
    processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """Tree speculative sampling, strict or MARS, for children drafted deterministically (top-k).

    Strict (lossless): at the current node with target distribution p, try its children in draft
    order; child x is accepted with probability r(x) under the current residual r (initially p);
    on rejection r(x) is set to 0 and r renormalised. If every child is rejected, the correction
    token is sampled from r; if a node without children is reached, the bonus token is sampled
    from p. Because drafted children are deterministic (q = 1 on the drafted token), this emits
    each token with exactly probability p: P(x_j) = prod_{i<j}(1 - r_i(x_i)) r_j(x_j) = p(x_j).

    MARS: where the margin test passes, the first child (draft order) that is the target's top-1
    or top-2 is accepted outright (`relaxed`). If none is, `mars_fallback="strict"` hands the
    children to the strict rule; `"reference"` rejects them all and samples from p unadjusted (the
    MARS code's behaviour). Where the test fails, the strict rule runs with the same RNG draws.
    """
    m = margin_test(processed, cfg)
    tokens, depths = tree.tokens.tolist(), tree.depths.tolist()
    top1, top2 = m.top1.tolist(), m.top2.tolist()
    relax = m.passes.tolist()
    path, steps = [0], []
    node = 0
    while True:
        probs = processed[node].softmax(-1)
        children = tree.children[node]
        if not children:
            steps.append(_step(m, node, depths[node], False, False, False))
            return Verdict(path, sample(probs, generator), steps)
        if cfg.rule == "mars" and relax[node]:
            chosen = next((c for c in children if tokens[c] in (top1[node], top2[node])), None)
            if chosen is not None:
                steps.append(_step(m, node, depths[node], True, True, True))
                path.append(chosen)
                node = chosen
                continue
            if cfg.mars_fallback == "reference":
                steps.append(_step(m, node, depths[node], False, False, True))
                return Verdict(path, sample(probs, generator), steps)
        chosen, residual = _strict_children(probs, [tokens[c] for c in children], generator)
        steps.append(_step(m, node, depths[node], chosen is not None, False, True))
        if chosen is None:
            return Verdict(path, sample(residual, generator), steps)
        node = children[chosen]
        path.append(node)


def _strict_children(probs: torch.Tensor, child_tokens: list[int], generator) -> tuple[int | None, torch.Tensor]:
    """Recursive rejection over deterministic drafts: (index of the accepted child or None, residual)."""
    residual = probs.clone()
    for j, token in enumerate(child_tokens):
        u = torch.rand((), generator=generator, device=probs.device).item()
        mass = residual.sum().item()
        if mass <= 0:
            break
        if u * mass < residual[token].item():  # u < r(x) / sum(r), without renormalising
            return j, residual
        residual[token] = 0.0
    total = residual.sum()
    # All mass drafted and rejected can only happen through rounding; fall back to p itself.
    return None, residual / total if total > 0 else probs


def accept(
    processed: torch.Tensor, tree: DraftTree, cfg: SamplingConfig, generator: torch.Generator | None = None
) -> Verdict:
    """The acceptance rule `cfg` asks for: `accept_greedy` at temperature 0, else `accept_sampling`.

    `processed` = `process_logits(target logits over the tree, cfg)`.
    """
    if cfg.greedy:
        return accept_greedy(processed, tree, cfg)
    return accept_sampling(processed, tree, cfg, generator)
