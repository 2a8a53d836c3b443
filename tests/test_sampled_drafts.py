"""Sampled drafting at temperature > 0: children drawn without replacement into a fixed shape
(`eagle.sampled_trees`), verified by recursive rejection sampling (`mars.rules.rejection`).

Exact checks where the draws can be enumerated (a node's emitted distribution averaged over every
ordered draw is p, to float precision), chi-square tests where they cannot (`tests/test_lossless.py`
runs `generate` end to end with sampled trees), and the engine's contracts: shapes that keep every
node's children a prefix in draw order, rules at their never-relaxing settings equal strict draw for
draw, costs that bound the exact marginal cost from above.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from helpers import (
    chi_square_pvalue,
    kl_tolerance,
    probability_error,
    summation_tolerance,
    tiny_generator,
    tv_tolerance,
)

from eagle.sampled_trees import Topology, best_topology, gumbel_top
from eagle.tree import DraftTree, depths_of
from mars import SpeculativeGenerator
from mars.accounting.cost import emitted_distribution, sampling_cost
from mars.decoding.settings import TreeShape
from mars.rules import BUILT_IN, RULES, Relaxation, TargetView, make_rule
from mars.rules.base import ARGMAX, RESIDUAL, TARGET
from mars.rules.rejection import recursive_trial, topk_trial
from mars.verification.sampling import process_logits, resolve_sampling
from mars.verification.verify import accept, accept_rows, children

pytestmark = pytest.mark.usefixtures("single_thread")

V = 6


def draw_probability(q: torch.Tensor, draws: tuple[int, ...]) -> float:
    """P(the ordered draws) when sampling from q without replacement."""
    prob, left = 1.0, 1.0
    for x in draws:
        prob *= q[x].item() / left
        left -= q[x].item()
    return prob


def star(draws: tuple[int, ...], p_logits: torch.Tensor, q: torch.Tensor, rule=None):
    """(view, relaxation) of a root whose children are `draws`, drawn from q; p from `p_logits`."""
    k = len(draws)
    tree = DraftTree.checked([0, *draws], [-1] + [0] * k)
    logits = torch.zeros(k + 1, V)
    logits[0] = p_logits
    draft = torch.zeros(k + 1, V)
    draft[0] = q
    view = TargetView(logits, tree.tokens, children(tree), False, draft, k)
    return view, (rule.relax(view) if rule is not None else Relaxation.none(view))


def every_draw(q: torch.Tensor, k: int):
    """Every ordered k-draw from q's support with its probability."""
    support = [x for x in range(V) if q[x] > 0]
    for draws in itertools.permutations(support, k):
        yield draws, draw_probability(q, draws)


def normalised(values: list[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values]


def recursive_rejection(p: list[float], q: list[float], draws: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """Recursive rejection sampling written out one child at a time in float64, from its definition
    (`mars.rules.rejection`'s docstring), independently of the vectorised trial: (each child's acceptance
    chance when its turn comes, the residual drawn from after every child is rejected). r_1 = p, s_1 = q;
    x_i accepted with min(1, r_i(x_i) / s_i(x_i)); r_{i+1} = norm(max(0, r_i - s_i)) (r_i kept where that
    is 0: x_i was then accepted with certainty), s_{i+1} = norm(s_i without x_i)."""
    r, s, chances = normalised(p), normalised(q), []
    for x in draws:
        chances.append(min(1.0, r[x] / s[x]))
        rest = [max(0.0, a - b) for a, b in zip(r, s, strict=True)]
        r = normalised(rest) if sum(rest) > 0 else r
        s = normalised([0.0 if y == x else v for y, v in enumerate(s)])
    return chances, r


CASES = {  # (p logits, q); -inf = filtered out by top-k / top-p
    "full supports": (torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.0]), torch.tensor([0.3, 0.1, 0.05, 0.25, 0.2, 0.1])),
    "q misses p's top token": (torch.tensor([2.5, 0.2, -0.5, 0.3, 0.0, -1.0]),
                               torch.tensor([0.0, 0.4, 0.1, 0.3, 0.2, 0.0])),
    "p filtered": (torch.tensor([1.0, -math.inf, 0.5, -math.inf, 0.3, -math.inf]),
                   torch.tensor([0.1, 0.3, 0.2, 0.2, 0.1, 0.1])),
}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_recursive_rejection_averaged_over_every_draw_emits_p_exactly(case, k):
    p_logits, q = CASES[case]
    p = p_logits.softmax(-1)
    average, total, count = torch.zeros(V), 0.0, 0
    for draws, prob in every_draw(q, k):
        view, relax = star(draws, p_logits, q)
        average += prob * emitted_distribution(view, relax, torch.tensor([0]))[0]
        total += prob
        count += 1
    assert total == pytest.approx(1.0, abs=1e-6)
    # A float32 sum over the draws of nonnegative terms (magnitude p itself); each draw's pi(x) went through
    # k trials, each a ratio of p to q and a residual, both renormalised over V.
    tolerance = summation_tolerance(count, p, term_error=2 * k * probability_error(V) + k + 1)
    assert ((average - p).abs() <= tolerance).all(), (average, p)


def test_a_single_draw_is_accepted_with_the_overlap_of_p_and_q():
    """One child x ~ q: accepted with probability sum_x min(p, q) (what the head's training aims at)."""
    p_logits, q = CASES["full supports"]
    p = p_logits.softmax(-1)
    accepted = sum(prob * min(1.0, view.trial.ratio[0, 1].item())
                   for (draws, prob) in every_draw(q, 1) for view, _ in [star(draws, p_logits, q)])
    # A float32 sum over V of terms <= 1 in all, against float64 over ratios off by a probability's error.
    tolerance = summation_tolerance(V, 1.0, term_error=probability_error(V) + 1)
    assert accepted == pytest.approx(torch.minimum(p, q).sum().item(), abs=tolerance)


def test_the_trial_of_deterministic_children_is_the_top_k_trial():
    """Children drawn from a q that is certain of them one after another: ratio r(x) and the residual
    with the tried children zeroed, as for top-k children (`topk_trial`)."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25] * 4, [0.25] * 4])
    kids = children(DraftTree.checked([0, 1, 3], [-1, 0, 0]))
    tokens = torch.tensor([0, 1, 3])
    # q of the first draw puts (almost) all its mass on token 1, then the rest on token 3.
    q = torch.tensor([[0.0, 1 - 1e-7, 0.0, 1e-7], [0.0] * 4, [0.0] * 4])
    sampled, fixed = recursive_trial(p, q, kids, tokens, 2), topk_trial(p, kids, tokens)
    assert torch.allclose(sampled.ratio, fixed.ratio, atol=1e-5)
    assert torch.allclose(sampled.residual, fixed.residual, atol=1e-5)


# --- the sampled verifier against the exact outcome distribution -----------------------------------

# Hand-built sampled trees: (parents, tokens), each node's children distinct draws from its own q row. Every
# q row differs from its parent's (node 1's children are likely under q_1 and unlikely under q_0), so a
# verifier that judges a node's children by another node's row emits a different distribution.
SAMPLED_TREES = {
    "depth 2": ([-1, 0, 0, 1, 1, 2], [5, 0, 1, 2, 3, 4]),
    "depth 3": ([-1, 0, 0, 1, 1, 3, 3], [5, 1, 0, 3, 2, 4, 5]),
}
DRAFT_ROWS = [  # q_i: what node i's children were drawn from (rows of childless nodes unused)
    [0.45, 0.35, 0.05, 0.05, 0.05, 0.05],
    [0.05, 0.05, 0.40, 0.40, 0.05, 0.05],
    [0.05, 0.05, 0.05, 0.05, 0.70, 0.10],
    [0.10, 0.05, 0.05, 0.10, 0.40, 0.30],
    [1 / V] * V, [1 / V] * V, [1 / V] * V,
]
TARGET_ROWS = [  # the target's logits at each node
    [0.5, 1.2, 0.0, 0.3, -0.2, 0.1],
    [0.0, 0.4, 0.9, 0.2, 0.6, -0.3],
    [0.3, -0.1, 0.2, 0.8, 1.0, 0.0],
    [-0.2, 0.5, 0.1, 0.3, 0.4, 1.1],
    [0.2, 0.1, 0.0, 0.7, -0.4, 0.3],
    [0.6, 0.0, 0.3, 0.1, 0.2, 0.4],
    [0.1, 0.9, -0.2, 0.0, 0.5, 0.3],
]
ALPHA = 1e-3  # the chi-square test's false-alarm rate: a correct verifier fails it with a random seed this often


def exact_outcomes(parents: list[int], tokens: list[int], p: list[list[float]],
                   q: list[list[float]]) -> dict[tuple[tuple[int, ...], int], float]:
    """P(accepted path, next token) of strict verification of a fixed sampled tree: from the root, the
    children are tried in draw order (`recursive_rejection` with the node's own p and q rows); an accepted
    child's subtree is walked the same way; once every child of a node is rejected (or it has none) the
    next token is drawn from the residual (p at a leaf). Float64, node by node."""
    out: dict[tuple[tuple[int, ...], int], float] = Counter()

    def visit(node: int, path: tuple[int, ...], chance: float) -> None:
        kids = [j for j, parent in enumerate(parents) if parent == node]
        chances, residual = recursive_rejection(p[node], q[node], tuple(tokens[j] for j in kids))
        for kid, accept_chance in zip(kids, chances, strict=True):
            visit(kid, (*path, kid), chance * accept_chance)
            chance *= 1.0 - accept_chance
        for token, prob in enumerate(residual):
            if chance * prob > 0:
                out[(path, token)] += chance * prob

    visit(0, (0,), 1.0)
    return out


def sampled_outcomes(parents: list[int], tokens: list[int], logits: torch.Tensor, q: torch.Tensor,
                     samples: int, copies: int = 20) -> Counter:
    """(path, next token) of `samples` strict verifications of the tree, `copies` at a time as a forest of
    identical trees (each tree its own uniforms and its own final draw), from one seeded generator."""
    n, width = len(parents), max(Counter(parents[1:]).values())
    forest = DraftTree.forest(torch.tensor(tokens).expand(copies, n), torch.tensor(parents).expand(copies, n),
                              torch.tensor(depths_of(parents)).expand(copies, n), torch.zeros(copies, n),
                              max(depths_of(parents)), draft_probs=q[None].expand(copies, n, V), width=width)
    cfg = resolve_sampling(temperature=1.0)
    processed = process_logits(logits.repeat(copies, 1), cfg)
    generator, counts = torch.Generator().manual_seed(0), Counter()
    for _ in range(samples // copies):
        counts.update((tuple(v.path), v.next_token) for v in accept_rows(processed, forest, cfg, generator))
    return counts


def tree_case(name: str) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    parents, tokens = SAMPLED_TREES[name]
    n = len(parents)
    return parents, tokens, torch.tensor(TARGET_ROWS[:n]), torch.tensor(DRAFT_ROWS[:n])


@pytest.mark.parametrize("name", list(SAMPLED_TREES))
def test_the_sampled_verifier_emits_the_exact_outcome_distribution_of_a_hand_built_tree(name):
    """`accept_rows` on a fixed sampled tree (each node's children judged with its own q row) against the
    exact joint distribution of (accepted path, next token): a chi-square test over 6,000 verifications,
    false-alarm rate ALPHA, and every outcome the verifier emits possible."""
    parents, tokens, logits, q = tree_case(name)
    p = process_logits(logits, resolve_sampling(temperature=1.0)).double().softmax(-1).tolist()
    exact = exact_outcomes(parents, tokens, p, q.double().tolist())
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    assert max(len(path) for path, _ in exact) == max(depths_of(parents)) + 1  # the deepest paths are possible
    counts = sampled_outcomes(parents, tokens, logits, q, samples=6_000)
    assert chi_square_pvalue(counts, exact) > ALPHA


@pytest.mark.parametrize("name", list(SAMPLED_TREES))
def test_the_exact_check_tells_apart_a_verifier_judging_children_by_their_parent_s_q_row(name):
    """The test above has the power to catch a wrong q row: verification that judges each node's children
    by its parent's row (fed here as the tree's draft distributions) fails it at the same seed, with a
    third of its samples."""
    parents, tokens, logits, q = tree_case(name)
    p = process_logits(logits, resolve_sampling(temperature=1.0)).double().softmax(-1).tolist()
    exact = exact_outcomes(parents, tokens, p, q.double().tolist())
    wrong = q[[max(parent, 0) for parent in parents]]  # node i's row: its parent's (the root keeps its own)
    assert chi_square_pvalue(sampled_outcomes(parents, tokens, logits, wrong, samples=2_000), exact) < ALPHA


def test_gumbel_top_draws_without_replacement_in_draw_order():
    q = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    generator = torch.Generator().manual_seed(0)
    draws = gumbel_top(q[None].expand(8000, -1), 2, generator)
    counts = Counter(map(tuple, draws.tolist()))
    exact = {d: draw_probability(q, d) for d in itertools.permutations(range(4), 2)}
    assert 4 not in draws  # a token q excludes is never drawn while others remain
    assert chi_square_pvalue(counts, exact) > 0.01


@pytest.mark.parametrize("shape", [(8, 4, 2), (20, 4, 5), (20, 6, 4), (60, 6, 10), (5, 5, 1), (1, 1, 1)])
def test_the_sampled_shape_keeps_siblings_a_prefix_in_draw_order(shape):
    total, depth, branching = shape
    topology = best_topology(total, depth, branching)
    parents, ranks, depths = topology.parents, topology.ranks, topology.depths
    assert topology.size == total + 1 and parents[0] == -1
    assert all(0 <= parents[i] < i for i in range(1, topology.size))  # parents before children
    assert list(depths) == sorted(depths) and max(depths) <= depth  # breadth-first, no deeper than asked
    for node in range(topology.size):
        kids = [i for i in range(1, topology.size) if parents[i] == node]
        assert [ranks[i] for i in kids] == list(range(len(kids))) and len(kids) <= branching
    if branching == 1:
        assert parents == tuple(range(-1, total))  # a chain


def test_the_shape_spends_nodes_where_acceptance_is_likely():
    """With a first child accepted far more often than a second, the best shape is deep along first
    children; with equal rates it is wide."""
    deep = best_topology(10, 8, 4, (0.9, 0.05, 0.02, 0.01))
    wide = best_topology(10, 8, 4, (0.2, 0.2, 0.2, 0.2))
    assert deep.levels == 8 and wide.levels <= 3
    assert Topology((-1, 0, 1), (0, 0, 0)).width == 1


def rank_paths(topology: Topology) -> list[tuple[int, ...]]:
    """Each node named by the ranks along its path from the root (the root: ()), in node order."""
    paths: list[tuple[int, ...]] = []
    for parent, rank in zip(topology.parents, topology.ranks, strict=True):
        paths.append(() if parent < 0 else (*paths[parent], rank))
    return paths


@pytest.mark.parametrize("shape", [(10, 8, 4, (0.9, 0.05, 0.02, 0.01)), (20, 6, 4, (0.5, 0.3, 0.2)),
                                   (12, 4, 3, (0.4, 0.4, 0.2))])
def test_a_truncated_shape_is_the_shape_s_nodes_up_to_that_depth(shape):
    """`truncated(d)`: the same tree cut below depth d, by what it contains (nodes named by their rank
    paths, so renumbering would show), not by how it is computed."""
    topology = best_topology(*shape)
    named = rank_paths(topology)
    for depth in range(topology.levels + 2):
        cut = topology.truncated(depth)
        kept = rank_paths(cut)
        assert sorted(kept) == sorted(path for path in named if len(path) <= depth)
        assert kept == named[: len(kept)]  # node i is the same node: what the drafts drawn for it rely on
        assert cut.levels == min(depth, topology.levels)
        assert all(0 <= cut.parents[i] < i for i in range(1, cut.size))  # still a valid shape


def sampled_tree(seed: int, topology: Topology) -> tuple[DraftTree, torch.Tensor]:
    """A tree of `topology` with random q per node and children drawn from it; random target logits."""
    generator = torch.Generator().manual_seed(seed)
    n = topology.size
    q = torch.randn(n, V, generator=generator).mul(1.5).softmax(-1)
    tokens = [0] * n
    for node in range(n):
        kids = [i for i in range(1, n) if topology.parents[i] == node]
        if kids:
            drawn = gumbel_top(q[node:node + 1], len(kids), generator)[0].tolist()
            for kid, token in zip(kids, drawn, strict=True):
                tokens[kid] = token
    tree = DraftTree.checked(tokens, list(topology.parents))
    tree.draft_probs, tree.width = q, topology.width
    logits = torch.randn(n, V, generator=generator) + 3.0
    return tree, logits


NEVER = [name for name in BUILT_IN if RULES[name].never_relaxes is not None]


@pytest.mark.parametrize("name", NEVER)
def test_every_rule_at_its_never_relaxing_setting_is_strict_on_sampled_drafts(name):
    rule = make_rule(name, **RULES[name].never_relaxes)
    for seed in range(10):
        tree, logits = sampled_tree(seed, best_topology(6 + seed % 4, 3, 3, (0.5, 0.3, 0.2)))
        for settings in (dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)):
            never, strict = resolve_sampling(rule=rule, **settings), resolve_sampling(**settings)
            g_never, g_strict = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            a = accept(process_logits(logits, never), tree, never, g_never)
            b = accept(process_logits(logits, strict), tree, strict, g_strict)
            assert (a.path, a.next_token, a.tokens) == (b.path, b.next_token, b.tokens)
            assert not any(s.relaxed or s.tv or s.kl for s in a.steps)
            assert torch.equal(g_never.get_state(), g_strict.get_state())


RELAXING = [(name, params) for name in BUILT_IN for params in RULES[name].relaxing or ()]


def given_the_draw(relax: Relaxation, p: list[float], q: list[float], draws: tuple[int, ...]) -> tuple[list, list]:
    """(pi, pi_strict) at a root whose children are `draws` (from q), computed here from the rule's
    relaxation and `recursive_rejection`, not by `mars.accounting.cost`: the emitted distributions given the draw."""
    chances, residual = recursive_rejection(p, q, draws)
    kids = range(1, len(draws) + 1)
    tolerance = 0.0 if relax.tolerance is None else relax.tolerance[0].item()
    tested = True if relax.tested is None else bool(relax.tested[0])
    rule_chances = [1.0 if relax.outright[0, j] else min(1.0, c + tolerance) if tested else 0.0
                    for j, c in zip(kids, chances, strict=True)]
    kind = RESIDUAL if relax.fallback is None else int(relax.fallback[0])
    argmax = max(range(V), key=lambda x: p[x])
    fallback = {RESIDUAL: residual, TARGET: p, ARGMAX: [float(x == argmax) for x in range(V)]}[kind]

    def emitted(accept: list[float], last: list[float]) -> list[float]:
        pi, reach = [0.0] * V, 1.0
        for x, a in zip(draws, accept, strict=True):
            pi[x] += reach * a
            reach *= 1.0 - a
        return [v + reach * f for v, f in zip(pi, last, strict=True)]

    return emitted(rule_chances, fallback), emitted(chances, residual)


@pytest.mark.parametrize("name,params", RELAXING, ids=[f"{n}-{p}" for n, p in RELAXING])
def test_the_reported_cost_on_sampled_drafts_bounds_the_exact_cost(name, params):
    """Over every draw of two children: each position reports TV(pi, pi_strict) and KL(pi || pi_strict)
    of its own draw, the KL +inf exactly where pi puts mass on a token pi_strict excludes (both computed
    here independently); the marginal emitted distribution's TV from p is at most the average reported,
    and so is its KL wherever that average is finite. Strict reports 0."""
    rule = make_rule(name, **params)
    p_logits = torch.tensor([1.0, 0.9, 0.2, 0.8, -0.3, 0.1]) + 2.0
    q = torch.tensor([0.3, 0.1, 0.05, 0.25, 0.2, 0.1])
    p = p_logits.softmax(-1)
    p64, q64 = p_logits.double().softmax(-1).tolist(), q.double().tolist()
    marginal, tv_bound, kl_bound, draws_seen, infinite = torch.zeros(V), 0.0, 0.0, 0, 0
    for draws, prob in every_draw(q, 2):
        draws_seen += 1
        view, relax = star(draws, p_logits, q, rule)
        marginal += prob * emitted_distribution(view, relax, torch.tensor([0]))[0]
        cost = sampling_cost(view, relax, torch.tensor([0]))
        assert cost.bound
        pi, strict = given_the_draw(relax, p64, q64, draws)
        tv = 0.5 * sum(abs(a - b) for a, b in zip(pi, strict, strict=True))
        kl = sum(a * math.log(a / b) if b > 0 else math.inf for a, b in zip(pi, strict, strict=True) if a > 0)
        assert cost.tv.item() == pytest.approx(tv, abs=tv_tolerance(V))
        if math.isinf(kl):
            assert math.isinf(cost.kl.item()), (draws, pi, strict)
            infinite += 1
        else:
            assert cost.kl.item() == pytest.approx(kl, abs=kl_tolerance(V, kl)), (draws, pi, strict)
        tv_bound += prob * cost.tv.item()
        kl_bound += prob * cost.kl.item()
        strict_view, none = star(draws, p_logits, q)
        assert sampling_cost(strict_view, none, torch.tensor([0])).tv.item() == 0.0
    tv = 0.5 * (marginal - p).abs().sum().item()
    kl = torch.where(marginal > 0, marginal * (marginal / p).log(), 0.0).sum().item()
    # The bound holds up to rounding (several rules meet it exactly): the marginal is a float32 average over
    # the draws (one rounding each), every cost a float32 sum over V (tv_tolerance, kl_tolerance).
    assert 1e-3 < tv <= tv_bound + tv_tolerance(V, roundings=draws_seen)  # the rule does move the output here
    assert math.isinf(kl_bound) == (infinite > 0) and math.isfinite(kl)
    if not infinite:
        assert kl <= kl_bound + kl_tolerance(V, kl, roundings=draws_seen)


@pytest.mark.parametrize("name,params", RELAXING, ids=[f"{n}-{p}" for n, p in RELAXING])
def test_the_cost_of_a_sampled_node_with_one_child_is_exact(name, params):
    """One child x ~ q: every draw reports the TV and KL of the emitted distribution averaged over
    every draw, exactly, and not as a bound."""
    rule = make_rule(name, **params)
    p_logits = torch.tensor([1.0, 0.9, 0.2, 0.8, -0.3, 0.1]) + 2.0
    q = torch.tensor([0.3, 0.1, 0.05, 0.25, 0.2, 0.1])
    p = p_logits.softmax(-1)
    marginal, reported = torch.zeros(V), []
    for draws, prob in every_draw(q, 1):
        view, relax = star(draws, p_logits, q, rule)
        marginal += prob * emitted_distribution(view, relax, torch.tensor([0]))[0]
        cost = sampling_cost(view, relax, torch.tensor([0]))
        assert not cost.bound
        reported.append((cost.tv.item(), cost.kl.item()))
    tv = 0.5 * (marginal - p).abs().sum().item()
    kl = torch.where(marginal > 0, marginal * (marginal / p).log(), 0.0).sum().item()
    assert tv > 1e-3  # the rule does move the output here
    # Two float32 computations of each: the closed form, and the average over the draws (one rounding each).
    tv_tol, kl_tol = tv_tolerance(V, roundings=len(reported)), kl_tolerance(V, kl, roundings=len(reported))
    for reported_tv, reported_kl in reported:
        assert reported_tv == pytest.approx(tv, abs=tv_tol) and reported_kl == pytest.approx(kl, abs=kl_tol)


@pytest.mark.parametrize("name,params", RELAXING, ids=[f"{n}-{p}" for n, p in RELAXING])
def test_a_chain_costs_the_same_by_its_shortcut_as_node_by_node(name, params):
    """A chain (width 1) skips the given-the-draw distributions; the same chain read as part of a
    wider tree (width 2: every node judged by its own child count) reports the same cost at every
    node, the leaf (which emits p) included."""
    rule = make_rule(name, **params)
    moved = 0.0
    for seed in range(6):
        tree, logits = sampled_tree(seed, Topology((-1, 0, 1, 2), (0, 0, 0, 0)))
        for settings in (dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)):
            cfg = resolve_sampling(rule=rule, **settings)
            costs = []
            for width in (1, 2):
                view = TargetView(process_logits(logits, cfg), tree.tokens, children(tree), False,
                                  tree.draft_probs, width)
                costs.append(sampling_cost(view, rule.relax(view), torch.arange(tree.size)))
            chain, general = costs
            assert not chain.bound and general.bound
            assert chain.tv[-1] == 0 and chain.kl[-1] == 0  # the leaf emits p
            # The same pi and reference tables, summed alike: the same TV. The KL's log of the reference is a
            # log_softmax in the chain, the log of the softmax in general: equal up to rounding (kl_tolerance).
            assert torch.equal(chain.tv, general.tv)
            finite = general.kl.isfinite()
            assert torch.equal(chain.kl.isfinite(), finite)
            assert ((chain.kl - general.kl)[finite].abs() <= kl_tolerance(V, general.kl[finite])).all()
            moved += chain.tv.sum().item()
    assert moved > 1e-3  # the rule does relax on these chains


@pytest.mark.parametrize("name,params", RELAXING, ids=[f"{n}-{p}" for n, p in RELAXING])
def test_a_rule_accepts_outright_over_the_vocabulary_what_it_accepts_among_the_children(name, params):
    """`Relaxation.accepts` restricted to the drafted children is `outright` (the exact cost relies on it)."""
    rule = make_rule(name, **params)
    generator = torch.Generator().manual_seed(0)
    tree = DraftTree.checked([0, 1, 0, 3, 4, 5, 2], [-1, 0, 0, 0, 1, 1, 2])
    for _ in range(20):
        logits = torch.randn(tree.size, V, generator=generator) * 2
        view = TargetView(logits, tree.tokens, children(tree), False)
        relax = rule.relax(view)
        assert relax.accepts is not None, f"{name} gives no accepts: its sampled costs stay bounds"
        nodes = torch.arange(tree.size)
        assert torch.equal(relax.outright, view.kids & relax.accepts(nodes)[:, view.tokens])


def test_generate_drafts_sampled_children_when_sampling_and_top_k_when_greedy():
    gen = tiny_generator(0, 1, sharpen=2.5, vocab_size=12, total_tokens=6, depth=3, branching=3)
    prompt = torch.tensor([[3, 7, 1]])
    sampled = gen.generate(prompt, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert sampled.stats.cost()["cost_bound_tokens"] == 0 and sampled.stats.sampled > 0  # strict: exactly 0
    relaxed = gen.generate(prompt, max_new_tokens=12, temperature=1.0, rule="mars",
                           generator=torch.Generator().manual_seed(0))
    assert relaxed.stats.cost()["cost_bound_tokens"] == relaxed.stats.sampled > 0  # several children: bounds
    topk = SpeculativeGenerator(gen.target.model, gen.head, TreeShape(6, 3, 3, drafting="topk"))
    fixed = topk.generate(prompt, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert fixed.stats.cost()["cost_bound_tokens"] == 0 and fixed.stats.sampled > 0
    greedy = gen.generate(prompt, max_new_tokens=12)
    assert greedy.tokens == topk.generate(prompt, max_new_tokens=12).tokens


def test_generate_with_a_never_relaxing_rule_is_strict_draw_for_draw_on_sampled_drafts():
    gen = tiny_generator(0, 1, sharpen=2.5, vocab_size=12, total_tokens=8, depth=3, branching=3)
    prompt = torch.tensor([[3, 7, 1]])
    for seed in range(4):
        outs = [gen.generate(prompt, max_new_tokens=16, temperature=1.0, generator=torch.Generator().manual_seed(seed),
                             **settings) for settings in (dict(rule="strict"), dict(rule="mars", theta=1.0,
                                                                                   margin="prob_ratio"))]
        assert outs[0].tokens == outs[1].tokens and outs[0].accept_lengths == outs[1].accept_lengths


def test_drafting_settings_are_checked():
    gen = tiny_generator(0, 1, sharpen=2.5, vocab_size=12, total_tokens=6, depth=3, branching=3)
    with pytest.raises(ValueError, match="drafting must be one of auto, topk, sample"):
        SpeculativeGenerator(gen.target.model, gen.head, TreeShape(6, 3, 3, drafting="beam"))
    with pytest.raises(ValueError, match="sampled tree's shape must not depend on its draws"):
        SpeculativeGenerator(gen.target.model, gen.head, TreeShape(6, 3, 3, adaptive=True, drafting="sample"))
