"""Prepacked float32 linears (eagle.kernels): used only inside the generator's calls, the same
products up to rounding, row-invariant, refreshed when weights change, chosen by what fits."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import hf_greedy, random_prompt, tiny_model

from eagle import Eagle3Head
from eagle import kernels as K
from mars import SpeculativeGenerator

pytestmark = pytest.mark.usefixtures("single_thread")


def linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def test_packed_products_match_torch_and_do_not_depend_on_the_number_of_rows():
    torch.manual_seed(0)
    layer = torch.nn.Linear(384, 1024, bias=True)
    x = torch.randn(1, 21, 384)
    with torch.inference_mode():
        reference = layer(x)
        with K.PackedLinears(layer).active():
            packed = layer(x)
            rows = torch.cat([layer(x[:, i : i + 1]) for i in range(x.shape[1])], dim=1)
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(packed, rows)  # a row's product is the same alone or among 21


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
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-5)


def test_choice_follows_the_request_the_dtype_and_the_memory(monkeypatch):
    model = tiny_model("llama")
    assert K.choose_packing([model], "auto")[0] is True
    assert K.choose_packing([model], False) == (False, "off (requested)")
    assert K.choose_packing([model.to(torch.bfloat16)], "auto") == (False, "off: no float32 CPU linear layers")
    model = model.float()
    monkeypatch.setattr(K, "available_memory", lambda: 1000)  # a copy of the weights would not fit
    use, why = K.choose_packing([model], "auto")
    assert not use and "available memory" in why
    assert K.choose_packing([model], True)[0] is True  # asked for explicitly: packed anyway
    with pytest.raises(ValueError, match="prepack must be"):
        K.choose_packing([model], "yes")


def test_generator_packs_inside_its_calls_and_strict_greedy_still_equals_plain_greedy(monkeypatch):
    model = tiny_model("qwen2")
    torch.manual_seed(1)
    head = Eagle3Head.for_target(model.config)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    expected = hf_greedy(model, prompt, 40)
    with SpeculativeGenerator(model, head, total_tokens=12, depth=4, branching=3) as gen:
        assert gen.prepack and "auto" in gen.prepack_reason
        seen, original = [], K._packed_forward
        monkeypatch.setattr(K, "_packed_forward", lambda *a: seen.append(1) or original(*a))
        out = gen.generate(prompt, max_new_tokens=40)
        monkeypatch.undo()
        assert seen, "the decoding loop did not use the packed products"
        assert not any("forward" in vars(m) for m in linears(model) + linears(head))
        assert out.tokens == expected
        assert hf_greedy(model, prompt, 40) == expected  # model.generate after the call: torch's own kernels
    with SpeculativeGenerator(model, head, total_tokens=12, depth=4, branching=3, prepack=False) as gen:
        assert gen.kernels is None and gen.generate(prompt, max_new_tokens=40).tokens == expected
