"""MARS in the generation loop: a never-firing threshold is strict; the paper default relaxes, within the top-2.

Instrumented runs record, for every cycle, the processed logits, the tree and the verdict, by
wrapping the `accept_rows` that `mars.decoding.generate` calls (one prompt: a forest of one); the checks
recompute the margins from them.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import tiny_generator

import mars.decoding.generate as generate_module

PROMPTS = [[1, 2, 3], [7, 0, 11, 4, 9], [15]]
NEVER_FIRING = [dict(margin="prob_ratio", theta=1.0), dict(margin="logprob_gap", theta=0.0)]
SAMPLING = [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.0, top_p=0.9)]


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def generator():
    return tiny_generator(5, 6, sharpen=2.0, total_tokens=12, depth=4, branching=4)


@pytest.fixture(scope="module")
def topk_generator():
    """The same pair drafting the head's top-k when sampling: its drafts are certain (q = 1), so strict's
    test rejects a top-2 child far more often than under the random head's flat samples, and the
    relaxation accepts many tokens strict would not."""
    return tiny_generator(5, 6, sharpen=2.0, total_tokens=12, depth=4, branching=4, drafting="topk")


@pytest.fixture
def recorded(monkeypatch):
    """Every cycle's (processed logits, tree, verdict)."""
    cycles = []
    real = generate_module.accept_rows

    def recording(processed, forest, cfg, rng=None, **settings):  # settings: e.g. the loop's defer_cost
        verdicts = real(processed, forest, cfg, rng, **settings)
        assert forest.batch == 1 and len(verdicts) == 1
        cycles.append((processed.clone(), forest, verdicts[0]))
        return verdicts

    monkeypatch.setattr(generate_module, "accept_rows", recording)
    return cycles


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logit_ratio(row: torch.Tensor) -> tuple[float, float, float]:
    """(z1, z2, z2 / z1) of one row, recomputed from the sorted logits."""
    z = row.sort(descending=True).values
    return z[0].item(), z[1].item(), (z[1] / (z[0] + 1e-10)).item()


# --- a threshold that never fires is strict -------------------------------------------------


@pytest.mark.parametrize("never", NEVER_FIRING, ids=lambda d: d["margin"])
def test_never_firing_mars_is_strict_greedy(generator, never):
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        strict = generator.generate(ids, max_new_tokens=24)
        mars = generator.generate(ids, max_new_tokens=24, rule="mars", **never)
        assert mars.tokens == strict.tokens and mars.accept_lengths == strict.accept_lengths
        assert mars.relaxed_tokens == 0 and mars.stats.relax_allowed == 0


@pytest.mark.parametrize("never,fallback", list(zip(NEVER_FIRING, ["strict", "reference"], strict=True)),
                         ids=["prob_ratio-strict", "logprob_gap-reference"])
def test_never_firing_mars_is_strict_sampling_with_the_same_seed(generator, never, fallback):
    for setting in SAMPLING:
        for seed, prompt in enumerate(PROMPTS):
            g_strict, g_mars = seeded(seed), seeded(seed)
            strict = generator.generate(torch.tensor([prompt]), max_new_tokens=20, generator=g_strict, **setting)
            mars = generator.generate(torch.tensor([prompt]), max_new_tokens=20, generator=g_mars, rule="mars",
                                      fallback=fallback, **never, **setting)
            assert mars.tokens == strict.tokens and mars.accept_lengths == strict.accept_lengths
            assert mars.relaxed_tokens == 0
            assert torch.equal(g_mars.get_state(), g_strict.get_state())  # the same random draws


# --- the paper default relaxes, only within the top-2 ---------------------------------------


def test_paper_default_greedy_relaxes_and_only_to_the_top2(generator, recorded):
    relaxed, differs = 0, False
    for prompt in PROMPTS:
        out = generator.generate(torch.tensor([prompt]), max_new_tokens=32, rule="mars")  # logit_ratio, 0.9
        relaxed += out.relaxed_tokens
        differs |= out.tokens != generator.vanilla(torch.tensor([prompt]), max_new_tokens=32).tokens
    assert relaxed > 0 and differs
    checked = 0
    for processed, tree, verdict in recorded:
        tokens = tree.tokens.tolist()
        for parent, child in zip(verdict.path, verdict.path[1:], strict=False):
            row = processed[parent]
            z1, z2, ratio = logit_ratio(row)
            value = row[tokens[child]].item()
            if tokens[child] != int(row.argmax()):
                assert value == z2 and ratio > 0.9  # relaxed: the top-2 where the target is undecided
                checked += 1
            assert value >= z2  # never outside the top-2
    assert checked == relaxed


@pytest.mark.parametrize("drafting", ["sample", "topk"])
@pytest.mark.parametrize("setting", SAMPLING, ids=["T1", "T0.7", "top_p0.9"])
def test_paper_default_sampling_relaxes_only_to_the_top2(generator, topk_generator, recorded, setting, drafting):
    generator = topk_generator if drafting == "topk" else generator
    relaxed = 0
    for seed, prompt in enumerate(PROMPTS * (1 if drafting == "topk" else 4)):  # sampled drafts relax rarely
        out = generator.generate(torch.tensor([prompt]), max_new_tokens=32, rule="mars", generator=seeded(seed),
                                 **setting)
        relaxed += out.relaxed_tokens
    assert relaxed > 0
    checked = 0
    for processed, tree, verdict in recorded:
        tokens = tree.tokens.tolist()
        for step, parent, child in zip(verdict.steps, verdict.path, verdict.path[1:], strict=False):
            row = processed[parent]
            z1, z2, ratio = logit_ratio(row)
            if step.relaxed:  # accepted outright: must be the target's top-1 or top-2 there, margin passing
                assert row[tokens[child]].item() >= z2 > -float("inf") and ratio > 0.9
                assert child == next(c for c in tree.children[parent] if row[tokens[c]].item() >= z2)
                checked += 1
            else:  # the strict rule accepted it: it has probability under the target
                assert row[tokens[child]].item() > -float("inf")
    assert checked == relaxed


# --- statistics -----------------------------------------------------------------------------


@pytest.mark.parametrize("setting", [dict(), dict(temperature=1.0)], ids=["greedy", "sampling"])
def test_stats_match_the_recorded_verdicts(topk_generator, recorded, setting):
    generator = topk_generator
    prompt = torch.tensor([PROMPTS[1]])
    out = generator.generate(prompt, max_new_tokens=40, rule="mars", generator=seeded(3), **setting)
    assert len(recorded) == out.num_cycles == len(out.accept_lengths)
    assert out.accept_lengths == [v.accepted for _, _, v in recorded]
    assert len(out.tokens) == 1 + sum(a + 1 for a in out.accept_lengths) == 40

    attempts, accepts, relaxed, margins = Counter(), Counter(), Counter(), []
    for processed, tree, verdict in recorded:
        for j, node in enumerate(verdict.path):  # every path node is a verified position
            margins.append(logit_ratio(processed[node])[2])
            if tree.children[node]:
                depth = int(tree.depths[node])
                attempts[depth] += 1
                accepts[depth] += j + 1 < len(verdict.path)
                relaxed[depth] += verdict.steps[j].relaxed
    stats = out.stats
    assert stats.positions == len(stats.gates) == len(margins) == len(out.tokens) - 1
    assert stats.gates == pytest.approx(margins, rel=1e-5)
    assert +stats.attempts == +attempts and +stats.accepts == +accepts and +stats.relaxed == +relaxed
    assert stats.acceptance_rate_by_depth == {d: accepts[d] / attempts[d] for d in sorted(attempts)}
    assert sum(stats.accepts.values()) == sum(out.accept_lengths)
    assert stats.relaxed_tokens == out.relaxed_tokens == sum(relaxed.values()) > 0
    assert all(stats.relaxed[d] <= stats.accepts[d] for d in stats.relaxed)
    summary = stats.summary()
    assert summary["positions"] == stats.positions
    assert summary["relaxed_by_depth"] == dict(sorted(stats.relaxed.items()))
    assert 0 < summary["relax_allowed_frac"] <= 1
