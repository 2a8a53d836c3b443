"""Every branch of every acceptance rule, on hand-built trees and logits.

Row i of the logits is the target's prediction for the token after node i, so a child of node i is
judged by row i. Unless a test says otherwise the vocabulary has 6 tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_tree, tiny_generator
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import mars.verification.verify as verify_module
from mars.accounting.stats import VerifyStats
from mars.rules.margin import MARGINS, margin_test
from mars.verification.sampling import SamplingConfig, process_logits, resolve_sampling
from mars.verification.verify import accept

NEG = -math.inf
GREEDY = SamplingConfig()
GREEDY_MARS = resolve_sampling(rule="mars")
SAMPLE = SamplingConfig(temperature=1.0)
SAMPLE_MARS = resolve_sampling(temperature=1.0, rule="mars")
SAMPLE_MARS_REF = resolve_sampling(temperature=1.0, rule="mars", fallback="reference")

# A root row where the target is undecided between token 0 (top-1) and token 1 (top-2):
# logit ratio 2.9 / 3.0 = 0.967 > 0.9. DECIDED has ratio 1 / 3 and fails the test.
UNDECIDED = [3.0, 2.9, 0.5, 0.4, 0.3, 0.2]
DECIDED = [3.0, 1.0, 0.5, 0.4, 0.3, 0.2]


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def one_hot(token: int, vocab: int = 6, strength: float = 50.0) -> list[float]:
    return [strength if i == token else 0.0 for i in range(vocab)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def sampled(monkeypatch):
    """Record the probability vector of every final `draw` call of the rules (bonus or correction)."""
    calls: list[torch.Tensor] = []
    real = verify_module.draw

    def recording(probs, generator):
        calls.append(probs.clone())
        return real(probs, generator)

    monkeypatch.setattr(verify_module, "draw", recording)
    return calls


# --- greedy, strict ---------------------------------------------------------------------------


def test_greedy_strict_accepts_the_top1_chain_and_takes_the_bonus_from_the_last_node():
    tree = make_tree([-1, 0, 0, 1, 2], [5, 1, 2, 3, 4])
    logits = rows(one_hot(2), one_hot(0), one_hot(4), one_hot(0), one_hot(3))
    v = accept(logits, tree, GREEDY)
    assert v.path == [0, 2, 4] and v.next_token == 3 and v.accepted == 2 and v.relaxed_tokens == 0
    assert [(s.depth, s.child_accepted, s.relaxed, s.has_children) for s in v.steps] == [
        (0, True, False, True), (1, True, False, True), (2, False, False, False)]


def test_greedy_strict_rejects_any_child_that_is_not_top1():
    tree = make_tree([-1, 0, 0], [5, 1, 2])  # top-1 (token 0) not drafted; token 1 is top-2
    v = accept(rows(UNDECIDED, one_hot(0), one_hot(0)), tree, GREEDY)
    assert v.path == [0] and v.next_token == 0
    assert not v.steps[0].relax_allowed and not v.steps[0].child_accepted  # undecided, but strict has no gate


def test_greedy_strict_stops_where_the_chain_leaves_the_tree():
    tree = make_tree([-1, 0, 1, 1], [5, 2, 3, 4])
    v = accept(rows(one_hot(2), one_hot(0), one_hot(1), one_hot(1)), tree, GREEDY)
    assert v.path == [0, 1] and v.next_token == 0


def test_greedy_on_tied_logits_follows_argmax_like_plain_greedy():
    """Plain greedy (argmax, `next_token`, HF generate) takes the lowest id among tied maxima."""
    tree = make_tree([-1, 0], [5, 0])
    v = accept(rows([2.0, 2.0, 2.0, 2.0, 2.0, 2.0], one_hot(3)), tree, GREEDY)
    assert v.path == [0, 1] and v.next_token == 3
    v = accept(rows([2.0] * 6, [1.0] * 6), make_tree([-1], [5]), GREEDY)
    assert v.next_token == 0


def test_root_only_tree_gives_the_top1():
    v = accept(rows(one_hot(4)), make_tree([-1], [5]), GREEDY_MARS)
    assert v.path == [0] and v.next_token == 4 and len(v.steps) == 1 and not v.steps[0].has_children


# --- greedy, MARS -----------------------------------------------------------------------------


def test_greedy_mars_accepts_top2_where_the_margin_passes():
    tree = make_tree([-1, 0], [5, 1])
    v = accept(rows(UNDECIDED, one_hot(4)), tree, GREEDY_MARS)
    assert v.path == [0, 1] and v.next_token == 4 and v.relaxed_tokens == 1
    assert v.steps[0].relaxed and v.steps[0].relax_allowed and v.steps[0].child_accepted


def test_greedy_mars_rejects_top2_where_the_margin_fails():
    tree = make_tree([-1, 0], [5, 1])
    v = accept(rows(DECIDED, one_hot(4)), tree, GREEDY_MARS)
    assert v.path == [0] and v.next_token == 0 and v.relaxed_tokens == 0


def test_greedy_mars_never_accepts_top3():
    tree = make_tree([-1, 0], [5, 2])
    v = accept(rows([3.0, 2.95, 2.9, 0, 0, 0], one_hot(4)), tree, GREEDY_MARS)
    assert v.path == [0] and v.next_token == 0


def test_greedy_mars_prefers_the_longer_path_even_with_more_relaxed_tokens():
    # node 1 = top-1 at the root, but its child is wrong; node 2 = top-2 with a valid child.
    tree = make_tree([-1, 0, 0, 1, 2], [5, 0, 1, 3, 3])
    logits = rows(UNDECIDED, one_hot(4), one_hot(3), one_hot(0), one_hot(2))
    v = accept(logits, tree, GREEDY_MARS)
    assert v.path == [0, 2, 4] and v.next_token == 2 and v.relaxed_tokens == 1
    assert accept(logits, tree, GREEDY).path == [0, 1]


def test_greedy_mars_tie_on_depth_goes_to_fewer_relaxed_tokens():
    # Both root children lead to a depth-2 path; the top-2 one comes first in draft order.
    tree = make_tree([-1, 0, 0, 1, 2], [5, 1, 0, 3, 4])
    logits = rows(UNDECIDED, one_hot(3), one_hot(4), one_hot(0), one_hot(2))
    v = accept(logits, tree, GREEDY_MARS)
    assert v.path == [0, 2, 4] and v.relaxed_tokens == 0 and v.next_token == 2


def test_greedy_mars_full_tie_goes_to_the_earliest_node_in_draft_order():
    # root -> a (top-1) -> c (top-2 at a, undecided); root -> b (top-2) -> d (top-1 at b): 1 relaxed each.
    tree = make_tree([-1, 0, 0, 1, 2], [5, 0, 1, 1, 0])
    logits = rows(UNDECIDED, UNDECIDED, UNDECIDED, one_hot(2), one_hot(3))
    v = accept(logits, tree, GREEDY_MARS)
    assert v.path == [0, 1, 3] and v.relaxed_tokens == 1 and v.next_token == 2
    assert [s.relaxed for s in v.steps] == [False, True, False]


# --- sampling, strict -------------------------------------------------------------------------


def test_sampling_strict_accepts_a_certain_child_and_samples_the_bonus_from_the_leaf(sampled):
    tree = make_tree([-1, 0, 1], [5, 2, 3])
    leaf_row = [0.1, 0.5, 1.0, 0.0, -0.3, 0.2]
    processed = process_logits(rows(one_hot(2), one_hot(3), leaf_row), SAMPLE)
    for seed in range(20):
        sampled.clear()
        v = accept(processed, tree, SAMPLE, gen(seed))
        assert v.path == [0, 1, 2] and v.accepted == 2
        assert len(sampled) == 1 and torch.allclose(sampled[0], processed[2].softmax(-1))
        assert v.steps[-1].depth == 2 and not v.steps[-1].has_children and not v.steps[-1].child_accepted


def test_sampling_strict_never_accepts_a_zero_probability_child():
    tree = make_tree([-1, 0, 0], [5, 1, 2])
    processed = process_logits(rows([1.0, NEG, NEG, 0.5, 0.0, 0.2], one_hot(0), one_hot(0)), SAMPLE)
    for seed in range(30):
        v = accept(processed, tree, SAMPLE, gen(seed))
        assert v.path == [0] and v.next_token not in (1, 2)
        assert not v.steps[0].child_accepted


def test_sampling_strict_all_children_rejected_samples_the_correction_from_the_residual(sampled):
    tree = make_tree([-1, 0, 0], [5, 0, 1])
    p = torch.tensor([0.3, 0.2, 0.1, 0.15, 0.05, 0.2])
    processed = process_logits(rows(p.log().tolist(), one_hot(0), one_hot(0)), SAMPLE)
    residual = p.clone()
    residual[[0, 1]] = 0
    residual /= residual.sum()
    rejections = 0
    for seed in range(60):
        sampled.clear()
        v = accept(processed, tree, SAMPLE, gen(seed))
        if v.path == [0]:
            rejections += 1
            assert torch.allclose(sampled[0], residual, atol=1e-6)
            assert v.next_token not in (0, 1)
    assert 15 < rejections < 50  # P(all rejected) = 0.7 * (0.5 / 0.7) = 0.5


def test_sampling_strict_tries_children_in_order_against_the_renormalised_residual():
    """Child j (draft order) of node i is accepted iff u[i, j] < r_j(x_j), u = rand(n, n) drawn first."""
    tree = make_tree([-1, 0, 0], [5, 0, 1])
    p = [0.5, 0.25, 0.125, 0.125, 0.0, 0.0]
    processed = process_logits(rows([math.log(x) if x else NEG for x in p], [0.0] * 6, [0.0] * 6), SAMPLE)
    seen = set()
    for seed in range(200):
        u = torch.rand(3, 3, generator=gen(seed))
        u1, u2 = u[0, 0].item(), u[0, 1].item()
        expected = [0, 1] if u1 < 0.5 else [0, 2] if u2 < 0.25 / 0.5 else [0]
        v = accept(processed, tree, SAMPLE, gen(seed))
        assert v.path == expected
        seen.add(tuple(expected))
    assert seen == {(0, 1), (0, 2), (0,)}


def test_sampling_strict_on_a_filtered_distribution_only_emits_kept_tokens():
    cfg = SamplingConfig(temperature=0.7, top_k=2)
    tree = make_tree([-1, 0, 0], [5, 3, 4])  # both drafted tokens are filtered out at the root
    processed = process_logits(rows([2.0, 1.5, 0.0, 1.0, 0.9, -1.0], one_hot(0), one_hot(0)), cfg)
    outs = {accept(processed, tree, cfg, gen(seed)).next_token for seed in range(40)}
    assert outs == {0, 1}


# --- sampling, MARS ---------------------------------------------------------------------------


def test_sampling_mars_accepts_a_top2_child_outright_when_its_turn_comes_where_the_margin_passes():
    tree = make_tree([-1, 0, 0, 0], [5, 2, 1, 0])  # draft order: top-3, top-2, top-1
    root = [3.0, 2.9, 2.5, 0.4, 0.3, 0.2]  # undecided; the top-3 token holds 22% of the mass
    processed = process_logits(rows(root, one_hot(4), one_hot(4), one_hot(4)), SAMPLE_MARS)
    paths = set()
    for seed in range(60):
        g_mars, g_strict = gen(seed), gen(seed)
        v, s = accept(processed, tree, SAMPLE_MARS, g_mars), accept(processed, tree, SAMPLE, g_strict)
        if s.path[:2] == [0, 1]:  # strict accepts the first child (top-3): MARS makes the same choice
            assert v.path == [0, 1] and not v.steps[0].relaxed
        else:  # never past the top-2 child, which is accepted with certainty
            assert v.path == [0, 2] and v.next_token == 4 and v.steps[0].relax_allowed
            assert v.steps[0].relaxed == (s.path[:2] != [0, 2])
        paths.add(tuple(v.path))
    assert paths == {(0, 1), (0, 2)}
    strict_paths = {tuple(accept(processed, tree, SAMPLE, gen(seed)).path) for seed in range(60)}
    assert len(strict_paths) > 2  # strict, by contrast, may also take the third child or none


def test_sampling_mars_accepts_a_top1_child_outright_in_draft_order():
    tree = make_tree([-1, 0, 0], [5, 0, 1])
    processed = process_logits(rows(UNDECIDED, one_hot(4), one_hot(4)), SAMPLE_MARS)
    assert {tuple(accept(processed, tree, SAMPLE_MARS, gen(s)).path) for s in range(30)} == {(0, 1)}


def test_sampling_mars_without_a_top2_child_falls_back_to_strict_with_the_same_draws():
    tree = make_tree([-1, 0, 0, 1], [5, 2, 3, 0])
    root = [1.0, 0.95, 0.9, 0.85, 0.0, 0.0]  # undecided, and the drafted tokens 2, 3 hold 40% of the mass
    processed = process_logits(rows(root, [0.5, 0.4, 0.3, 0.2, 0.1, 0.0], one_hot(4), one_hot(1)), SAMPLE_MARS)
    outcomes = set()
    for seed in range(60):
        g_mars, g_strict = gen(seed), gen(seed)
        v_mars = accept(processed, tree, SAMPLE_MARS, g_mars)
        v_strict = accept(processed, tree, SAMPLE, g_strict)
        assert (v_mars.path, v_mars.next_token) == (v_strict.path, v_strict.next_token)
        assert v_mars.relaxed_tokens == 0 and v_mars.steps[0].relax_allowed
        assert torch.equal(g_mars.get_state(), g_strict.get_state())
        outcomes.add(len(v_mars.path))
    assert {1, 2} <= outcomes  # both accepted and rejected children occur


def test_sampling_mars_reference_fallback_rejects_all_children_and_samples_the_target(sampled):
    tree = make_tree([-1, 0, 0], [5, 2, 3])
    processed = process_logits(rows(UNDECIDED, one_hot(4), one_hot(4)), SAMPLE_MARS_REF)
    emitted = set()
    for seed in range(300):
        sampled.clear()
        v = accept(processed, tree, SAMPLE_MARS_REF, gen(seed))
        assert v.path == [0] and not v.steps[0].child_accepted
        assert torch.allclose(sampled[0], processed[0].softmax(-1))  # p itself, not the residual
        emitted.add(v.next_token)
    assert emitted & {2, 3}  # a drafted-and-rejected token can be the correction


def test_sampling_mars_reference_fallback_still_relaxes_a_top2_child():
    tree = make_tree([-1, 0, 0], [5, 2, 1])
    processed = process_logits(rows(UNDECIDED, one_hot(4), one_hot(4)), SAMPLE_MARS_REF)
    assert accept(processed, tree, SAMPLE_MARS_REF, gen(0)).path == [0, 2]


@pytest.mark.parametrize("cfg", [SAMPLE_MARS_REF, resolve_sampling(temperature=1.0, rule="typical", epsilon=0.3,
                                                                     fallback="reference")],
                         ids=["mars reference", "typical reference"])
def test_sampling_counts_an_outright_child_as_relaxed_only_where_strict_s_own_test_rejects_it(cfg):
    """Rules that skip the strict test (`Relaxation.tested` False: MARS and typical with fallback
    "reference") accept their outright child whatever the draw; it is relaxed only where strict, with
    the same draw, rejects it (here a top-k child whose strict acceptance chance is p(top-1) = 0.46)."""
    tree = make_tree([-1, 0, 1], [5, 0, 3])  # the root's one child is the target's top-1
    processed = process_logits(rows(UNDECIDED, one_hot(3), one_hot(1)), cfg)
    labels = set()
    for seed in range(100):
        v, s = accept(processed, tree, cfg, gen(seed)), accept(processed, tree, SAMPLE, gen(seed))
        assert v.path[:2] == [0, 1]  # accepted outright, whatever the draw
        assert v.steps[0].relaxed == (s.path[:2] != [0, 1])
        assert v.relaxed_tokens == v.steps[0].relaxed  # node 1 is decided: its child goes through strict's test
        labels.add(v.steps[0].relaxed)
    assert labels == {True, False}  # both: strict accepts the child with some draws and not with others


@pytest.mark.parametrize("fallback", ["strict", "reference"])
def test_sampling_mars_where_the_margin_fails_is_strict_with_the_same_draws(fallback):
    cfg = resolve_sampling(temperature=1.0, rule="mars", fallback=fallback)
    tree = make_tree([-1, 0, 0, 1, 2], [5, 1, 2, 0, 3])
    logits = rows(DECIDED, [1.0, 0.0, 0.8, 0.5, 0.2, 0.1], [0.3, 0.2, 0.1, 1.0, 0.0, 0.0], one_hot(2), one_hot(1))
    processed = process_logits(logits, cfg)
    assert not margin_test(processed, cfg.rule.theta, cfg.rule.margin).relax_allowed[:3].any()
    for seed in range(40):
        g_mars, g_strict = gen(seed), gen(seed)
        v_mars = accept(processed, tree, cfg, g_mars)
        v_strict = accept(processed, tree, SAMPLE, g_strict)
        assert (v_mars.path, v_mars.next_token, v_mars.tokens) == (v_strict.path, v_strict.next_token, v_strict.tokens)
        assert [(s.child_accepted, s.relaxed, s.tv, s.kl) for s in v_mars.steps] == [
            (s.child_accepted, False, 0.0, 0.0) for s in v_strict.steps]
        assert torch.equal(g_mars.get_state(), g_strict.get_state())


def test_sampling_mars_relaxes_at_one_depth_and_is_strict_at_the_next():
    tree = make_tree([-1, 0, 1, 1], [5, 1, 3, 4])
    child_row = [1.0, 0.0, 0.0, 0.8, 0.7, 0.0]  # decided at node 1: ratio 0.8 < 0.9
    processed = process_logits(rows(UNDECIDED, child_row, one_hot(0), one_hot(0)), SAMPLE_MARS)
    depths, relaxed = set(), set()
    for seed in range(60):
        v = accept(processed, tree, SAMPLE_MARS, gen(seed))
        assert v.path[:2] == [0, 1] and v.steps[0].relax_allowed  # the top-2 child, always
        assert not v.steps[1].relaxed and not v.steps[1].relax_allowed
        depths.add(len(v.path))
        relaxed.add(v.steps[0].relaxed)  # counted as relaxed only where strict's test rejects it
    assert depths == {2, 3} and relaxed == {True, False}


def test_sampling_mars_never_relaxes_where_the_filter_leaves_one_token():
    # top_k=1 leaves z2 = -inf; with negative logits the raw ratio would be +inf and pass any theta.
    for cfg in (resolve_sampling(temperature=1.0, top_k=1, rule="mars", theta=0.0),
                resolve_sampling(temperature=1.0, top_p=0.05, rule="mars", theta=0.0)):
        tree = make_tree([-1, 0], [5, 1])
        processed = process_logits(rows([-1.0, -1.01, -5.0, -5.0, -5.0, -5.0], one_hot(4)), cfg)
        for seed in range(10):
            v = accept(processed, tree, cfg, gen(seed))
            assert v.path == [0] and v.next_token == 0
            step = v.steps[0]
            assert step.counters == {"nonfinite": True, "negative_logit": True}
            assert not step.relax_allowed and not step.relaxed


def test_verify_dispatches_on_temperature():
    tree = make_tree([-1, 0], [5, 1])
    logits = rows(UNDECIDED, one_hot(4))
    assert accept(logits, tree, GREEDY_MARS).path == [0, 1]
    assert accept(logits, tree, GREEDY).path == [0]
    v = accept(process_logits(logits, SAMPLE_MARS), tree, SAMPLE_MARS, gen(0))
    assert v.path == [0, 1] and v.next_token == 4


# --- margin metrics ---------------------------------------------------------------------------


@pytest.mark.parametrize("metric,temperature,expected", [
    ("logit_ratio", 1.0, 1.9 / 2.0), ("prob_ratio", 1.0, math.exp(-0.1)), ("logprob_gap", 1.0, 0.1),
    ("logit_ratio", 0.5, 1.9 / 2.0), ("prob_ratio", 0.5, math.exp(-0.2)), ("logprob_gap", 0.5, 0.2),
    ("prob_ratio", 0.0, math.exp(-0.1)),  # greedy: the metric is taken at temperature 1
])
def test_margin_metric_values(metric, temperature, expected):
    cfg = resolve_sampling(temperature=temperature, rule="mars", margin=metric, theta=0.5)
    m = margin_test(process_logits(rows([0.0, 2.0, 1.9, -1.0]), cfg), 0.5, metric)
    assert m.value.item() == pytest.approx(expected, rel=1e-5)
    assert not m.nonfinite.item() and not m.negative.item()


@pytest.mark.parametrize("metric,relax_theta,keep_theta", [
    ("logit_ratio", 0.94, 0.96), ("prob_ratio", 0.90, 0.91), ("logprob_gap", 0.11, 0.09)])
def test_margin_pass_direction(metric, relax_theta, keep_theta):
    logits = rows([0.0, 2.0, 1.9, -1.0])  # ratio 0.95, p2/p1 0.905, gap 0.1
    assert margin_test(logits, relax_theta, metric).relax_allowed.item()
    assert not margin_test(logits, keep_theta, metric).relax_allowed.item()


def test_logit_ratio_with_negative_logits_is_applied_as_is_and_flagged():
    m = margin_test(rows([-1.0, -3.0, -1.05], [-1.0, -30.0, -29.0], [2.0, 1.0, -1.0]), 0.9, "logit_ratio")
    assert m.value.tolist() == pytest.approx([1.05, 29.0, 0.5])
    assert m.relax_allowed.tolist() == [True, True, False]  # both negative: the ratio inverts and always passes
    assert m.negative.tolist() == [True, True, False]


def test_nonfinite_margins_never_pass_and_are_flagged():
    logits = rows([-1.0, NEG, NEG], [2.0, NEG, NEG], [NEG, 0.5, NEG])
    for metric, theta in (("logit_ratio", 0.0), ("prob_ratio", 0.0), ("logprob_gap", math.inf)):
        m = margin_test(logits, theta, metric)
        assert m.nonfinite.tolist() == [True, True, True]
        assert not m.relax_allowed.any()
    assert margin_test(logits, 0.9, "logit_ratio").value[0].item() == math.inf  # -inf / -1 would pass unguarded


def test_nonfinite_and_negative_positions_are_counted_in_the_stats():
    stats = VerifyStats()
    cfg = resolve_sampling(temperature=1.0, top_k=1, rule="mars")
    tree = make_tree([-1, 0], [5, 0])
    processed = process_logits(rows([-1.0, -2.0, -3.0, -3.0, -3.0, -3.0], [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]), cfg)
    stats.add(accept(processed, tree, cfg, gen(0)))  # root: filtered and negative; node 1: filtered
    neg_tree = make_tree([-1, 0], [5, 1])
    stats.add(accept(rows([-1.0, -1.05, -4.0, -4.0, -4.0, -4.0], one_hot(2)), neg_tree, GREEDY_MARS))
    assert stats.positions == 4 and stats.counters == {"nonfinite": 2, "negative_logit": 2}
    assert stats.relaxed_tokens == 1 and stats.relax_allowed == 1
    assert stats.summary()["nonfinite_positions"] == 2 and stats.summary()["negative_logit_positions"] == 2


# --- statistics -------------------------------------------------------------------------------


def test_stats_per_depth_counts_margins_and_truncation():
    tree = make_tree([-1, 0, 0, 1, 2], [5, 0, 1, 3, 3])
    logits = rows(UNDECIDED, one_hot(4), one_hot(3), one_hot(0), one_hot(2))
    relaxed = accept(logits, tree, GREEDY_MARS)  # path 0 -> 2 (top-2) -> 4
    strict = accept(logits, tree, GREEDY)  # path 0 -> 1, child of 1 rejected
    stats = VerifyStats()
    stats.add(relaxed)
    assert dict(stats.attempts) == {0: 1, 1: 1} and dict(stats.accepts) == {0: 1, 1: 1}
    assert dict(stats.relaxed) == {0: 1, 1: 0} and stats.positions == 3 == len(stats.gates)
    assert stats.gates[0] == pytest.approx(2.9 / 3.0)
    other = VerifyStats()
    other.add(strict)
    other.add(relaxed, keep_steps=1)  # output cut after the first token: only the root's step counts
    assert other.positions == 3 and dict(other.attempts) == {0: 2, 1: 1} and dict(other.accepts) == {0: 2, 1: 0}
    stats.merge(other)
    assert stats.positions == 6 == len(stats.gates)
    assert stats.acceptance_rate_by_depth == {0: 1.0, 1: 0.5}
    summary = stats.summary()
    assert summary["relaxed_tokens"] == 2 and summary["relaxed_by_depth"] == {0: 2, 1: 0}
    assert summary["relax_allowed_frac"] == pytest.approx(2 / 6)  # the root row passes in both MARS verdicts


# --- logits processing ------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 0, 0.9), (0.7, 5, 1.0), (1.3, 7, 0.8), (0.5, 1, 0.5), (1.0, 0, 0.01),
    (2.0, 60, 0.95)])
def test_process_logits_matches_transformers_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(8, 50) * 3
    logits[0, :10] = 1.5  # ties at the top-k / top-p boundary
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    got = process_logits(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    # The same division by the temperature, then the same entries set to -inf: exactly the same logits.
    assert torch.equal(got, expected)


def test_process_logits_greedy_is_identity():
    logits = torch.randn(3, 10)
    assert torch.equal(process_logits(logits, SamplingConfig(top_k=2, top_p=0.5)), logits)


# --- settings validation ----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,pattern", [
    ({"rule": "lossy"}, r"unknown rule 'lossy'; registered rules: .*mars.*strict"),
    ({"rule": "mars", "margin": "entropy"}, r"unknown mars.margin 'entropy'; valid: logit_ratio, prob_ratio, "
                                            r"logprob_gap"),
    ({"rule": "mars", "fallback": "skip"}, r"unknown mars.fallback 'skip'; valid: strict, reference"),
    ({"rule": "mars", "theta": 1.5}, r"mars.theta=1.5 is outside \[0.0, 1.0\].*'logit_ratio'"),
    ({"rule": "mars", "theta": -0.1}, r"theta=-0.1 is outside"),
    ({"rule": "mars", "theta": 1.01, "margin": "prob_ratio"}, r"outside \[0.0, 1.0\].*'prob_ratio'"),
    ({"rule": "mars", "theta": -1.0, "margin": "logprob_gap"}, r"outside \[0.0, inf\].*'logprob_gap'"),
    ({"rule": "mars", "theta": math.nan}, r"theta=nan is outside"),
    ({"rule": "ears"}, r"rule 'ears' has no greedy form"),
    ({"temperature": -0.1}, r"temperature must be a finite number >= 0"),
    ({"temperature": math.inf}, r"temperature must be a finite number >= 0"),
    ({"temperature": math.nan}, r"temperature must be a finite number >= 0"),
    ({"temperature": 1.0, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"temperature": 1.0, "top_p": 1.2}, r"top_p must be in \(0, 1\]"),
    ({"temperature": 1.0, "top_p": -0.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, r"top_k must be an integer >= 0"),
    ({"top_k": 2.5}, r"top_k must be an integer >= 0"),
])
def test_sampling_config_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        resolve_sampling(**kwargs)


def test_sampling_config_accepts_the_range_ends():
    for margin in MARGINS:
        resolve_sampling(rule="mars", margin=margin, theta=0.0)
    resolve_sampling(rule="mars", theta=1.0)
    resolve_sampling(rule="mars", margin="prob_ratio", theta=1.0)
    resolve_sampling(rule="mars", margin="logprob_gap", theta=7.5)
    SamplingConfig(temperature=0.0, top_p=1.0, top_k=0)
    assert SamplingConfig().greedy and not SamplingConfig(temperature=1e-3).greedy


# --- EOS in the generator's output ------------------------------------------------------------


@pytest.fixture(scope="module")
def small_generator():
    return tiny_generator(3, 4, sharpen=3.0, total_tokens=10, depth=3, branching=4)


def test_generate_validates_its_settings(small_generator):
    with pytest.raises(ValueError, match="unknown rule 'fast'; registered rules:"):
        small_generator.generate(torch.tensor([[1, 2]]), max_new_tokens=4, rule="fast")


def test_greedy_eos_stops_generation_at_its_first_occurrence(small_generator):
    prompt = torch.tensor([[1, 2, 3]])
    full = small_generator.vanilla(prompt, max_new_tokens=24).tokens
    for rule in ("strict", "mars"):
        reference = small_generator.generate(prompt, max_new_tokens=24, rule=rule).tokens
        if rule == "strict":
            assert reference == full
        for stop in (0, 5, 11):
            eos = reference[stop]
            first = reference.index(eos)
            for eos_arg in (eos, [15 if eos != 15 else 14, eos]):
                out = small_generator.generate(prompt, max_new_tokens=24, rule=rule, eos_token_id=eos_arg)
                expected = reference[: first + 1]
                if isinstance(eos_arg, list):
                    hits = [i for i, t in enumerate(reference) if t in eos_arg]
                    expected = reference[: hits[0] + 1]
                assert out.tokens == expected and out.stopped_by == "eos"
                assert out.stats.positions == len(out.tokens) - 1 == len(out.stats.gates)
                assert len(out.accept_lengths) == out.num_cycles
    assert small_generator.generate(prompt, max_new_tokens=24, eos_token_id=full[0]).num_cycles == 0


def test_sampled_eos_is_always_the_last_token(small_generator):
    prompt = torch.tensor([[4, 2]])
    stopped = 0
    for seed in range(25):
        for rule in ("strict", "mars"):
            out = small_generator.generate(prompt, max_new_tokens=12, temperature=1.0, rule=rule, eos_token_id=[0, 1],
                                           generator=gen(seed))
            assert all(t not in (0, 1) for t in out.tokens[:-1])
            assert (out.stopped_by == "eos") == (out.tokens[-1] in (0, 1))
            assert out.stopped_by == "eos" or len(out.tokens) == 12
            assert out.stats.positions == len(out.tokens) - 1 == len(out.stats.gates)
            stopped += out.stopped_by == "eos"
    assert stopped > 5
