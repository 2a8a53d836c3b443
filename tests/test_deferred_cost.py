"""Deferred cost accounting (`mars.verification.verify` `defer_cost`, `mars.accounting.deferred`: `settle`,
`CostLedger`): the relaxation's cost is left out of the decoding loop and settled after it.

What it must not change, checked against the cost computed in each cycle (the eager path, what static
shapes still run): the tokens, and every cost sum of the stats, for relaxing rules greedy and at T = 1,
sampled and top-k drafts, batch 1 and batched, whether it settles at the end or (memory budget 0) every
cycle. What it costs: one read at the end, nothing in the cycles.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from helpers import (
    count_by_cycle,
    kl_tolerance,
    make_tree,
    probability_error,
    random_prompt,
    summation_tolerance,
    tiny_generator,
    tv_tolerance,
)

import mars.accounting.deferred
import mars.decoding.generate
from eagle.tree import DraftTree
from mars import SpeculativeGenerator
from mars.accounting.deferred import CostLedger, settle
from mars.accounting.stats import VerifyStats
from mars.accounting.timing import ACCOUNTING
from mars.diagnostics.syncs import SyncCounter
from mars.verification.sampling import SamplingConfig, resolve_sampling
from mars.verification.verify import accept_rows

pytestmark = pytest.mark.usefixtures("single_thread")

TREE = dict(total_tokens=8, depth=4, branching=2)
TOKENS = 32
VOCAB = 16
SUMS = ("tv_sum", "kl_sum", "kl_infinite", "mismatches", "regret_sum", "bounded", "sampled", "positions")

# (rule and its relaxing parameters, temperature, drafting): every form the accounting has.
CASES = {
    "mars greedy": (dict(rule="mars", theta=0.5), 0.0, {}),
    "mars T=1 sampled tree": (dict(rule="mars", theta=0.5), 1.0, dict(drafting="sample")),
    "mars T=1 sampled chain": (dict(rule="mars", theta=0.5), 1.0, dict(drafting="sample", branching=1)),
    "mars T=1 top-k": (dict(rule="mars", theta=0.5), 1.0, dict(drafting="topk")),
    "typical greedy": (dict(rule="typical", epsilon=0.3, delta=0.5), 0.0, {}),
    "typical T=1 sampled tree": (dict(rule="typical", epsilon=0.3, delta=0.5), 1.0, dict(drafting="sample")),
    "ears T=1 top-k": (dict(rule="ears", beta=0.5), 1.0, dict(drafting="topk")),
}


class EagerLedger(CostLedger):
    """The cost computed in each cycle and read with the verdict, as static shapes keep it."""

    def __init__(self, stats, clock, static):
        super().__init__(stats, clock, static=True)


@pytest.fixture
def eager(monkeypatch):
    """Call it to make the loops compute the cost in the cycle (the reference)."""
    def switch() -> None:
        monkeypatch.setattr(mars.decoding.generate, "CostLedger", EagerLedger)
    return switch


def sums(stats: VerifyStats) -> tuple:
    return tuple(getattr(stats, name) for name in SUMS)


def generator_for(drafting: dict, **settings) -> SpeculativeGenerator:
    return tiny_generator(0, 2, 1.0, vocab_size=VOCAB, **{**TREE, **drafting}, **settings)


def prompts(count: int = 1) -> list[torch.Tensor]:
    rng = random.Random(0)
    return [random_prompt(rng, VOCAB, n) for n in (8, 13, 5)[:count]]


def run(gen: SpeculativeGenerator, params: dict, temperature: float):
    rng = torch.Generator().manual_seed(3)
    return gen.generate(prompts()[0], max_new_tokens=TOKENS, temperature=temperature, generator=rng, **params)


def run_batch(gen: SpeculativeGenerator, params: dict, temperature: float):
    rng = torch.Generator().manual_seed(3)
    return gen.generate(prompts(3), max_new_tokens=TOKENS, temperature=temperature, generator=rng, **params)


def relaxes(stats: VerifyStats) -> bool:
    """The run paid something for its relaxation (else the comparison proves little)."""
    return stats.tv_sum > 0 or stats.mismatches > 0


def deferred_then_inline(decode, case: str, eager) -> tuple:
    """`decode(generator, params, temperature)` of `case` deferred, then with the cost in the cycle."""
    params, temperature, drafting = CASES[case]
    gen = generator_for(drafting)
    deferred = decode(gen, params, temperature)
    eager()
    return deferred, decode(gen, params, temperature)


@pytest.mark.parametrize("case", list(CASES))
def test_deferred_accounting_equals_the_cost_computed_in_the_cycle(case, eager):
    deferred, inline = deferred_then_inline(run, case, eager)
    assert relaxes(inline.stats)
    assert deferred.tokens == inline.tokens and deferred.accept_lengths == inline.accept_lengths
    assert sums(deferred.stats) == sums(inline.stats) and not deferred.stats.pending
    assert ACCOUNTING in deferred.phase_seconds and ACCOUNTING in inline.phase_seconds


@pytest.mark.parametrize("case", ["mars greedy", "mars T=1 sampled tree", "typical T=1 sampled tree",
                                  "ears T=1 top-k"])
def test_a_batch_defers_its_accounting_row_by_row_exactly(case, eager):
    deferred, inline = deferred_then_inline(run_batch, case, eager)
    assert any(relaxes(o.stats) for o in inline)
    assert [o.tokens for o in deferred] == [o.tokens for o in inline]
    assert [sums(o.stats) for o in deferred] == [sums(o.stats) for o in inline]
    assert ACCOUNTING in deferred[0].phase_seconds  # the batch's phases are the first output's


@pytest.mark.parametrize("case", ["mars greedy", "mars T=1 sampled tree"])
def test_a_memory_budget_of_zero_settles_every_cycle_with_the_same_results(case, monkeypatch):
    params, temperature, drafting = CASES[case]
    gen = generator_for(drafting)
    at_end, batch_at_end = run(gen, params, temperature), run_batch(gen, params, temperature)
    monkeypatch.setattr(mars.accounting.deferred, "PENDING_BYTES", 0)
    settled = []

    def counting(stats):
        stats = list(stats)
        settled.append(any(s.pending for s in stats))
        settle(stats)

    monkeypatch.setattr(mars.accounting.deferred, "settle", counting)
    every_cycle = run(gen, params, temperature)
    assert sum(settled) == every_cycle.num_cycles  # each cycle's own; nothing left for the end
    assert (every_cycle.tokens, sums(every_cycle.stats)) == (at_end.tokens, sums(at_end.stats))
    batched = run_batch(gen, params, temperature)
    assert [(o.tokens, sums(o.stats)) for o in batched] == [(o.tokens, sums(o.stats)) for o in batch_at_end]


def rounding_tolerances(verdicts) -> dict[str, float]:
    """How far each float cost sum of the static run may lie from the dynamic run's by rounding alone,
    from the costs the static run computed position by position; the counts (mismatches, kl_infinite,
    ...) must be equal.

    Both runs compute each position's cost in float32 from their own logits (the two forwards order
    their reductions differently) and add the positions up in float64: TV and KL as `tv_tolerance` and
    `kl_tolerance` give, the greedy regret log p_1 - log p_x as 2 terms of magnitude
    2 + |log p_1| + |log p_x| <= 2 + 2 log VOCAB + regret, each log-probability off by
    `probability_error(VOCAB)` u (see `kl_tolerance`). A position without a cost holds an exact 0 in
    both runs (the rule is inactive there): it adds nothing.
    """
    steps = [s for _, v in verdicts for s in v.steps]
    tv = sum(1 for s in steps if s.tv > 0)
    finite = [s.kl for s in steps if 0 < s.kl < math.inf]
    regret = sum(2 + 2 * math.log(VOCAB) + s.regret for s in steps if s.regret > 0)
    return {"tv_sum": tv_tolerance(VOCAB, tv), "kl_sum": kl_tolerance(VOCAB, sum(finite), len(finite)),
            "regret_sum": summation_tolerance(2, regret, term_error=probability_error(VOCAB))}


def assert_sums_close(actual: VerifyStats, expected: VerifyStats, tolerances: dict[str, float]) -> None:
    """The float sums within their tolerances, the counts equal."""
    for name, a, b in zip(SUMS, sums(actual), sums(expected), strict=True):
        assert (abs(a - b) <= tolerances[name]) if name in tolerances else (a == b), (name, a, b, tolerances.get(name))


@pytest.mark.parametrize("case", ["mars greedy", "mars T=1 sampled tree"])
def test_static_shapes_compute_the_cost_in_the_cycle_with_the_same_sums(case, monkeypatch):
    params, temperature, drafting = CASES[case]
    dynamic = run(generator_for(drafting), params, temperature)
    static = generator_for(drafting, static=True, max_cache_len=128)
    verdicts = []
    accept_rows = mars.decoding.generate.accept_rows

    def recording(*args, **kwargs):
        cycle = accept_rows(*args, **kwargs)
        verdicts.extend((kwargs.get("defer_cost"), v) for v in cycle)
        return cycle

    monkeypatch.setattr(mars.decoding.generate, "accept_rows", recording)
    out = run(static, params, temperature)
    assert verdicts and all(defer is False and v.pending is None for defer, v in verdicts)
    # Static shapes change results by rounding only: the same tokens here, sums up to rounding.
    assert out.tokens == dynamic.tokens
    assert_sums_close(out.stats, dynamic.stats, rounding_tolerances(verdicts))
    assert relaxes(out.stats)


def test_settling_adds_one_read_after_the_loop_and_none_in_its_cycles(eager, monkeypatch):
    params, temperature, drafting = CASES["mars T=1 sampled tree"]
    gen = generator_for(drafting)
    deferred, kinds, _ = count_by_cycle(lambda: run(gen, params, temperature), monkeypatch)
    batch_deferred, _, _ = count_by_cycle(lambda: run_batch(gen, params, temperature), monkeypatch)
    eager()
    inline, _, _ = count_by_cycle(lambda: run(gen, params, temperature), monkeypatch)
    batch_inline, _, _ = count_by_cycle(lambda: run_batch(gen, params, temperature), monkeypatch)
    # The last cycle's count runs to the end of the call: it holds the settling.
    assert deferred[:-1] == inline[:-1] and deferred[-1] == inline[-1] + 1, (deferred, inline)
    assert batch_deferred[:-1] == batch_inline[:-1] and batch_deferred[-1] == batch_inline[-1] + 1
    assert set(kinds) <= {"tolist", "upload", "item"}, kinds


def forest(trees: list[DraftTree]) -> DraftTree:
    stack = lambda f: torch.stack([f(t) for t in trees])  # noqa: E731
    return DraftTree.forest(stack(lambda t: t.tokens), stack(lambda t: t.parents), stack(lambda t: t.depths),
                            stack(lambda t: t.scores), max(t.levels for t in trees))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verdicts_of_a_forest_share_one_pending_cost_settled_in_one_read(temperature):
    """Per verdict, as the loops record them (some cut short): the settled sums equal the eager ones,
    however many stats the verdicts went to, for one read."""
    torch.manual_seed(0)
    trees = forest([make_tree([-1, 0, 0, 1, 1, 3], [0, 1, 2, 3, 4, 1]),
                    make_tree([-1, 0, 1, 2, 0, 4], [2, 0, 1, 3, 4, 0]),
                    make_tree([-1, 0, 0, 0, 1, 2], [1, 3, 0, 2, 4, 4])])
    cfg = resolve_sampling(temperature=temperature, rule="mars", theta=0.5)
    eager, deferred = [VerifyStats() for _ in range(3)], [VerifyStats() for _ in range(3)]
    for cycle in range(20):
        processed = torch.randn(trees.size, 5) * 1.5
        keep = [None, 1, 2][cycle % 3]
        for defer, stats in ((False, eager), (True, deferred)):
            verdicts = accept_rows(processed, trees, cfg, torch.Generator().manual_seed(cycle), defer_cost=defer)
            assert all((v.pending is not None) == defer for v in verdicts)
            if defer:  # one computation for the forest; the steps carry no cost
                assert len({id(v.pending.forest) for v in verdicts}) == 1
                assert all(s.tv == s.kl == s.regret == 0.0 and not s.mismatch for v in verdicts for s in v.steps)
            for row, verdict in enumerate(verdicts):
                stats[row].add(verdict, keep_steps=keep, sampled=temperature > 0)
    assert any(relaxes(s) for s in eager)
    with SyncCounter() as syncs:
        settle(deferred)
    assert syncs.total == 1 and not any(s.pending for s in deferred)
    assert [sums(s) for s in deferred] == [sums(s) for s in eager]


def test_a_lossless_rule_leaves_nothing_pending():
    trees = forest([make_tree([-1, 0, 0, 1], [0, 1, 2, 3])])
    for temperature in (0.0, 1.0):
        verdicts = accept_rows(torch.randn(4, 5), trees, SamplingConfig(temperature=temperature),
                               torch.Generator().manual_seed(0), defer_cost=True)
        assert verdicts[0].pending is None


def test_merging_serialising_and_costing_see_settled_sums():
    trees = forest([make_tree([-1, 0, 0, 1, 1, 3], [0, 1, 2, 3, 4, 1])])
    cfg = resolve_sampling(temperature=1.0, rule="mars", theta=0.5)
    runs = {}
    for defer in (False, True):
        a, b = VerifyStats(), VerifyStats()
        for cycle in range(10):
            processed = torch.randn(trees.size, 5, generator=torch.Generator().manual_seed(cycle)) * 1.5
            (verdict,) = accept_rows(processed, trees, cfg, torch.Generator().manual_seed(cycle), defer_cost=defer)
            (a if cycle % 2 else b).add(verdict, sampled=True)
        assert bool(a.pending) == bool(b.pending) == defer
        json_a, cost_b = a.to_json(), b.cost()  # each settles its own first
        a.merge(b)
        runs[defer] = (json_a, cost_b, a.to_json(), a.pending)
    assert runs[True] == runs[False] and runs[True][2]["tv_sum"] > 0


def test_the_accounting_phase_is_outside_the_loops_shares():
    from eval.reporting.metrics import method_figures

    record = {"choices": [{"new_tokens": [10], "wall_time": [1.0], "idxs": [3]}],
              "eval": {"relaxed": [0], "parses": [], "loglik": [], "loglik_tokens": [], "stopped_by": ["length"],
                       "verify": VerifyStats().to_json(), "phase_seconds": {"draft": 0.25, "accept": 0.75,
                                                                           ACCOUNTING: 4.0}}}
    figures = method_figures([record])
    assert figures["phase_share"] == {"draft": 0.25, "accept": 0.75}
    assert figures["phase_seconds"][ACCOUNTING] == 4.0
    record["eval"]["phase_seconds"] = {ACCOUNTING: 4.0}  # not profiled
    assert method_figures([record])["phase_share"] == {}
