"""Attention in tree forwards. Implementations that cannot take a tree mask (flash attention, flex
without a block mask) are routed: calls without a mask keep the model's implementation, tree forwards
go to SDPA. Exact attention gives each tree row plain decoding's computation (bit for bit in bf16),
with its plan built on the device: a cycle synchronises no more than the plain path does."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import OracleHead, hf_greedy, make_tree, random_prompt, tiny_model
from transformers import AttentionInterface

from eagle import Eagle3Head
from eagle.tree import DraftTree
from mars import SpeculativeGenerator
from mars.adapter import EXACT_BUCKET, TargetModel, tree_route
from mars.decoding.settings import TreeShape
from mars.diagnostics.syncs import SyncCounter

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
    with SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(12, 4, 3)) as gen:
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


def test_an_sdpa_gqa_model_on_cpu_scores_trees_without_repeated_keys_bit_for_bit(monkeypatch):
    """The GQA route (`mars.adapter.routing.gqa_route`): a tree forward runs SDPA's GQA mode instead of
    transformers' repeat_kv (a copy of the cache per layer) and gives its logits bit for bit; the model's
    implementation is given back on close; a model without grouped-query attention keeps its own."""
    import transformers.integrations.sdpa_attention as sdpa_module
    repeats: list[int] = []
    repeat_kv = sdpa_module.repeat_kv
    monkeypatch.setattr(sdpa_module, "repeat_kv", lambda x, n: repeats.append(n) or repeat_kv(x, n))
    model = tiny_model("llama")  # 4 query heads, 2 key-value heads
    prompt = random_prompt(random.Random(2), model.config.vocab_size, 12)[0]
    tree = DraftTree.checked([3, 4, 5, 6, 7], [-1, 0, 0, 1, 3])
    target = TargetModel(model)
    assert target.gqa and model.config._attn_implementation == "mars_gqa"
    target.prefill(prompt, capacity=40)
    routed, _ = target.score_tree(tree)
    assert repeats == []
    target.gqa = False  # the same forward through transformers' SDPA
    own, _ = target.score_tree(tree)
    assert repeats == [2] * 2 * model.config.num_hidden_layers  # keys and values of every layer
    assert torch.equal(routed, own)
    target.close()
    assert model.config._attn_implementation == "sdpa"
    plain = tiny_model("llama", num_key_value_heads=4)
    assert not TargetModel(plain).gqa and plain.config._attn_implementation == "sdpa"


def test_an_unregistered_implementation_gets_a_clear_error():
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        tree_route("no_such_kernel")


# --- exact attention ----------------------------------------------------------------------------

def test_exact_tree_rows_across_a_key_bucket_equal_plain_decoding_bit_for_bit():
    """Rows of one tree that pad their keys to different widths (the root and its children to one
    bucket, deeper nodes to the next) each give what plain decoding of their path gives, in bf16."""
    model = tiny_model("llama", sharpen=1.0).to(torch.bfloat16)
    prompt = random_prompt(random.Random(5), model.config.vocab_size, EXACT_BUCKET - 2)[0]
    parents, tokens = [-1, 0, 0, 1, 1, 3, 5], [7, 8, 9, 10, 11, 12, 13]
    tree, target = make_tree(parents, tokens), TargetModel(model, exact_attention=True)
    target.prefill(prompt, capacity=EXACT_BUCKET * 2)
    tree_logits, _ = target.score_tree(tree)
    for node in range(len(parents)):
        path = tree.path_to(node)
        target.prefill(prompt, capacity=EXACT_BUCKET * 2)
        for i in path:
            plain = target.decode(tokens[i])
        assert torch.equal(tree_logits[node], plain), (node, path)
    target.close()


def per_cycle(gen: SpeculativeGenerator, prompt: torch.Tensor) -> tuple[float, dict]:
    """Syncs per cycle in the steady state (as tests/test_syncs.py counts them): the difference between
    a long and a short generation, so that the prefill's few reads are not spread over the cycles."""
    counts = []
    for tokens in (24, 72):
        with SyncCounter() as syncs:
            out = gen.generate(prompt, max_new_tokens=tokens)
        counts.append((syncs.total, out.num_cycles, dict(syncs.by_kind)))
    (s0, c0, _), (s1, c1, kinds) = counts
    assert c1 > c0
    return (s1 - s0) / (c1 - c0), kinds


@pytest.mark.parametrize("oracle", [False, True])
def test_a_bf16_exact_attention_cycle_synchronises_at_most_four_times(oracle):
    """The plan (each row's keys and padding) is built on the device: no host read per node or per
    key width. The 60 generated tokens carry the sequence across a key bucket (64), where one tree's
    rows need two widths."""
    model = tiny_model("llama").to(torch.bfloat16)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    plain = hf_greedy(model, prompt, 80)
    head = OracleHead(model.config, prompt[0].tolist() + plain) if oracle else Eagle3Head.for_target(model.config)
    with SpeculativeGenerator(model, head.to(torch.bfloat16), TreeShape(20, 4, 5),
                              exact_attention=True) as gen:
        assert gen.target.exact_attention
        syncs, kinds = per_cycle(gen, prompt)
        assert gen.generate(prompt, max_new_tokens=72).tokens == gen.vanilla(prompt, max_new_tokens=72).tokens
    assert syncs <= 4, kinds
