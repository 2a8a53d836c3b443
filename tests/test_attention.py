"""Attention implementations that cannot take a tree mask (flash attention, flex without a block
mask) are routed: calls without a mask keep the model's implementation, tree forwards go to SDPA."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import hf_greedy, random_prompt, tiny_model
from transformers import AttentionInterface

from eagle import Eagle3Head
from eagle.tree import DraftTree
from mars import SpeculativeGenerator
from mars.target import TargetModel, tree_route

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def maskless(monkeypatch):
    """A stand-in for flash attention, registered under its own name: it takes no mask (it fails on
    one, as flash would mis-read it) and records every call."""
    sdpa = AttentionInterface._global_mapping["sdpa"]
    calls: list[int] = []

    def forward(module, query, key, value, attention_mask, **kwargs):
        assert attention_mask is None, "a tree mask reached an implementation that cannot apply it"
        calls.append(query.shape[2])
        return sdpa(module, query, key, value, None, **kwargs)  # causal, as flash is without a mask

    monkeypatch.setitem(AttentionInterface._global_mapping, "maskless_test", forward)
    return calls


def test_a_maskless_implementation_keeps_the_prefill_and_hands_trees_to_sdpa(maskless):
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 10)
    expected = hf_greedy(model, prompt, 30)
    model.config._attn_implementation = "maskless_test"
    torch.manual_seed(1)
    with SpeculativeGenerator(model, Eagle3Head.for_target(model.config), total_tokens=12, depth=4,
                              branching=3) as gen:
        assert model.config._attn_implementation == "mars_tree"
        out = gen.generate(prompt, max_new_tokens=30)
        plain = gen.vanilla(prompt, max_new_tokens=30)
    assert model.config._attn_implementation == "maskless_test"  # given back on close
    assert out.tokens == expected and plain.tokens == expected
    layers = model.config.num_hidden_layers
    assert maskless[:layers] == [10] * layers  # the prefill ran on the model's own implementation
    assert maskless.count(1) >= 29 * layers  # and so did vanilla's one-token steps


def test_flash_attention_2_is_routed_not_given_tree_masks(monkeypatch, maskless):
    """flash-attn cannot be installed here: its registry entry is the stand-in above."""
    monkeypatch.setitem(AttentionInterface._global_mapping, "flash_attention_2",
                        AttentionInterface._global_mapping["maskless_test"])
    model = tiny_model("qwen2")
    model.config._attn_implementation = "flash_attention_2"
    target = TargetModel(model)
    assert model.config._attn_implementation == "mars_tree" and target.maskless == "flash_attention_2"
    prompt = random_prompt(random.Random(1), model.config.vocab_size, 9)
    target.prefill(prompt[0], capacity=40)
    assert maskless == [9] * model.config.num_hidden_layers  # the prefill went to "flash"
    tree = DraftTree.checked([3, 4, 5, 6], [-1, 0, 0, 1])
    target.score_tree(tree)  # a 4-node tree with its mask: to SDPA, never to "flash"
    assert len(maskless) == model.config.num_hidden_layers
    target._restore_attention = None  # close() would re-run flash-attn's import check, which fails here
    model.config._attn_implementation = "sdpa"


def test_an_unregistered_implementation_gets_a_clear_error():
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        tree_route("no_such_kernel")
