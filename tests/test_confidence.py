"""The draft head's confidence temperature: what it changes in a tree (which nodes are kept), what it
must not change (each node's children's order, strict greedy output), how it is stored, and its fit."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import hf_greedy, summation_tolerance, tiny_llama, unit_roundoff

from eagle.checkpoint import load_draft, save_draft
from eagle.config import DraftConfig
from eagle.heads import Eagle3Head
from eagle.train.confidence import BLOCK, GRID, Calibration, fit_confidence, log_partitions, write_temperature
from eagle.train.data import Sequences
from eagle.tree import confidence_logprobs, grow_tree
from mars import SpeculativeGenerator
from mars.decoding.settings import TreeShape


def _pair(temperature: float = 1.0, seed: int = 0):
    target = tiny_llama(seed=seed, vocab_size=64, sharpen=4.0)
    torch.manual_seed(seed + 1)
    head = Eagle3Head.for_target(target.config)
    head.config.confidence_temperature = temperature
    return target, head


def _head_state(target, head, prompt):
    """The head's output at the prompt's last position, as decoding starts a cycle."""
    from mars.adapter import TargetModel

    model = TargetModel(target, head.config.feature_layers, exact_attention=False)
    _, features = model.prefill(prompt[0], capacity=prompt.shape[1] + 64)
    head.reset()
    return head.extend(features, torch.cat([prompt[0, 1:], torch.tensor([0])]))


def test_confidence_is_the_log_softmax_at_the_temperature():
    logits = torch.randn(3, 11)
    _, head = _pair(0.4)
    expected = torch.log_softmax(logits / 0.4, dim=-1)
    # Two float32 routes to the same values: each rounds numbers up to `size` a few times and sums V
    # exponentials (the log-softmax's normaliser) twice at most.
    size = max(logits.abs().max().item(), logits.log_softmax(-1).abs().max().item()) / 0.4
    atol = summation_tolerance(logits.shape[-1], size)
    torch.testing.assert_close(confidence_logprobs(head, logits.log_softmax(-1)), expected, atol=atol, rtol=0)
    head.config.confidence_temperature = 1.0
    lp = logits.log_softmax(-1)
    assert confidence_logprobs(head, lp) is lp  # the head as trained: nothing computed


def test_a_sharper_confidence_keeps_deeper_nodes_and_never_reorders_children():
    target, head = _pair()
    prompt = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    hidden, logprobs = _head_state(target, head, prompt)
    flat = grow_tree(head, 0, hidden, logprobs, depth=1, branching=4, total_tokens=4)  # the root's children
    head.config.confidence_temperature = 0.2
    sharp = grow_tree(head, 0, hidden, logprobs, depth=1, branching=4, total_tokens=4)
    # The same first level, children in the same (draft) order; scores rescaled.
    torch.testing.assert_close(sharp.tokens[1:], flat.tokens[1:], rtol=0, atol=0)
    assert sharp.scores[1:].max() > flat.scores[1:].max()
    head.config.confidence_temperature = 1.0
    tree_flat = grow_tree(head, 0, hidden, logprobs, 4, 4, 8)
    head.config.confidence_temperature = 0.2
    tree_sharp = grow_tree(head, 0, hidden, logprobs, 4, 4, 8)
    assert tree_sharp.depths.float().mean() > tree_flat.depths.float().mean()


@pytest.mark.parametrize("temperature", [0.2, 3.0])
def test_strict_greedy_output_does_not_depend_on_the_confidence_temperature(temperature):
    target, head = _pair(temperature, seed=2)
    gen = SpeculativeGenerator(target, head, TreeShape(10, 4, 3))
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 7 + seed), generator=torch.Generator().manual_seed(seed))
        assert gen.generate(prompt, max_new_tokens=24).tokens == hf_greedy(target, prompt, 24)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, "0.5"])
def test_a_bad_confidence_temperature_is_refused_by_name(bad):
    target, head = _pair()
    values = {**head.config.to_json(), "confidence_temperature": bad}
    with pytest.raises(ValueError, match="confidence_temperature"):
        DraftConfig.from_json(values)


def test_the_temperature_travels_with_the_checkpoint(tmp_path):
    target, head = _pair(0.25)
    save_draft(head, tmp_path / "draft")
    assert load_draft(tmp_path / "draft", target).config.confidence_temperature == 0.25
    write_temperature(tmp_path / "draft", 0.5)
    assert load_draft(tmp_path / "draft", target).config.confidence_temperature == 0.5
    # A checkpoint without the field (every published one) ranks by the head's own log-probabilities.
    raw = json.loads((tmp_path / "draft" / "config.json").read_text())
    del raw["confidence_temperature"]
    (tmp_path / "draft" / "config.json").write_text(json.dumps(raw))
    assert load_draft(tmp_path / "draft", target).config.confidence_temperature == 1.0


def test_the_fit_recovers_the_temperature_of_calibrated_events():
    """Labels drawn from softmax(z / 0.5): confidences are calibrated exactly at T = 0.5."""
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(40_000, 30, generator=gen)
    labels = torch.multinomial(torch.softmax(logits / 0.5, dim=-1), 1, generator=gen)[:, 0]
    identity = SimpleNamespace(to_target_ids=lambda ids: ids)
    fit = Calibration.empty(steps=1)
    fit.add(0, logits, labels, torch.ones(40_000, dtype=torch.bool), identity, topk=5)
    result = fit.result()
    assert result["confidence_temperature"] == pytest.approx(0.5, rel=0.06)  # within one grid step
    step = result["steps"][0]
    assert step["top1_confidence_fitted"] == pytest.approx(step["top1_acceptance"], abs=0.02)


def test_log_partitions_are_the_logsumexp_at_every_grid_temperature():
    """Blocked and floored (terms below float32's normal range count as 1.6e-38), the partition sums are
    logsumexp's, also for logits hundreds below their row's max and over rows that span several blocks."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.cat([3 * torch.randn(BLOCK + 7, 50, generator=gen), -400 * torch.rand(5, 50, generator=gen)])
    shifted = logits - logits.max(-1, keepdim=True).values
    got = log_partitions(shifted, GRID)
    assert got.shape == (len(GRID), logits.shape[0], 1)
    # Sums of 50 terms <= 1 (each exp rounded once) holding a term of 1, so the logs differ by the sums' rounding
    atol = summation_tolerance(50, 1.0, term_error=unit_roundoff()) + 2 * unit_roundoff() * 4
    for g, t in enumerate(GRID.tolist()):
        torch.testing.assert_close(got[g, :, 0], (shifted / t).logsumexp(-1), atol=atol, rtol=0)


def test_the_fit_refuses_empty_data():
    with pytest.raises(ValueError, match="no events"):
        Calibration.empty(steps=2).result()


def test_fit_on_a_real_head_scales_with_the_head_s_logits():
    """Known answer: c_T = softmax(logits / T), so a head whose output layer is scaled by s has its BCE
    at T * s exactly where the head had it at T, and its fitted temperature is s times the head's. With s
    k grid steps (the grid is geometric) the fit moves k steps down, every BCE and confidence unchanged.
    The head's own fit lies inside the grid, k steps or more from its lower end (checked: else the
    scaled optimum could lie off the grid)."""
    target, head = _pair(seed=4)
    ids = torch.randint(0, 64, (6, 24), generator=torch.Generator().manual_seed(5))
    mask = torch.zeros(6, 24, dtype=torch.bool)
    mask[:, 8:23] = True
    seqs = Sequences(ids, torch.full((6,), 24), mask)
    report = fit_confidence(head, target, seqs, steps=3, topk=4, batch_size=4)
    k = 30
    step = (GRID[-1] / GRID[0]).item() ** (1 / (len(GRID) - 1))  # the grid's ratio between neighbours
    with torch.no_grad():
        head.lm_head.weight.mul_(step ** -k)  # the head's logits times s = step^-k (no bias, no norm after it)
    scaled = fit_confidence(head, target, seqs, steps=3, topk=4, batch_size=4)
    grid = report["grid"]
    fitted = grid.index(report["confidence_temperature"])
    assert k <= fitted < len(grid) - 1  # an interior optimum, with room below it
    assert scaled["confidence_temperature"] == grid[fitted - k]
    assert scaled["bce_per_event_fitted"] == pytest.approx(report["bce_per_event_fitted"], rel=1e-5)
    assert scaled["events"] == report["events"] == 6 * 15 * 3 * 4  # 15 scored positions, 3 steps, top-4 each
    assert [s["step"] for s in report["steps"]] == [0, 1, 2]
    assert all(s["positions"] == 6 * 15 for s in report["steps"])  # the 15 scored positions of each sequence
    for a, b in zip(scaled["steps"], report["steps"], strict=True):
        assert a["top1_acceptance"] == b["top1_acceptance"]  # scaling changes no candidate
        assert a["top1_confidence_fitted"] == pytest.approx(b["top1_confidence_fitted"], rel=1e-5)
