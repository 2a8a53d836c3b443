"""Property tests over random logits and random valid trees (hypothesis, derandomized, bounded examples).

Trees: node i > 0 has a parent < i, siblings carry distinct tokens (as EAGLE's top-k drafting
gives). Logits mix arbitrary floats, small integers (so that ties occur) and -inf (masked tokens).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_tree
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eagle.tree import DraftTree
from mars.rules import make_rule
from mars.rules.margin import margin_test
from mars.verification.sampling import SamplingConfig, process_logits, resolve_sampling
from mars.verification.verify import accept

PROPERTY_SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


pytestmark = pytest.mark.usefixtures("single_thread")


@st.composite
def trees(draw, max_nodes: int = 10) -> DraftTree:
    vocab = draw(st.integers(2, 8))
    parents, tokens = [-1], [draw(st.integers(0, vocab - 1))]
    used: dict[int, set[int]] = {0: set()}
    for _ in range(draw(st.integers(0, max_nodes - 1))):
        parent = draw(st.integers(0, len(parents) - 1))
        free = sorted(set(range(vocab)) - used[parent])
        if not free:
            continue
        token = draw(st.sampled_from(free))
        used[parent].add(token)
        used[len(parents)] = set()
        parents.append(parent)
        tokens.append(token)
    tree = make_tree(parents, tokens)
    tree.vocab = vocab  # carried along for the logits strategy
    return tree


def logit_rows(tree: DraftTree, ties: bool = True):
    value = st.floats(-8, 8, allow_nan=False, width=32)
    if ties:
        value = st.one_of(value, st.integers(-3, 3).map(float), st.just(-math.inf))
    row = st.lists(value, min_size=tree.vocab, max_size=tree.vocab, unique=not ties)
    row = row.filter(lambda r: any(map(math.isfinite, r)))
    return st.lists(row, min_size=tree.size, max_size=tree.size).map(lambda rows: torch.tensor(rows))


@st.composite
def tree_and_logits(draw, ties: bool = True):
    """A tree and its rows; drafted children are often boosted, so that deep paths get accepted."""
    tree = draw(trees())
    logits = draw(logit_rows(tree, ties))
    for child in range(1, tree.size):
        logits[tree.parents[child], tree.tokens[child]] += draw(st.sampled_from([0.0, 0.0, 2.0, 6.0]))
    return tree, logits


thetas = st.one_of(st.sampled_from([0.0, 0.5, 0.9]), st.floats(0.0, 1.0))
sampling_configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.8]),
    top_p=st.sampled_from([1.0, 0.95, 0.8, 0.3]),
    top_k=st.integers(0, 5),
    rule=st.one_of(st.builds(make_rule, st.just("strict")),
                   st.builds(make_rule, st.just("mars"), theta=thetas,
                             fallback=st.sampled_from(["strict", "reference"]))),
)


def assert_valid_path(path: list[int], tree: DraftTree) -> None:
    assert path[0] == 0
    for parent, child in zip(path, path[1:], strict=False):
        assert child in tree.children[parent]
    assert len(path) - 1 <= int(tree.depths.max())


def first_argmax(row: torch.Tensor) -> int:
    """The lowest id among the maxima, as plain greedy decoding picks it."""
    values = row.tolist()
    return values.index(max(values))


def root_to_leaf_paths(tree: DraftTree) -> list[list[int]]:
    return [tree.path_to(n) for n in range(tree.size) if not tree.children[n]]


@PROPERTY_SETTINGS
@given(tree_and_logits())
def test_strict_greedy_is_the_longest_argmax_prefix_over_all_root_to_leaf_paths(case):
    tree, logits = case
    tokens = tree.tokens.tolist()
    best: list[int] = [0]
    for path in root_to_leaf_paths(tree):
        prefix = [0]
        for node in path[1:]:
            if tokens[node] != first_argmax(logits[prefix[-1]]):
                break
            prefix.append(node)
        if len(prefix) > len(best):
            best = prefix
    v = accept(logits, tree, SamplingConfig())
    assert v.path == best
    assert v.next_token == first_argmax(logits[best[-1]])
    assert v.relaxed_tokens == 0 and len(v.steps) == len(v.path)


@settings(PROPERTY_SETTINGS, max_examples=160)  # relaxed paths are a minority of examples: more of them
@given(tree_and_logits(ties=False), thetas)
def test_mars_greedy_is_the_deepest_valid_path_with_fewest_relaxed_tokens(case, theta):
    tree, logits = case
    for row in logits:  # a unique maximum and second value, so that "the top-2" is one token
        top = sorted(row.tolist(), reverse=True)
        assume(top[0] > top[1] > top[2] if len(top) > 2 else top[0] > top[1])
    tokens = tree.tokens.tolist()

    def relaxed_if_valid(parent: int, token: int) -> int | None:
        z = logits[parent].sort(descending=True).values
        if token == first_argmax(logits[parent]):
            return 0
        undecided = bool(z[1] / (z[0] + 1e-10) > theta) and math.isfinite(z[1].item())
        return 1 if undecided and logits[parent, token].item() == z[1].item() else None

    candidates = []  # (depth, relaxed, node) of every node reached through valid nodes only
    for node in range(tree.size):
        path, relaxed = tree.path_to(node), 0
        for parent, child in zip(path, path[1:], strict=False):
            r = relaxed_if_valid(parent, tokens[child])
            if r is None:
                break
            relaxed += r
        else:
            candidates.append((len(path) - 1, relaxed, node))
    depth, relaxed, node = min(candidates, key=lambda c: (-c[0], c[1], c[2]))
    v = accept(logits, tree, resolve_sampling(rule="mars", theta=theta))
    assert v.path == tree.path_to(node) and v.relaxed_tokens == relaxed
    assert v.next_token == first_argmax(logits[node])


@PROPERTY_SETTINGS
@given(tree_and_logits(), sampling_configs, st.integers(0, 2**31 - 1))
def test_sampling_rules_return_valid_paths_and_tokens_in_the_support(case, cfg, seed):
    tree, logits = case
    processed = process_logits(logits, cfg)
    tokens = tree.tokens.tolist()
    top2 = processed.topk(2, dim=-1).indices
    passes = margin_test(processed, cfg.rule.theta, cfg.rule.margin).relax_allowed if cfg.rule.name == "mars" else None
    v = accept(processed, tree, cfg, torch.Generator().manual_seed(seed))
    assert_valid_path(v.path, tree)
    assert len(v.steps) == len(v.path)
    last = v.path[-1]
    assert processed[last, v.next_token].item() > -math.inf  # inside the processed distribution's support
    for step, parent, child in zip(v.steps, v.path, v.path[1:], strict=False):
        assert step.child_accepted
        if step.relaxed:  # only MARS, only where the margin passes, only the top-1 or top-2
            assert cfg.rule.name == "mars" and passes[parent]
            assert tokens[child] in top2[parent].tolist()
        else:
            assert processed[parent, tokens[child]].item() > -math.inf
    children = [tokens[c] for c in tree.children[last]]
    if children and not (cfg.rule.name == "mars" and cfg.rule.fallback == "reference"):
        assert v.next_token not in children  # every child was tried and rejected: the residual excludes them


@PROPERTY_SETTINGS
@given(tree_and_logits(), sampling_configs, st.integers(0, 2**31 - 1), st.sampled_from(["prob_ratio", "logprob_gap"]))
def test_mars_that_never_fires_is_strict_with_the_same_draws(case, cfg, seed, margin):
    tree, logits = case
    theta = 1.0 if margin == "prob_ratio" else 0.0
    pairs = [  # (never-firing MARS, strict): sampling with cfg's processing, then greedy
        (resolve_sampling(cfg, rule="mars", theta=theta, margin=margin),
         SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)),
        (resolve_sampling(rule="mars", theta=theta, margin=margin), SamplingConfig()),
    ]
    for never, strict in pairs:
        g_never, g_strict = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        v_never = accept(process_logits(logits, never), tree, never, g_never)
        v_strict = accept(process_logits(logits, strict), tree, strict, g_strict)
        assert (v_never.path, v_never.next_token, v_never.relaxed_tokens) == (v_strict.path, v_strict.next_token, 0)
        assert not any(step.relax_allowed for step in v_never.steps)
        assert torch.equal(g_never.get_state(), g_strict.get_state())
