"""Static shapes (`mars.adapter.static`): one full-capacity cache reused by every call, trees padded to one
size, masks as wide as the cache. Eager, it gives plain greedy decoding's tokens and the dynamic
path's (greedy and sampled); compiled with torch.compile on CPU, the eager static path's tokens
and tree logits, with one compiled graph per shape whatever the prompt's length."""

from __future__ import annotations

import os
import random

import pytest
import torch
from helpers import OracleHead, forward_tolerance, hf_greedy, longest_reduction, make_tree, random_prompt, tiny_model
from torch._dynamo.utils import counters

from eagle import Eagle3Head
from mars import SpeculativeGenerator
from mars.adapter import PreallocatedLayer, TargetModel
from mars.adapter.cache import StaticTreeLayer
from mars.adapter.static import StaticMasks
from mars.decoding.settings import TreeShape

pytestmark = pytest.mark.usefixtures("single_thread")

TREE = dict(total_tokens=12, depth=4, branching=3)


def cache_keys(gen: SpeculativeGenerator) -> torch.Tensor:
    return gen.target.cache.layers[0].keys


def assert_forwards_close(got: tuple, reference: tuple, static: TargetModel) -> None:
    """(logits, features) of one tree from two forwards that reduce in different kernels (padded or not,
    compiled or not), equal up to rounding (`forward_tolerance`): through every layer, then the lm_head,
    the longest reduction a linear layer's input or an attention row over the static cache."""
    model = static.model
    layers, terms = model.config.num_hidden_layers + 1, longest_reduction(model, static.max_cache_len)
    for value, ref in zip(got, reference, strict=True):
        atol = forward_tolerance(layers, terms, ref.abs().max().item())
        torch.testing.assert_close(value, ref, atol=atol, rtol=0)


# --- the pieces ---------------------------------------------------------------------------------

def test_keep_gathers_the_path_as_the_dynamic_layer_does():
    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    static, dynamic = StaticTreeLayer(max_cache_len=16), PreallocatedLayer(capacity=16)
    for layer in (static, dynamic):
        layer.update(keys, values)
        layer.keep(3, torch.tensor([0, 2, 5]))
    assert int(static.cumulative_length) == dynamic.length == 6
    assert torch.equal(static.keys[:, :, :6], dynamic.keys) and torch.equal(static.values[:, :, :6], dynamic.values)
    static.truncate(4)
    static.update(keys[:, :, :1], values[:, :, :1])  # writes go where the kept sequence ends
    assert int(static.cumulative_length) == 5 and torch.equal(static.keys[:, :, 4], keys[:, :, 0])


def reference_tree_mask(prefix: int, ancestors: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    blocked = torch.finfo(torch.float32).min
    mask = torch.full((rows, width), blocked)
    mask[:, :prefix] = 0.0
    block = torch.eye(rows, dtype=torch.bool)
    block[: len(ancestors), : len(ancestors)] = ancestors
    mask[:, prefix : prefix + rows] = torch.where(block, 0.0, blocked)
    return mask[None, None]


def test_masks_written_cycle_by_cycle_equal_masks_built_from_scratch():
    rows, width = 6, 32
    masks = StaticMasks(rows, width, torch.float32, torch.device("cpu"))
    chain = make_tree([-1, 0, 1, 2], [0, 0, 0, 0]).ancestors
    bush = make_tree([-1, 0, 0, 1, 1], [0] * 5).ancestors
    # A growing sequence, a decoding step between trees, then a shorter one (a new sequence).
    for prefix, ancestors in [(5, chain), (8, bush), ("step", 9), (9, chain), (20, bush), (3, bush)]:
        if prefix == "step":
            step = masks.for_step(ancestors)
            assert torch.equal(step[0, 0, 0, : ancestors + 1], torch.zeros(ancestors + 1))
            assert bool((step[0, 0, 0, ancestors + 1 :] == torch.finfo(torch.float32).min).all())
            continue
        assert torch.equal(masks.for_tree(prefix, ancestors), reference_tree_mask(prefix, ancestors, rows, width))


def test_a_padded_tree_scores_as_the_dynamic_path_does():
    model = tiny_model("llama")
    layers = [0, 3, model.config.num_hidden_layers]
    static = TargetModel(model, layers, static=True, tree_rows=10, max_cache_len=64)
    dynamic = TargetModel(model, layers)
    prompt = random_prompt(random.Random(2), model.config.vocab_size, 13)[0]
    tree = make_tree([-1, 0, 0, 1, 1, 3], [7, 8, 9, 10, 11, 12])
    for path in ([0, 2], [0, 1, 3, 5]):  # two cycles: the second tree sits after a kept path
        results = []
        for target in (static, dynamic):
            if target.committed == 0:
                target.prefill(prompt, capacity=40)
            results.append(target.score_tree(tree))
            with torch.inference_mode():  # as in the generator's calls (the cache is made of inference tensors)
                target.keep_path(path, torch.tensor(path))
        assert results[0][0].shape == results[1][0].shape == (6, model.config.vocab_size)
        assert_forwards_close(*results, static)
        assert int(static.cache.layers[0].cumulative_length) == static.committed == dynamic.committed


# --- the engine, eager --------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_greedy_equals_plain_greedy_and_the_dynamic_path_in_one_cache(arch):
    model = tiny_model(arch)
    torch.manual_seed(0)
    head = Eagle3Head.for_target(model.config)
    static = SpeculativeGenerator(model, head, TreeShape(**TREE), static=True)
    dynamic = SpeculativeGenerator(model, head, TreeShape(**TREE))
    cache, address = static.target.cache, None
    rng = random.Random(1)
    for length in (1, 9, 70):
        prompt = random_prompt(rng, model.config.vocab_size, length)
        expected = hf_greedy(model, prompt, 24)
        assert static.generate(prompt, max_new_tokens=24).tokens == expected
        assert dynamic.generate(prompt, max_new_tokens=24).tokens == expected
        assert static.vanilla(prompt, max_new_tokens=24).tokens == expected
        address = address or cache_keys(static).data_ptr()
        # One cache, never reallocated: the same buffers at the same address for every prompt.
        assert static.target.cache is cache and cache_keys(static).data_ptr() == address
        assert cache_keys(static).shape[2] == static.target.max_cache_len


def test_static_oracle_draft_is_accepted_in_full_across_prompts():
    model = tiny_model("llama")
    static = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE), static=True)
    address = None
    for length in (5, 31):
        prompt = random_prompt(random.Random(length), model.config.vocab_size, length)
        continuation = hf_greedy(model, prompt, 40)
        static.head = OracleHead(model.config, prompt[0].tolist() + continuation)
        out = static.generate(prompt, max_new_tokens=26)  # the prefill's token, then five full cycles
        assert out.tokens == continuation[:26]
        assert out.accept_lengths == [4] * 5
        address = address or cache_keys(static).data_ptr()
        assert cache_keys(static).data_ptr() == address


def test_static_adaptive_trees_of_any_size_and_plain_steps_equal_plain_greedy():
    """The adaptive tree varies its size and takes plain decoding steps: every tree is padded to
    total_tokens + 1 rows, a lone root runs as a decoding step, and the cost measurement at the
    first call leaves the cache in place."""
    model = tiny_model("llama")
    torch.manual_seed(0)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE, adaptive=True),
                               static=True)
    cache = gen.target.cache
    for length in (3, 20):
        prompt = random_prompt(random.Random(length), model.config.vocab_size, length)
        out = gen.generate(prompt, max_new_tokens=30)
        assert out.tokens == hf_greedy(model, prompt, 30)
        assert 0 in out.draft_depths and gen.target.cache is cache and gen.target.masks.rows == 13


@pytest.mark.parametrize("rule", ["strict", "mars"])
def test_static_sampling_draws_what_the_dynamic_path_draws(rule):
    """The same RNG protocol on logits equal up to rounding: the same tokens from the same seed."""
    model = tiny_model("llama", sharpen=1.0)
    torch.manual_seed(3)
    head = Eagle3Head.for_target(model.config)
    static = SpeculativeGenerator(model, head, TreeShape(**TREE), static=True)
    dynamic = SpeculativeGenerator(model, head, TreeShape(**TREE))
    prompt = random_prompt(random.Random(4), model.config.vocab_size, 17)
    outs = [gen.generate(prompt, max_new_tokens=40, temperature=1.0, rule=rule,
                         generator=torch.Generator().manual_seed(5)) for gen in (static, dynamic)]
    assert outs[0].tokens == outs[1].tokens and outs[0].accept_lengths == outs[1].accept_lengths


def test_static_mode_puts_no_hooks_of_ours_on_the_model():
    model = tiny_model("llama")
    hooks = lambda: [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]  # noqa: E731
    prompt = random_prompt(random.Random(5), model.config.vocab_size, 8)
    with torch.inference_mode():
        model(prompt, output_hidden_states=True)  # transformers installs its own recorders once
    before = hooks()
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE), static=True)
    gen.generate(prompt, max_new_tokens=12)
    assert gen.target.taps is None and hooks() == before


# --- clear errors -------------------------------------------------------------------------------

def test_static_settings_that_cannot_work_are_refused_with_the_fix():
    model = tiny_model("llama")
    head = Eagle3Head.for_target(model.config)
    with pytest.raises(ValueError, match="static=True"):
        SpeculativeGenerator(model, head, TreeShape(**TREE), compile="default")
    with pytest.raises(ValueError, match="static=True"):
        SpeculativeGenerator(model, head, TreeShape(**TREE), max_cache_len=256)
    with pytest.raises(ValueError, match="exact_attention=False"):
        SpeculativeGenerator(model, head, TreeShape(**TREE), static=True, exact_attention=True)
    with pytest.raises(ValueError, match="prepack=False"):
        SpeculativeGenerator(model, head, TreeShape(**TREE), static=True, compile="default", prepack=True)
    # compiles at first use only
    gen = SpeculativeGenerator(model, head, TreeShape(**TREE), static=True, compile="default")
    assert gen.prepack is False and "torch.compile" in gen.prepack_reason
    bf16 = tiny_model("llama").to(torch.bfloat16)
    bf16_head = Eagle3Head.for_target(bf16.config).to(torch.bfloat16)
    # exact attention "auto" resolves to off with static shapes
    assert SpeculativeGenerator(bf16, bf16_head, TreeShape(**TREE), static=True).target.exact_attention is False
    windowed = tiny_model("mistral", sliding_window=16)
    with pytest.raises(NotImplementedError, match="sliding window"):
        SpeculativeGenerator(windowed, Eagle3Head.for_target(windowed.config), TreeShape(**TREE), static=True)


def test_a_sequence_longer_than_the_static_cache_is_refused_before_it_starts():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE), static=True,
                               max_cache_len=64)
    prompt = random_prompt(random.Random(6), model.config.vocab_size, 30)
    with pytest.raises(ValueError, match="max_cache_len=64"):
        gen.generate(prompt, max_new_tokens=30)  # 30 + 30 + a 13-node tree > 64
    with pytest.raises(ValueError, match="max_cache_len=64"):
        gen.vanilla(prompt, max_new_tokens=40)
    assert gen.generate(prompt, max_new_tokens=21).tokens == hf_greedy(model, prompt, 21)  # 30 + 21 + 13 = 64 fits


# --- compiled (torch.compile on CPU) ------------------------------------------------------------

def compiled_frames() -> int:
    """Frames dynamo has compiled in this process (a recompilation counts as one more)."""
    return counters["frames"]["total"]


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks in this process so far, by reason: a test compares two readings, since
    any other test that compiled in this process counts its breaks here too."""
    return dict(counters["graph_break"])


@pytest.fixture(scope="module")
def compiled() -> SpeculativeGenerator:
    """A compiled generator on a two-layer model (compiling takes ~10 s with a cold inductor cache)."""
    model = tiny_model("llama", num_hidden_layers=2)
    torch.manual_seed(0)
    return SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE), static=True,
                                compile="default")


def test_compiled_greedy_equals_eager_and_plain_greedy_without_recompiling(compiled):
    model = compiled.target.model
    eager = SpeculativeGenerator(model, compiled.head, TreeShape(**TREE), static=True)
    rng = random.Random(7)
    frames, breaks = [compiled_frames()], graph_breaks()
    for length in (6, 29):  # a second prompt of another length: no new graph
        prompt = random_prompt(rng, model.config.vocab_size, length)
        expected = hf_greedy(model, prompt, 20)
        out = compiled.generate(prompt, max_new_tokens=20)
        assert out.tokens == expected == eager.generate(prompt, max_new_tokens=20).tokens
        assert compiled.vanilla(prompt, max_new_tokens=20).tokens == expected
        frames.append(compiled_frames())
    # The first prompt compiled graphs here (vanilla's one-row step at least, which no other test
    # of this generator compiles): the output above came from compiled code, not an eager fallback.
    assert frames[1] > frames[0], frames
    assert frames[2] == frames[1], frames  # the second prompt's length compiled nothing new
    assert graph_breaks() == breaks  # each shape compiled here is one whole graph


def test_compiled_tree_forward_matches_eager(compiled):
    model = compiled.target.model
    eager = TargetModel(model, compiled.target.feature_layers, static=True, tree_rows=compiled.target.tree_rows)
    prompt = random_prompt(random.Random(8), model.config.vocab_size, 11)[0]
    tree = make_tree([-1, 0, 0, 1, 2, 2, 4], [3, 1, 4, 1, 5, 9, 2])
    results = []
    for target in (compiled.target, eager):
        target.prefill(prompt, capacity=40)
        results.append(target.score_tree(tree))
    assert_forwards_close(*results, eager)


def test_compiling_under_isa_limits_uses_an_inductor_cache_of_its_own(monkeypatch, tmp_path):
    """inductor's disk cache is not keyed by ATEN_CPU_CAPABILITY: kernels an unlimited process compiled
    on an AVX-512 CPU gave NaN logits to a process limited to AVX2. A user's own cache dir is kept."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from mars.adapter.static import separate_inductor_cache

    default = os.path.abspath(default_cache_dir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)  # as importing torch._inductor leaves it
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default  # no limits: the default cache
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.join(default, "limited-aten_cpu_capability=avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the user's choice
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
