"""EAGLE-2 tree growth (`eagle.tree.grow_trees`, `grow_tree` its batch of one) against EAGLE-2 written
out node by node from its definition, with and without the adaptive policy's per-level decisions;
forests of B rows against each row grown alone; the roots-only forest."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import tiny_model

from eagle import Eagle3Head
from eagle.tree import DraftTree, _draft, _rerank, grow_tree, grow_trees
from mars.decoding.adaptive import AdaptiveTree, CycleCosts
from mars.diagnostics.syncs import SyncCounter

pytestmark = pytest.mark.usefixtures("single_thread")


def eagle2_by_hand(head, root: int, hidden: torch.Tensor, logprobs: torch.Tensor, depth: int, branching: int,
                   total_tokens: int, keep_growing=None) -> tuple[list[int], list[int], list[int], list[float], int]:
    """EAGLE-2 one node at a time on the host: (tokens, parents, depths, scores, levels) of the tree below
    `root`. hidden [H], logprobs [V_d]: the head's output at the last committed position.

    The root's children are the head's k = branching most likely tokens; before each further level
    `keep_growing(level, frontier scores [1, k])` is read (growth stops at its first refusal), then the k
    newest nodes of highest cumulative log-probability each propose their k most likely children, all k
    in one head call (so that the head computes the floats the grower's call does), each seeing the fed
    nodes that are its ancestors. The tree: the `total_tokens` best candidates by score (ties: shallower,
    then drafted first), breadth-first, by decreasing score within a level. With one child per node (a
    chain) and no decisions, levels past `total_tokens` are not grown: none of their nodes would be kept.
    """
    temperature = head.config.confidence_temperature
    if branching == 1 and keep_growing is None:
        depth = min(depth, total_tokens)

    def ranked(lp: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(draft id, log-probability at the confidence temperature) of the k best of lp [V_d], best first."""
        lp = lp if temperature == 1.0 else torch.log_softmax(lp / temperature, dim=-1)
        values = lp.tolist()
        order = sorted(range(len(values)), key=lambda i: -values[i])  # stable: ties to the lower id
        return [(i, lp[i]) for i in order[:branching]]

    def target_id(draft_id: int) -> int:
        return int(head.to_target_ids(torch.tensor(draft_id)))

    # Candidates, numbered in drafting order: token, parent (-1: the root's), depth, score (a float32 scalar).
    token, parent, level_of, score = [], [], [], []
    for i, lp in ranked(logprobs):
        token.append(target_id(i)), parent.append(-1), level_of.append(1), score.append(lp)
    k = len(token)
    frontier, predicted_by = list(range(k)), [hidden] * k  # the nodes to expand, the outputs that predicted them
    fed: list[int] = []  # candidates in the head's tentative cache, in feeding order
    levels = 1
    for level in range(2, depth + 1):
        if keep_growing is not None and not bool(keep_growing(level, torch.stack([score[f] for f in frontier])[None])):
            break

        def is_ancestor_or_self(slot: int, node: int) -> bool:
            while node >= 0 and node != slot:
                node = parent[node]
            return node == slot

        fed = fed + frontier
        mask = torch.tensor([[is_ancestor_or_self(slot, f) for slot in fed] for f in frontier])
        out_hidden, out_lp = head.propose(torch.stack([predicted_by[f] for f in frontier]),
                                          torch.tensor([token[f] for f in frontier]), level - 1, mask)
        children = []
        for row, f in enumerate(frontier):
            for i, lp in ranked(out_lp[row]):
                children.append(len(token))
                token.append(target_id(i)), parent.append(f), level_of.append(level), score.append(score[f] + lp)
                predicted_by.append(out_hidden[row])
        frontier = sorted(children, key=lambda c: -float(score[c]))[:k]  # stable: ties to the first drafted
        levels = level
    head.rollback()
    best = sorted(range(len(token)), key=lambda c: (-float(score[c]), level_of[c]))[:total_tokens]
    kept = sorted(best, key=lambda c: (level_of[c], -float(score[c])))
    index = {c: i + 1 for i, c in enumerate(kept)}
    return ([root] + [token[c] for c in kept], [-1] + [index.get(parent[c], 0) for c in kept],
            [0] + [level_of[c] for c in kept], [0.0] + [float(score[c]) for c in kept], levels)


def assert_is(tree: DraftTree, tokens, parents, depths, scores, levels) -> None:
    assert tree.tokens.tolist() == tokens
    assert tree.parents.tolist() == parents
    assert tree.depths.tolist() == depths
    assert tree.scores.tolist() == scores  # float32 sums of the same float32 terms in the same order: bitwise
    assert tree.levels == levels
    for i, p in enumerate(parents):
        expected = {i} | (set(tree.ancestors[p].nonzero().flatten().tolist()) if p >= 0 else set())
        assert set(tree.ancestors[i].nonzero().flatten().tolist()) == expected


def random_head(rng: random.Random, seed: int) -> Eagle3Head:
    model_config = tiny_model("llama").config
    torch.manual_seed(seed)
    draft_vocab = rng.choice([None, 5, 40])  # the target's, or fewer ids than branching, or a subset
    head = Eagle3Head.for_target(model_config, draft_vocab)
    if draft_vocab is not None:
        head.set_draft_vocab(torch.randperm(model_config.vocab_size)[:draft_vocab])
    head.config.confidence_temperature = rng.choice([1.0, 0.2, 3.0])
    return head


def committed(head: Eagle3Head, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's output after a random prompt of random length: (hidden [H], logprobs [V_d])."""
    n = rng.randint(1, 9)
    head.reset()
    features = torch.randn(n, head.config.feature_size) * rng.choice([1.0, 4.0])
    return head.extend(features, torch.randint(0, head.config.vocab_size, (n,)))


# A policy whose decisions follow the draft: level 2 usually pays, deep levels of a doubtful draft do not.
POLICY_COSTS = CycleCosts(decode=0.01, draft_level=0.004, verify_nodes=(1, 64), verify_seconds=(0.01, 0.012))


def decisions(kind: str, rng: random.Random):
    """keep_growing of a kind: none, decided on the host, deferred on the device, or the adaptive policy's."""
    threshold = rng.uniform(0.05, 2.0)
    if kind == "host":
        return lambda level, scores: bool(scores.exp().sum() >= threshold)
    if kind == "device":
        return lambda level, scores: scores.exp().sum() >= threshold
    if kind == "policy":
        policy = AdaptiveTree(POLICY_COSTS, depth=6, branching=6, total_tokens=60)
        policy.confidence_scale = rng.uniform(0.3, 3.0)
        return lambda level, scores: policy.grow_level(level, scores, 6)
    return None


@pytest.mark.parametrize("seed", range(6))
def test_grow_tree_is_eagle2_by_hand_for_random_heads_and_settings(seed):
    rng = random.Random(seed)
    head = random_head(rng, seed)
    stops = 0
    for _ in range(24):
        hidden, logprobs = committed(head, rng)
        depth, branching, total = rng.randint(0, 6), rng.randint(1, 6), rng.choice([0, 1, 3, 8, 20, 60, 200])
        kind = rng.choice(["none", "host", "device", "policy"])
        keep_growing, root = decisions(kind, rng), rng.randrange(head.config.vocab_size)
        expected = eagle2_by_hand(head, root, hidden, logprobs, depth, branching, total, keep_growing) \
            if depth >= 1 and total >= 1 else ([root], [-1], [0], [0.0], 0)
        tree = grow_tree(head, torch.tensor([root]), hidden, logprobs, depth, branching, total, keep_growing)
        assert_is(tree, *expected)
        assert tree.batch == 1 and head.cache.total == head.cache.length  # tentative nodes dropped
        stops += kind != "none" and 1 <= tree.levels < depth
    assert stops > 0  # some trees stopped early: the refused levels were dropped, not merely never asked for


def test_a_refusal_drops_the_levels_from_it_on_and_reads_once():
    rng = random.Random(7)
    head = random_head(rng, 7)
    hidden, logprobs = committed(head, rng)
    root = torch.tensor([5])  # made outside the counter: on the "device"
    for refused in range(2, 6):
        def refuse(level, scores, refused=refused):  # a decision computed on the device
            return (scores <= 0).all() if level < refused else (scores > 0).all()  # log-probabilities are <= 0

        with SyncCounter() as syncs:
            tree = grow_tree(head, root, hidden, logprobs, 5, 3, 100, refuse)
        assert dict(syncs.by_kind) == {"tolist": 1}
        assert_is(tree, *eagle2_by_hand(head, 5, hidden, logprobs, refused - 1, 3, 100))
    with SyncCounter() as syncs:
        grow_tree(head, root, hidden, logprobs, 5, 3, 100)
    assert syncs.total == 0


@pytest.mark.parametrize("depth", [0, 1, 4])
def test_a_forest_is_each_row_grown_alone(depth):
    """grow_trees over B sequences of different lengths (`propose_rows`) gives each row the tree that
    row's sequence grows alone (`propose`), laid out as a forest: row b's nodes at b * n, parents
    indexing the forest, ancestors block-diagonal."""
    model = tiny_model("llama")
    torch.manual_seed(3)
    head = Eagle3Head.for_target(model.config)
    lengths = [5, 2, 8]
    features = [torch.randn(n, head.config.feature_size) for n in lengths]
    tokens = [torch.randint(0, model.config.vocab_size, (n,)) for n in lengths]
    roots = torch.tensor([11, 12, 13])
    alone = []
    for f, t, root in zip(features, tokens, roots, strict=True):
        head.reset()
        hidden, logprobs = head.extend(f, t)
        alone.append(grow_tree(head, root[None], hidden, logprobs, depth, 3, 7))
    head.reset_rows(len(lengths), torch.device("cpu"))
    m = max(lengths)
    padded = [torch.cat([x, x.new_zeros(m - x.shape[0], *x.shape[1:])]) for x in (*features, *tokens)]
    hidden, logprobs = head.extend_rows(torch.stack(padded[:3]), torch.stack(padded[3:]), lengths,
                                        torch.tensor(lengths))
    with SyncCounter() as syncs:
        forest = grow_trees(head, roots, hidden, logprobs, depth, 3, 7)
    assert syncs.total == 0
    n = alone[0].size
    assert forest.batch == 3 and forest.size == 3 * n and forest.levels == max(t.levels for t in alone)
    for b, tree in enumerate(alone):
        rows = slice(b * n, (b + 1) * n)
        assert forest.tokens[rows].tolist() == tree.tokens.tolist()
        assert forest.depths[rows].tolist() == tree.depths.tolist()
        assert forest.parents[rows].tolist() == [-1] + [p + b * n for p in tree.parents[1:].tolist()]
        # The batched head attends over padded rows: its sums may round differently from one sequence's.
        torch.testing.assert_close(forest.scores[rows], tree.scores, rtol=0, atol=1e-5)
        assert torch.equal(forest.row_ancestors[b], tree.ancestors)
    assert not forest.ancestors[:n, n:].any()  # no tree sees another's nodes


@pytest.mark.parametrize("batch", [1, 3])
def test_a_chain_is_the_general_growers_tree_with_fewer_operations(batch):
    """At branching 1 `grow_trees` takes its chain path (no tree masks, a lower-triangular ancestor matrix):
    the forest equals the general grower's (`_draft` then `_rerank`) bit for bit, for one sequence and for
    B rows of different lengths (`propose_rows`), including total_tokens below and above the depth."""
    model = tiny_model("llama")
    torch.manual_seed(5)
    head = Eagle3Head.for_target(model.config)
    head.config.confidence_temperature = 0.3
    lengths = [6, 2, 9][:batch]
    if batch == 1:
        head.reset()
    else:
        head.reset_rows(batch, torch.device("cpu"))
    m = max(lengths)
    features = torch.randn(batch, m, head.config.feature_size) * 3
    tokens = torch.randint(0, model.config.vocab_size, (batch, m))
    hidden, logprobs = head.extend_rows(features, tokens, lengths, torch.tensor(lengths))
    roots = torch.arange(batch) + 7
    for depth, total in [(1, 1), (4, 4), (6, 3), (3, 9)]:
        chain = grow_trees(head, roots, hidden, logprobs, depth, 1, total)
        general = _rerank(_draft(head, hidden, logprobs, min(depth, total), 1, None), roots, total)
        for name in ("tokens", "parents", "depths", "scores", "ancestors"):
            assert getattr(chain, name).dtype == getattr(general, name).dtype, name
            assert torch.equal(getattr(chain, name), getattr(general, name)), (depth, total, name)
        assert (chain.levels, chain.batch) == (min(depth, total), batch) == (general.levels, general.batch)
        assert head.cache.total == head.cache.length  # tentative nodes dropped
    with pytest.raises(ValueError, match="one node"):  # no mask says nothing of several nodes' ancestors
        head.propose_rows(hidden[:, None].expand(batch, 2, -1), tokens[:, :2], 1, None)


def test_forest_growth_decisions_are_one_per_level_for_all_rows():
    model = tiny_model("llama")
    torch.manual_seed(4)
    head = Eagle3Head.for_target(model.config)
    head.reset_rows(2, torch.device("cpu"))
    features, tokens = torch.randn(2, 4, head.config.feature_size), torch.randint(0, 96, (2, 4))
    hidden, logprobs = head.extend_rows(features, tokens, [4, 3], torch.tensor([4, 3]))
    asked = []

    def refuse_level_4(level, scores):
        asked.append(tuple(scores.shape))
        return scores.new_tensor(level < 4, dtype=torch.bool)

    roots = torch.tensor([1, 2])
    stopped = grow_trees(head, roots, hidden, logprobs, 5, 2, 50, keep_growing=refuse_level_4)
    assert asked == [(2, 2)] * 4  # levels 2..5, each with both rows' frontiers
    shallow = grow_trees(head, roots, hidden, logprobs, 3, 2, 50)
    assert stopped.levels == 3
    for name in ("tokens", "parents", "depths", "scores", "ancestors"):
        assert torch.equal(getattr(stopped, name), getattr(shallow, name)), name


def test_roots_only_is_the_forest_of_lone_roots():
    tokens = torch.tensor([4, 8, 15])
    zero = torch.zeros(3, 1, dtype=torch.long)
    by_hand = DraftTree.forest(tokens[:, None], zero - 1, zero, zero.float(), 0)
    forest = DraftTree.roots_only(tokens)
    for name in ("tokens", "parents", "depths", "scores", "ancestors"):
        assert torch.equal(getattr(forest, name), getattr(by_hand, name)), name
    assert (forest.batch, forest.nodes_per_tree, forest.levels) == (3, 1, 0)
    one = DraftTree.roots_only(42)
    assert one.tokens.tolist() == [42] and one.ancestors.tolist() == [[True]] and one.batch == 1
    # Nothing drafted (depth or size 0, so no head output either): the roots alone, on the roots' device.
    assert torch.equal(grow_trees(None, tokens, None, None, 0, 3, 10).tokens, tokens)
    assert grow_tree(None, 42, None, None, 3, 3, 0).tokens.tolist() == [42]
