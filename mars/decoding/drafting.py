"""How one decoding call drafts its forests, decided when the call starts.

Greedy decoding drafts EAGLE-2 top-k trees (`eagle.tree.grow_trees`), sized each cycle by the adaptive
policy where the tree is adaptive (`mars.decoding.adaptive`); sampling drafts children drawn from the
head into a fixed shape (`eagle.sampled_trees`) unless the tree says top-k (`TreeShape.drafts`). The
loop asks `plan` how deep the next cycle drafts, `draft` for the forest, and tells `observe` what was
accepted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from eagle.heads import DraftHead
from eagle.sampled_trees import best_topology, sample_trees, sampled_shape
from eagle.tree import DraftTree, grow_trees
from mars.decoding.adaptive import AdaptiveTree
from mars.decoding.settings import TreeShape
from mars.verification.sampling import SamplingConfig, process_logits
from mars.verification.verify import Verdict


class Drafter:
    """The drafting of one call: `tree`'s shape and mode for these sampling settings, the RNG of sampled
    drafts, and the adaptive policy of top-k trees (`policy()`, asked for only when drafts are top-k: it
    measures costs at its first use; None for a fixed tree). `rank_acceptance` shapes sampled trees
    (`eagle.sampled_trees.best_topology`)."""

    def __init__(self, head: DraftHead, tree: TreeShape, cfg: SamplingConfig, generator: torch.Generator | None,
                 policy: Callable[[], AdaptiveTree | None], rank_acceptance: tuple[float, ...]):
        self.head, self.tree = head, tree
        self.sampled = tree.drafts(not cfg.greedy) == "sample"
        self.policy = None if self.sampled else policy()
        self.process = functools.partial(process_logits, cfg=cfg)
        # Draft draws use the caller's generator where it lives on the head's device (one stream, reproducible).
        on_head = generator is not None and torch.device(generator.device).type == head.device.type
        self.rng = generator if on_head else None
        # Each depth the last cycles may need, laid out on the device before the loop: no upload per tree.
        full = best_topology(tree.total_tokens, tree.depth, tree.branching, rank_acceptance)
        self.shapes = {d: sampled_shape(full.truncated(d), head.device) for d in range(tree.depth + 1)} \
            if self.sampled else {}
        self.depth, self.total, self.keep_growing = 0, tree.total_tokens, None

    def plan(self, remaining: int) -> int:
        """Plan the next cycle for rows that want at most `remaining` more tokens (one comes from the
        target, so no deeper than `remaining - 1`); returns the levels it drafts (0: a plain decoding step)."""
        self.depth, self.total, self.keep_growing = min(self.tree.depth, remaining - 1), self.tree.total_tokens, None
        if self.policy is not None:  # adaptive: growth decided on the device, read once per tree (eagle.tree)
            self.depth, self.total = self.policy.plan(remaining - 1)
            self.keep_growing = functools.partial(self.policy.grow_level, depth=self.depth)
        return self.depth

    def draft(self, roots: torch.Tensor, hidden: torch.Tensor | None, logprobs: torch.Tensor | None) -> DraftTree:
        """The planned forest below roots [B], from each row's head output at its last committed position."""
        if self.sampled:
            return sample_trees(self.head, roots, hidden, logprobs, self.shapes[self.depth], self.process, self.rng)
        return grow_trees(self.head, roots, hidden, logprobs, self.depth, self.tree.branching, self.total,
                          keep_growing=self.keep_growing)

    def observe(self, forest: DraftTree, verdicts: list[Verdict]) -> None:
        """What the adaptive policy learns from a cycle (one row: its acceptance, on the device, unread)."""
        if self.policy is not None:
            self.policy.observe(forest.levels, verdicts[0].accepted, forest.scores[1:].exp().sum())
