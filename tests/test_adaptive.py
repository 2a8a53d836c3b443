"""The adaptive tree: its policy in isolation, and exactness of the decoding it drives.
(Losslessness of strict sampling under it is tested in test_lossless.py.)"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import OracleHead, hf_greedy, random_prompt, tiny_model

from eagle import Eagle3Head
from mars import SpeculativeGenerator
from mars.decoding.adaptive import AdaptiveTree, CycleCosts, measure_costs
from mars.decoding.settings import TreeShape

pytestmark = pytest.mark.usefixtures("single_thread")

CHEAP_VERIFY = CycleCosts(decode=1.0, draft_level=0.05, verify_nodes=(1, 61), verify_seconds=(1.0, 1.2))
DEAR_VERIFY = CycleCosts(decode=1.0, draft_level=0.2, verify_nodes=(1, 21), verify_seconds=(1.0, 5.0))


def test_costs_interpolate_between_measured_sizes():
    costs = CycleCosts(1.0, 0.1, (1, 5, 21), (1.0, 2.0, 6.0))
    assert costs.verify(1) == 1.0 and costs.verify(5) == 2.0 and costs.verify(3) == pytest.approx(1.5)
    assert costs.verify(13) == pytest.approx(4.0) and costs.verify(41) == pytest.approx(11.0)  # extrapolated


def test_policy_speculates_deep_when_verification_is_cheap_and_acceptance_high():
    policy = AdaptiveTree(CHEAP_VERIFY, depth=6, branching=10, total_tokens=60)
    policy.survival = [0.9 ** (level + 1) for level in range(6)]
    assert policy.plan(remaining_depth=100) == (6, 60)
    assert policy.plan(remaining_depth=3)[0] == 3  # never deeper than the tokens still wanted


def test_policy_decodes_plainly_when_speculation_cannot_pay_and_probes_now_and_then():
    policy = AdaptiveTree(DEAR_VERIFY, depth=4, branching=5, total_tokens=20, probe_every=4)
    policy.survival = [0.3, 0.1, 0.05, 0.01]
    plans = [policy.plan(100) for _ in range(10)]
    # a probe drafts full depth but verifies only the draft's best `depth` nodes: cheap where trees do not pay
    assert plans[:4] == [(0, 0)] * 4 and plans[4] == (4, 4) and plans[5:9] == [(0, 0)] * 4 and plans[9] == (4, 4)


def test_observed_acceptance_moves_the_plan():
    policy = AdaptiveTree(CycleCosts(1.0, 0.05, (1, 21), (1.0, 1.6)), depth=4, branching=5, total_tokens=20)
    for _ in range(60):
        policy.observe(4, 0, predicted=2.0)  # nothing accepted: survival and confidence fall
    assert policy.plan(100) == (0, 0) and policy.confidence_scale < 0.05
    for _ in range(60):
        policy.observe(4, 4, predicted=2.0)  # everything accepted
    assert policy.plan(100) == (4, 20)


def test_confidence_stops_growth_of_levels_the_draft_doubts():
    policy = AdaptiveTree(CHEAP_VERIFY, depth=6, branching=10, total_tokens=60)
    assert policy.grow_level(2, torch.log(torch.tensor([0.5, 0.3])), depth=6)
    assert not policy.grow_level(5, torch.log(torch.tensor([1e-4, 1e-5])), depth=6)


def test_measured_costs_are_positive_and_leave_no_sequence_behind():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(12, 3, 3))
    costs = measure_costs(gen.target, gen.head, branching=3, max_nodes=12, repeats=2)
    assert costs.decode > 0 and costs.draft_level > 0 and costs.verify_nodes[-1] == 13
    assert all(s > 0 for s in costs.verify_seconds)
    prompt = torch.tensor([[5, 1, 2]])
    assert gen.generate(prompt, max_new_tokens=10).tokens == hf_greedy(model, prompt, 10)


@pytest.mark.parametrize("costs", [None, DEAR_VERIFY], ids=["measured", "dear"])
def test_adaptive_greedy_equals_hf_generate_on_every_architecture(arch, costs):
    model = tiny_model(arch)
    rng = random.Random(5)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(16, 4, 3, adaptive=True))
    if costs is not None:
        gen.policy = AdaptiveTree(costs, 4, 3, 16, probe_every=2)
    depths = set()
    for length in (1, 9, 40):
        prompt = random_prompt(rng, model.config.vocab_size, length)
        out = gen.generate(prompt, max_new_tokens=24)
        assert out.tokens == hf_greedy(model, prompt, 24)
        depths |= set(out.draft_depths)
    if costs is DEAR_VERIFY:
        assert 0 in depths and max(depths) >= 1  # plain steps, and probes


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_adaptive_drafts_deep_with_a_confident_draft_and_stays_exact(arch):
    model = tiny_model(arch)
    prompt = torch.tensor([[7, 3, 9, 1]])
    continuation = hf_greedy(model, prompt, 60)
    oracle = OracleHead(model.config, prompt[0].tolist() + continuation)
    gen = SpeculativeGenerator(model, oracle, TreeShape(16, 4, 3, adaptive=True))
    gen.policy = AdaptiveTree(CHEAP_VERIFY, 4, 3, 16)
    out = gen.generate(prompt, max_new_tokens=50)
    assert out.tokens == continuation[:50]
    assert out.draft_depths.count(4) >= 8 and sum(out.accept_lengths) >= 35
