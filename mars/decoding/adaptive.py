"""Speculation that never loses to plain decoding: each cycle's tree sized from measured costs.

A cycle that drafts d levels and verifies n nodes costs about

    d * draft_level + verify(n + 1) + catch_up        and emits  1 + accepted  tokens,

while a plain decoding step costs `decode` and emits one. The costs are measured on this machine
when the generator starts (`measure_costs`), because they differ by an order of magnitude between
machines: on a CPU without bf16 matrix instructions a 21-token bf16 verification costs five
decodes, on one with them 1.5, on a GPU about one.

`AdaptiveTree` keeps, per depth l, the survival rate s_l = P(at least l drafted tokens accepted),
as an exponential moving average over the cycles that drafted that deep (prior: 0.8^l, optimistic,
so that speculation is tried first). Before a cycle it picks the depth with the best expected rate
(1 + sum_{l<=d} s_l) / cost(d), where depth 0 is a plain decoding step (the tree is the root alone,
which `score_tree` + `accept` turn into exactly plain decoding). After `probe_every` plain steps in
a row it drafts once at full depth with a narrow tree (the draft's best nodes, about one chain), so
that the estimates follow the text at little cost. While drafting, a level
is only kept when the draft's own confidence in it (the summed probability of the level's best
nodes, scaled by how well that confidence has predicted acceptance so far) pays for its cost.

Host reads: the policy's survival estimates and plans live on the host and are fed host integers (a
verdict's accepted length), so planning costs no synchronisation. What the draft says is on the
device and stays there: `grow_level` answers with a device bool and `eagle.tree.grow_trees` reads a
tree's decisions in one transfer after drafting its planned levels, then drops the levels from the first
refused one on: the tree verified is the one that a read per level, stopping at the first refusal,
gave (and no later level would have paid: a level's best nodes never carry more probability than
the level above's). The confidence calibration is updated on the device from the tree's predicted
acceptance. A cycle thus costs at most one read more than a fixed tree's (three in all) instead of
one per level and one for the calibration. The price: the planned levels are all drafted, including
those then dropped (`cost` always counted them).

Choosing the tree from the draft and from past cycles never looks at the current cycle's target
distribution or random draws, so strict verification stays exact (greedy) and lossless (sampling),
and MARS accepts on any given tree exactly what it would otherwise.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from eagle.heads import DraftHead
from eagle.tree import DraftTree
from mars.adapter import TargetModel, synchronize


@dataclass(frozen=True)
class CycleCosts:
    """Seconds of the pieces of a cycle, measured on this machine."""

    decode: float  # one plain decoding step of the target
    draft_level: float  # one draft level (the head on `branching` nodes, then top-k)
    verify_nodes: tuple[int, ...]  # tree sizes measured (the root included), ascending
    verify_seconds: tuple[float, ...]  # a target forward over that many tree nodes

    def verify(self, nodes: int) -> float:
        """Cost of scoring `nodes` tree nodes, linear between (and beyond) the measured sizes."""
        xs, ys = self.verify_nodes, self.verify_seconds
        i = max(1, min(len(xs) - 1, next((j for j, x in enumerate(xs) if x >= nodes), len(xs) - 1)))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (nodes - x0) / (x1 - x0), 0.0)


def _median_seconds(fn, repeats: int, devices: set[torch.device]) -> float:
    times = []
    for _ in range(repeats):
        synchronize(devices)
        start = time.perf_counter()
        fn()
        synchronize(devices)  # a GPU runs ahead of the host: time its kernels, not their launch
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def measure_costs(target: TargetModel, head: DraftHead, branching: int, max_nodes: int, prompt_len: int = 64,
                  repeats: int = 5) -> CycleCosts:
    """Time a decode, tree verifications of several sizes and a draft level on a random prompt."""
    vocab = min(int(head.config.vocab_size), 1000)
    devices = target.all_devices | {head.device}
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=generator)
    capacity = prompt_len + repeats * (max_nodes + 2) + 8
    _, features = target.prefill(prompt, capacity=capacity)
    head.reset()
    hidden, _ = head.extend(features, torch.cat([prompt[1:], prompt[:1]]).to(head.device))
    target.decode(int(prompt[0]))  # warm-up
    decode = _median_seconds(lambda: target.decode(int(prompt[1])), repeats, devices)
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, max_nodes + 1} & set(range(1, max_nodes + 2)) | {max_nodes + 1})
    verify = []
    for n in sizes:
        chain = DraftTree(prompt[:n].clone(), torch.arange(-1, n - 1), torch.arange(n), torch.zeros(n))
        target.score_tree(chain)  # warm-up for this shape
        verify.append(_median_seconds(lambda chain=chain: target.score_tree(chain), repeats, devices))
    k = max(1, min(branching, head.config.draft_vocab_size))
    frontier_hidden = hidden[None].expand(k, -1)
    tokens = prompt[:k].to(head.device)
    mask = torch.eye(k, dtype=torch.bool, device=head.device)

    def level():
        _, logprobs = head.propose(frontier_hidden, tokens, 1, mask)
        logprobs.topk(k, dim=-1)
        head.rollback()

    level()
    draft_level = _median_seconds(level, repeats, devices)
    target.end_sequence()  # the measurement's sequence is not a real one
    head.reset()
    if len(sizes) == 1:  # a one-node tree only: extrapolate with a decode per node
        sizes, verify = [1, 2], [verify[0], verify[0] + decode]
    return CycleCosts(decode, draft_level, tuple(sizes), tuple(verify))


class AdaptiveTree:
    """Chooses each cycle's depth and tree size (see the module docstring)."""

    def __init__(self, costs: CycleCosts, depth: int, branching: int, total_tokens: int, memory: float = 0.9,
                 probe_every: int = 16):
        self.costs, self.max_depth, self.branching, self.max_tokens = costs, depth, branching, total_tokens
        self.memory, self.probe_every = memory, probe_every
        self.survival = [0.8 ** (level + 1) for level in range(depth)]  # s_1 .. s_depth
        # Observed acceptance / the draft's predicted acceptance: a float, or a 0-dim tensor on the draft's
        # device once `observe` is given device predictions (then nothing reads it back).
        self.confidence_scale: float | torch.Tensor = 1.0
        self.plain_streak = 0

    def nodes(self, depth: int) -> int:
        """Tree size for `depth` levels: EAGLE-2's candidates (k, then k^2 per level), capped."""
        return min(self.max_tokens, self.branching + (depth - 1) * self.branching ** 2) if depth else 0

    def cost(self, depth: int) -> float:
        if depth == 0:
            return self.costs.decode
        # The draft catches up on the accepted tokens in about one level's time.
        return (depth + 1) * self.costs.draft_level + self.costs.verify(self.nodes(depth) + 1)

    def rate(self, depth: int) -> float:
        """Expected tokens per second when drafting `depth` levels."""
        return (1 + sum(self.survival[:depth])) / self.cost(depth)

    def plan(self, remaining_depth: int) -> tuple[int, int]:
        """(depth, total_tokens) for the next cycle; (0, 0) is a plain decoding step."""
        limit = min(self.max_depth, remaining_depth)
        if self.plain_streak >= self.probe_every and limit > 0:
            # Probe: refresh the acceptance estimates with the draft's best `limit` nodes (about its
            # best chain), which costs little more than a decode even where full trees do not pay.
            self.plain_streak = 0
            return limit, min(limit, self.max_tokens)
        depth = max(range(limit + 1), key=self.rate)
        self.plain_streak = self.plain_streak + 1 if depth == 0 else 0
        return depth, self.nodes(depth)

    def grow_level(self, level: int, best_scores: torch.Tensor, depth: int) -> torch.Tensor:
        """Whether drafting `level` pays: its expected accepted tokens (the draft's probability of its
        best candidates, best_scores [1, k] their cumulative log-probabilities, scaled by the confidence
        calibration) against what the level costs. A 0-dim bool on the scores' device, computed without a
        host read (`eagle.tree.grow_trees` reads a tree's decisions together)."""
        expected = (self.confidence_scale * best_scores.float().exp().sum()).clamp(max=1.0)
        seconds_per_token = self.cost(depth) / (1 + sum(self.survival[:depth]))
        return expected * seconds_per_token >= self.costs.draft_level

    def observe(self, depth: int, accepted: int, predicted: float | torch.Tensor) -> None:
        """A cycle drafted `depth` levels, `accepted` tokens were accepted, the draft predicted `predicted`
        (a float, or a 0-dim tensor on the draft's device: the calibration is then updated there, unread)."""
        for level in range(depth):
            hit = float(accepted >= level + 1)
            self.survival[level] = self.memory * self.survival[level] + (1 - self.memory) * hit
        if isinstance(predicted, torch.Tensor):
            predicted = predicted.float()
            ratio = (accepted / predicted).clamp(max=4.0)  # inf or nan where nothing was predicted: not used
            updated = self.memory * self.confidence_scale + (1 - self.memory) * ratio
            self.confidence_scale = torch.where(predicted > 0, updated, self.confidence_scale)
        elif predicted > 0:
            ratio = min(accepted / predicted, 4.0)
            self.confidence_scale = self.memory * self.confidence_scale + (1 - self.memory) * ratio
