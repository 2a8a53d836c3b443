"""Precision and exactness chosen by the hardware (eagle.precision), and the fastest tree on this
machine (mars.calibrate): what is resolved, and that the engine and eval.run follow it."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import OracleHead, hf_greedy, random_prompt, tiny_generator, tiny_model

from eagle import Eagle3Head
from eagle import precision as P
from mars import SamplingConfig, SpeculativeGenerator
from mars.calibrate import TreeShape, calibrate_tree

pytestmark = pytest.mark.usefixtures("single_thread")


def as_cpu(monkeypatch, capability: str, flags: set[str]) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(P, "cpu_flags", lambda: flags)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


def test_auto_is_bf16_only_where_the_cpu_has_native_bf16_matmuls(monkeypatch):
    as_cpu(monkeypatch, "AVX2", {"avx2", "fma"})
    got = P.resolve_dtype("auto", "cpu")
    assert got.dtype == torch.float32 and "AVX2" in got.reason and got.name == "float32"
    as_cpu(monkeypatch, "AVX512", {"avx512f", "avx512bw"})  # AVX-512 without its bf16 extension
    assert P.resolve_dtype("auto").dtype == torch.float32
    as_cpu(monkeypatch, "AVX512", {"avx512f", "avx512_bf16"})
    got = P.resolve_dtype("auto")
    assert got.dtype == torch.bfloat16 and "avx512_bf16" in got.reason
    as_cpu(monkeypatch, "AMX", {"amx_bf16", "amx_tile"})
    assert P.resolve_dtype("auto").dtype == torch.bfloat16


def test_auto_honours_limits_set_on_torch_and_onednn(monkeypatch):
    as_cpu(monkeypatch, "AVX512", {"avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    got = P.resolve_dtype("auto")
    assert got.dtype == torch.float32 and "ONEDNN_MAX_CPU_ISA=AVX2" in got.reason
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert P.resolve_dtype("auto").dtype == torch.bfloat16
    as_cpu(monkeypatch, "AVX2", {"avx512_bf16"})  # ATEN_CPU_CAPABILITY=avx2 on a bigger CPU
    assert P.resolve_dtype("auto").dtype == torch.float32


def test_explicit_dtypes_win_and_gpus_get_bf16(monkeypatch):
    as_cpu(monkeypatch, "AVX2", set())
    assert P.resolve_dtype("bfloat16").dtype == torch.bfloat16
    assert P.resolve_dtype("bfloat16").reason == "set explicitly"
    assert P.resolve_dtype(torch.float16).dtype == torch.float16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.resolve_dtype("auto", "cuda:1").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        P.resolve_dtype("fp8")


def test_exact_attention_auto_follows_the_target_precision():
    model = tiny_model("llama")
    head = Eagle3Head.for_target(model.config)
    assert SpeculativeGenerator(model, head).target.exact_attention is False  # float32
    bf16 = tiny_model("llama").to(torch.bfloat16)
    with SpeculativeGenerator(bf16, Eagle3Head.for_target(bf16.config).to(torch.bfloat16)) as gen:
        assert gen.target.exact_attention is True
        assert bf16.config._attn_implementation == "mars_exact"
    assert bf16.config._attn_implementation != "mars_exact"  # handed back
    # a sliding-window model cannot take exact attention: auto leaves it off instead of refusing
    mistral = tiny_model("mistral").to(torch.bfloat16)
    head = Eagle3Head.for_target(mistral.config).to(torch.bfloat16)
    assert SpeculativeGenerator(mistral, head).target.exact_attention is False
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        SpeculativeGenerator(model, Eagle3Head.for_target(model.config), exact_attention="yes")


def test_auto_strict_greedy_equals_plain_greedy_in_float32():
    """The float32 path auto chooses (no exact attention) still gives plain greedy decoding's tokens."""
    rng = random.Random(3)
    for seed in range(3):
        model = tiny_model("llama", seed=seed)
        prompt = random_prompt(rng, model.config.vocab_size, 12)
        reference = hf_greedy(model, prompt, 30)
        oracle = OracleHead(model.config, prompt[0].tolist() + reference)
        for head in (oracle, Eagle3Head.for_target(model.config)):
            out = SpeculativeGenerator(model, head, total_tokens=12, depth=4, branching=3).generate(
                prompt, max_new_tokens=30)
            assert out.tokens == reference


CANDIDATES = (TreeShape(4, 2, 2), TreeShape(12, 4, 3), TreeShape(8, 4, 3, adaptive=True))


def test_calibration_picks_a_candidate_caches_it_and_leaves_the_generator_as_it_was(tmp_path):
    gen = tiny_generator(0, 1, sharpen=4.0, total_tokens=20, depth=5, branching=4)
    rng = random.Random(0)
    prompts = [random_prompt(rng, 16, 8) for _ in range(2)]
    greedy = SamplingConfig()
    first = calibrate_tree(gen, prompts, greedy, CANDIDATES, max_new_tokens=12, rounds=1, cache_dir=tmp_path,
                           log=lambda _: None)
    assert TreeShape(**first["tree"]) in CANDIDATES and not first["cached"]
    labels = {c.label for c in CANDIDATES} | {"plain"}
    assert set(first["tokens_per_s"]) == labels and all(v > 0 for v in first["tokens_per_s"].values())
    best = max(CANDIDATES, key=lambda c: first["tokens_per_s"][c.label])
    assert first["tree"] == {**best.__dict__}
    assert (gen.total_tokens, gen.depth, gen.branching, gen.adaptive) == (20, 5, 4, False)
    assert gen._policy() is None  # the adaptive candidate's policy does not leak into fixed-tree decoding
    again = calibrate_tree(gen, prompts, greedy, CANDIDATES, cache_dir=tmp_path, log=lambda _: None)
    assert again["cached"] and again["tree"] == first["tree"] and again["cache"] == first["cache"]
    assert json.loads(open(first["cache"]).read())["tokens_per_s"] == first["tokens_per_s"]
    # sampled decoding is calibrated separately (the draft is accepted less often there)
    sampled = calibrate_tree(gen, prompts, SamplingConfig(temperature=1.0), CANDIDATES, max_new_tokens=12,
                             rounds=1, cache_dir=tmp_path, log=lambda _: None)
    assert not sampled["cached"] and sampled["cache"] != first["cache"] and sampled["sampled"]
    # another model (here: other draft weights) is calibrated anew
    other = tiny_generator(0, 2, sharpen=4.0)
    assert calibrate_tree(other, prompts, greedy, CANDIDATES, max_new_tokens=12, rounds=1, cache_dir=tmp_path,
                          log=lambda _: None)["cache"] != first["cache"]
