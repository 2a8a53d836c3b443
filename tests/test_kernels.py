"""Prepacked linears (compute.kernels): used only inside the generator's calls, the same products up
to rounding, row-invariant, refreshed when weights change, chosen by what fits. float32 packs
wherever torch has oneDNN; bf16 only on CPUs with AVX-512 BF16 (the bf16 cases say so and skip
elsewhere, while the test of the choice checks that such a CPU reports it cannot pack)."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import hf_greedy, random_prompt, summation_tolerance, tiny_model, unit_roundoff

from compute import kernels as K
from eagle import Eagle3Head
from mars import SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape

pytestmark = pytest.mark.usefixtures("single_thread")


def linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


BF16_PACKS = K.packs(torch.bfloat16)
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not BF16_PACKS, reason="oneDNN packs bf16 weights only on CPUs with AVX-512 BF16 (not this one, or limited by "
                           "ONEDNN_MAX_CPU_ISA)"))]


def product_tolerance(layer: torch.nn.Linear, x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per output, how far two kernels' products of `layer` with `x` may differ: fan_in products and the
    bias added in float32 (bf16 inputs multiply exactly in float32; oneDNN and torch accumulate there), in
    any order (`summation_tolerance`, magnitude |x| |W|^T + |b|); a bf16 result is then rounded to bf16
    once or twice (the product, then with the bias): within u_bf16 (|x W^T| + |y|) <= u_bf16 (2 |y| + |b|)."""
    weight, bias = layer.weight.float(), layer.bias.float()
    magnitude = x.float().abs() @ weight.abs().T + bias.abs()
    tol = summation_tolerance(weight.shape[1] + 1, magnitude)
    if reference.dtype != torch.float32:
        tol = tol + 2 * unit_roundoff(reference.dtype) * (2 * reference.float().abs() + bias.abs())
    return tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fan_in,fan_out", [(384, 1024), (1024, 384), (1536, 576)])  # the last: SmolLM2's down_proj
def test_packed_products_match_torch_and_do_not_depend_on_the_number_of_rows(dtype, fan_in, fan_out):
    torch.manual_seed(0)
    layer = torch.nn.Linear(fan_in, fan_out, bias=True).to(dtype)
    x = torch.randn(1, 128, fan_in, dtype=dtype)  # enough rows to meet a lone row's other kernel (1536 -> 576)
    with torch.inference_mode():
        reference = layer(x)
        with K.PackedLinears(layer).active():
            packed = layer(x)
            rows = torch.cat([layer(x[:, i : i + 1]) for i in range(x.shape[1])], dim=1)
    error = (packed.float() - reference.float()).abs()
    assert (error <= product_tolerance(layer, x, reference)).all(), error.max()
    assert torch.equal(packed, rows)  # a row's product is the same alone or among 128
    for count in (2, 17, 33, 60, 100):  # and among any other count (AMX Xeon: a kernel of its own above 32 rows)
        with torch.inference_mode(), K.PackedLinears(layer).active():
            assert torch.equal(layer(x[:, :count]), packed[:, :count]), count


def test_rows_go_to_the_kernel_only_in_counts_that_agreed(monkeypatch):
    """Whatever this CPU's probe found, a product is made of calls of counts the probe saw agree: a lone row
    as two where lone rows differ, more rows than agreed in blocks of at most that many, in order."""
    counts = []
    real = K._packed_forward
    monkeypatch.setattr(K, "_packed_forward", lambda p, b, x: counts.append(x.numel() // x.shape[-1]) or real(p, b, x))
    layer = torch.nn.Linear(16, 8)
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None)
    x = torch.randn(1, 13, 16)
    blocks = K.RowBlocks(lone_row_differs=True, most_rows=4)
    out = K._invariant_forward(blocks, packed, layer.bias.detach(), x)
    assert counts == [4, 4, 4, 2] and out.shape == (1, 13, 8)  # the 13th row alone goes in as two
    torch.testing.assert_close(out, layer(x).detach())
    counts.clear()
    K._invariant_forward(K.RowBlocks(), packed, None, x)
    assert counts == [13]


def test_bf16_packing_is_what_the_cpu_offers():
    """bf16 packs exactly where oneDNN has bf16-capable instructions: a choice `auto` makes from a
    trial, never from a list of CPU names."""
    from eagle.precision import cpu_flags

    flags = cpu_flags()
    if flags and not {"avx512bw", "avx512vl", "avx512dq"} <= flags:
        assert not BF16_PACKS  # e.g. AVX2-only: oneDNN refuses to pack bf16 weights
    model = tiny_model("llama").to(torch.bfloat16)
    use, why = K.choose_packing([model], "auto")
    assert use is BF16_PACKS
    assert ("bfloat16" in why) if use else ("no CPU linear layers that oneDNN packs" in why)


def test_packing_is_swapped_in_only_inside_active_and_follows_weight_changes():
    model = tiny_model("llama")
    packed = K.PackedLinears(model)
    assert len(packed.linears) == len(linears(model))
    x = torch.randn(1, 3, model.config.hidden_size)
    layer = model.model.layers[0].mlp.up_proj
    with torch.inference_mode(), packed.active():
        assert all("forward" in vars(m) for m in packed.linears)
        before = layer(x)
    assert not any("forward" in vars(m) for m in packed.linears)  # the user's model again
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place, as training or load_state_dict would
    with torch.inference_mode(), packed.active():
        after = layer(x)
    # Doubling the weights doubles every product and partial sum exactly (a power of two): the same
    # packed kernel on the repacked weights gives exactly twice the result, on every CPU.
    assert torch.equal(after, 2 * before)


def test_choice_follows_the_request_the_dtype_and_the_memory(monkeypatch):
    model = tiny_model("llama")
    assert K.choose_packing([model], "auto")[0] is True
    assert K.choose_packing([model], False) == (False, "off (requested)")
    assert K.choose_packing([model.to(torch.float16)], "auto") == (False, "off: no CPU linear layers that oneDNN "
                                                                               "packs here")
    model = model.float()
    monkeypatch.setattr(K, "available_memory", lambda: 1000)  # a copy of the weights would not fit
    use, why = K.choose_packing([model], "auto")
    assert not use and "available memory" in why
    assert K.choose_packing([model], True)[0] is True  # asked for explicitly: packed anyway
    with pytest.raises(ValueError, match="prepack must be"):
        K.choose_packing([model], "yes")


@pytest.mark.parametrize("dtype", DTYPES)
def test_generator_packs_inside_its_calls_and_strict_greedy_still_equals_plain_greedy(monkeypatch, dtype):
    model = tiny_model("qwen2").to(dtype)
    torch.manual_seed(1)
    head = Eagle3Head.for_target(model.config).to(dtype)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    expected = hf_greedy(model, prompt, 40)
    # Plain decoding with the same kernels is the reference: in float32 it is also model.generate's
    # output; in bf16 our plain decoding rounds differently from model.generate (exact attention
    # reduces in float32, packed products round per oneDNN), so strict is held to our vanilla there.
    with SpeculativeGenerator(model, head, TreeShape(12, 4, 3)) as gen:
        assert gen.prepack and "auto" in gen.prepack_reason
        plain = gen.vanilla(prompt, max_new_tokens=40).tokens
        seen, original = [], K._packed_forward
        monkeypatch.setattr(K, "_packed_forward", lambda *a: seen.append(1) or original(*a))
        out = gen.generate(prompt, max_new_tokens=40)
        monkeypatch.undo()
        assert seen, "the decoding loop did not use the packed products"
        assert not any("forward" in vars(m) for m in linears(model) + linears(head))
        assert out.tokens == plain
        if dtype == torch.float32:
            assert out.tokens == expected
        assert hf_greedy(model, prompt, 40) == expected  # model.generate after the call: torch's own kernels
    with SpeculativeGenerator(model, head, TreeShape(12, 4, 3), prepack=False) as gen:
        assert gen.packed is None
        assert gen.generate(prompt, max_new_tokens=40).tokens == gen.vanilla(prompt, max_new_tokens=40).tokens


def test_a_model_moved_after_packing_to_a_precision_not_packed_here_keeps_torchs_product():
    # Packed in float32, then moved to bf16 (as a draft head is when the target is): where oneDNN cannot
    # pack bf16 (no AVX-512 BF16, or under ONEDNN_MAX_CPU_ISA=AVX2) the linear runs torch's own product.
    from compute.kernels import PackedLinears, packs

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    kernels = PackedLinears(model)
    model.to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, model[0].weight, model[0].bias)
        with kernels.active():
            out = model(x)
    if packs(torch.bfloat16):  # packed bf16 products round differently: a few bf16 ulps of the largest term
        assert torch.allclose(out.float(), expected.float(), rtol=0, atol=4 * 2**-8 * float(expected.abs().max()))
    else:
        assert torch.equal(out, expected)
    assert "forward" not in vars(model[0])  # the class's own forward again


def test_plain_decoding_can_run_at_its_own_kernels_while_the_tree_stays_packed(monkeypatch):
    # The fastest one-row products are not always the fastest few-row ones (bf16 on the AVX-512 EPYC: torch's
    # own, oneDNN off, for a decoding step; packed oneDNN for a tree): vanilla and speculation off decode at
    # plain_kernels, the tree at its own, and strict equals plain decoding at the tree's kernels.
    from compute.kernels import packs

    dtype = torch.bfloat16 if packs(torch.bfloat16) else torch.float32
    model = tiny_model("llama").to(dtype)
    torch.manual_seed(2)
    head = Eagle3Head.for_target(model.config).to(dtype)
    prompt = random_prompt(random.Random(3), model.config.vocab_size, 10)
    name = str(dtype).removeprefix("torch.")
    aten = Kernels(name, False, False, onednn=False)
    onednn_seen, packed_seen, original = [], [], K._packed_forward
    monkeypatch.setattr(K, "_packed_forward", lambda *a: packed_seen.append(1) or original(*a))
    hook = model.model.layers[0].register_forward_pre_hook(
        lambda *_: onednn_seen.append(torch.backends.mkldnn.enabled))
    with SpeculativeGenerator(model, head, TreeShape(8, 4, 2), prepack=True, plain_kernels=aten) as gen:
        assert gen.plain_kernels == aten and gen.tree_kernels.prepack and gen.tree_kernels.onednn
        plain = gen.vanilla(prompt, max_new_tokens=24).tokens
        # the prompt's forward (many rows) with oneDNN on packed weights, each one-row step on torch's own products
        assert packed_seen and onednn_seen[0] and onednn_seen[1:] and not any(onednn_seen[1:])
        assert torch.backends.mkldnn.enabled  # restored after the call
        onednn_seen.clear()
        at_tree = gen.vanilla(prompt, max_new_tokens=24, tree_kernels=True).tokens
        assert packed_seen and all(onednn_seen)
        assert gen.generate(prompt, max_new_tokens=24).tokens == at_tree  # exact at the tree's kernels
        gen.speculate = False
        onednn_seen.clear()
        off = gen.generate(prompt, max_new_tokens=24)
        assert off.tokens == plain and not any(onednn_seen[1:]) and off.tau == 1  # speculation off: plain's loop
        if dtype == torch.float32:  # torch's own float32 products are MKL's either way: one decoding
            assert plain == at_tree
    hook.remove()


def test_kernels_that_cannot_be_are_refused_with_the_fix_named():
    with pytest.raises(ValueError, match="prepack=True needs onednn=True"):
        Kernels("bfloat16", False, True, onednn=False)
    model = tiny_model("llama")
    head = Eagle3Head.for_target(model.config)
    with pytest.raises(ValueError, match="pass the target loaded in that precision as plain_model"):
        SpeculativeGenerator(model, head, TreeShape(8, 4, 2), plain_kernels=Kernels("bfloat16", False, False))
    with pytest.raises(ValueError, match="need the tree's too"):
        SpeculativeGenerator(model, head, TreeShape(8, 4, 2), exact_attention=False,
                             plain_kernels=Kernels("float32", True, False))


def test_plain_decoding_can_run_on_a_copy_of_the_target_in_another_precision():
    # The embedded pair on the AVX-512 EPYC: float32 trees verify fastest, bf16 plain decoding (torch's own
    # products) is fastest. vanilla and speculation off decode on the bf16 copy; strict stays float32-exact.
    import copy

    model = tiny_model("llama")
    torch.manual_seed(6)
    head = Eagle3Head.for_target(model.config)
    half = copy.deepcopy(model).to(torch.bfloat16)
    prompt = random_prompt(random.Random(7), model.config.vocab_size, 10)
    used = []
    hooks = [m.model.layers[0].register_forward_pre_hook(lambda *_, name=name: used.append(name))
             for name, m in (("float32", model), ("bfloat16", half))]
    plain = Kernels("bfloat16", False, False, onednn=False)
    with SpeculativeGenerator(model, head, TreeShape(8, 4, 2), plain_kernels=plain, plain_model=half) as gen:
        out = gen.vanilla(prompt, max_new_tokens=20)
        assert set(used) == {"bfloat16"} and len(out.tokens) == 20
        used.clear()
        spec = gen.generate(prompt, max_new_tokens=20)
        assert set(used) == {"float32"}
        assert spec.tokens == gen.vanilla(prompt, max_new_tokens=20, tree_kernels=True).tokens \
            == hf_greedy(model, prompt, 20)  # exact in float32, whatever plain decoding runs on
        gen.speculate = False
        used.clear()
        assert gen.generate(prompt, max_new_tokens=20).tokens == out.tokens and set(used) == {"bfloat16"}
    for hook in hooks:
        hook.remove()
    with pytest.raises(ValueError, match="plain_model needs plain_kernels"):
        SpeculativeGenerator(model, head, TreeShape(8, 4, 2), plain_model=half)
    with pytest.raises(ValueError, match="give plain_model in plain_kernels' precision"):
        SpeculativeGenerator(model, head, TreeShape(8, 4, 2), plain_kernels=Kernels("float32", False, False),
                             plain_model=half)
