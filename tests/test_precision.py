"""Precision by the hardware where nothing is measured (eagle.precision), and the fastest kernels and
tree on this machine, chosen together (mars.tuning.search): what is resolved, what a calibration record holds
and when it is found again, and that the engine and eval.run follow it. The calibration's parts, one scenario
each on a scripted clock, are tests/test_calibration.py's."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch
from helpers import OracleHead, hf_greedy, random_prompt, tiny_llama, tiny_model

from compute.kernels import packs
from eagle import Eagle3Head
from eagle import precision as P
from mars import SamplingConfig, SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape
from mars.tuning import finals, plain_race, search
from mars.tuning import record as records
from mars.tuning.candidates import CANDIDATES as CALIBRATED
from mars.tuning.candidates import SAMPLED_CANDIDATES, fixed_candidates, kernel_candidates, tree_candidates
from mars.tuning.plan import Plan
from mars.tuning.record import Calibration
from mars.tuning.search import PROFILE_UNITS, calibrate

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


def test_cpu_name_keeps_the_family_and_model_a_bare_vm_name_hides(monkeypatch):
    info = {"model name": "AMD EPYC", "cpu family": "25", "model\t": "17"}
    monkeypatch.setattr(P, "_cpuinfo", lambda *keys: next((info[k] for k in keys if k in info), None))
    assert P.cpu_name() == "AMD EPYC (Zen 4, family 25, model 17)"
    info["cpu family"], info["model\t"] = "26", "2"
    assert P.cpu_name() == "AMD EPYC (Zen 5, family 26, model 2)"
    info.update({"model name": "Intel(R) Xeon(R) Platinum 8481C", "cpu family": "6", "model\t": "143"})
    assert P.cpu_name() == "Intel(R) Xeon(R) Platinum 8481C (family 6, model 143)"
    del info["cpu family"]  # no numbers to read (not x86 Linux): the name alone
    assert P.cpu_name() == "Intel(R) Xeon(R) Platinum 8481C"


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
            out = SpeculativeGenerator(model, head, TreeShape(12, 4, 3)).generate(
                prompt, max_new_tokens=30)
            assert out.tokens == reference


CANDIDATES = (TreeShape(4, 2, 2), TreeShape(12, 4, 3), TreeShape(8, 4, 3, adaptive=True))


def tiny_pair_loader(head_seed: int = 1):
    """calibrate's `load`: the same tiny target and head in the precision asked for (and a log of the asks)."""
    asked = []

    def load(dtype: str):
        asked.append(dtype)
        model = tiny_llama(seed=0, vocab_size=16, sharpen=4.0).to(getattr(torch, dtype))
        torch.manual_seed(head_seed)
        return model, Eagle3Head.for_target(model.config).to(getattr(torch, dtype))
    return load, asked


def test_kernel_candidates_follow_the_device_the_explicit_settings_and_what_onednn_packs():
    found = kernel_candidates("cpu")
    assert {k.dtype for k in found} == {"float32", "bfloat16"}
    # exact where the precision needs it, but for plain decoding's candidate on torch's own bf16 products
    assert all(k.exact_attention == (k.dtype == "bfloat16") for k in found if k.onednn)
    assert [k for k in found if not k.onednn] == [Kernels("bfloat16", False, False, onednn=False)]
    assert {k.prepack for k in found if k.dtype == "float32"} == {True, False}  # torch here has oneDNN
    assert ({k.prepack for k in found if k.dtype == "bfloat16" and k.onednn} == {True, False}) is packs(torch.bfloat16)
    assert kernel_candidates("cpu", "float32", prepack=False) == [Kernels("float32", False, False)]
    assert {k.exact_attention for k in kernel_candidates("cpu", "bfloat16", exact_attention=False)} == {False}
    assert all(k.onednn for k in kernel_candidates("cpu", "bfloat16", prepack=True))  # packing asked for
    assert {k.prepack for k in kernel_candidates("cpu", "float32", parameters=10**15)} == {False}  # would not fit
    assert kernel_candidates("cuda") == [Kernels("bfloat16", True, False)]  # not timed on a GPU


def prompts_of(seed: int = 0, count: int = 4) -> list[torch.Tensor]:
    """Calibration prompts for the tiny pair: `count` units at batch 1 (calibration's least is PROFILE_UNITS + 1;
    one more gives the finals two held-out prompts, a pair to judge on)."""
    rng = random.Random(seed)
    return [random_prompt(rng, 16, 8) for _ in range(count)]


def plan(cache_dir: Path, trees=CANDIDATES, budget: float = 3.0, **more) -> Plan:
    """A quiet calibration of short turns within `budget` seconds from now, cached under `cache_dir`."""
    return Plan(tuple(trees), time.perf_counter() + budget, budget, **{
        "max_new_tokens": 8, "cache_dir": cache_dir, "log": lambda _: None, **more})


def strict_of(load, kernels: list[Kernels], prompts: list[torch.Tensor], how: Plan,
              sampling: SamplingConfig | None = None) -> Calibration:
    """Strict's calibration record (sampling: greedy unless given)."""
    return calibrate(load, kernels, prompts, how, {"strict": sampling or SamplingConfig()})["strict"]


def test_calibration_chooses_kernels_and_tree_together_and_caches_them(tmp_path):
    load, asked = tiny_pair_loader()
    prompts = prompts_of()
    kernels = kernel_candidates("cpu")
    first = strict_of(load, kernels, prompts, plan(tmp_path))
    assert not first.cached and set(first.identical) == {k.label for k in kernels}
    # every kernel set's parts are measured, and every one whose strict output reproduces its plain decoding is
    # predicted with the trees profiled: precision and tree are one choice
    assert {p.kernels for p in first.parts} == set(kernels)
    candidates = {k for k in kernels if first.identical[k.label]}
    assert Kernels("float32", False, False) in candidates and {p.kernels for p in first.predictions} == candidates
    assert first.profiles[0].tree == CANDIDATES[0] and {p.tree for p in first.profiles} <= set(CANDIDATES)
    # the chosen pair reproduces plain decoding and ran in the finals, where its ratio was measured
    assert first.identical[first.kernels.label] and first.tree in CANDIDATES
    assert first.label in first.finals and first.measured == first.finals[first.label]
    assert asked == ["float32", "bfloat16"]  # both held at once (they fit), loaded once
    again = strict_of(load, kernels, prompts, plan(tmp_path))
    assert again.cached and again.cache == first.cache
    assert (again.kernels, again.tree, again.reference.label) == (first.kernels, first.tree, first.reference.label)
    assert json.loads(Path(first.cache).read_text())["schema"] == records.SCHEMA
    # one kernel set and one tree from here on: each record below differs from `base` in one thing only
    base = strict_of(load, kernels[:1], prompts, plan(tmp_path, CANDIDATES[:1]))
    # as many prompts, other token ids: another record (the key hashes the prompts, not only their count)
    moved = strict_of(load, kernels[:1], prompts_of(seed=1), plan(tmp_path, CANDIDATES[:1]))
    assert not moved.cached and moved.cache != base.cache
    # sampled decoding is calibrated separately (the draft is accepted less often there)
    sampled = strict_of(load, kernels[:1], prompts, plan(tmp_path, CANDIDATES[:1]), SamplingConfig(temperature=1.0))
    assert not sampled.cached and sampled.cache != base.cache and sampled.sampling["temperature"] == 1.0
    # another model (here: other draft weights) is calibrated anew
    other, _ = tiny_pair_loader(head_seed=2)
    assert strict_of(other, kernels[:1], prompts, plan(tmp_path, CANDIDATES[:1])).cache != base.cache


def test_a_cached_record_of_another_schema_is_calibrated_again(tmp_path):
    """A record of the successive-halving calibration (schema 1, an untyped dict) is never read as a typed one:
    the calibration says so, times again and overwrites it."""
    load, _ = tiny_pair_loader()
    kernels, prompts = kernel_candidates("cpu", "float32", prepack=False), prompts_of()
    first = strict_of(load, kernels, prompts, plan(tmp_path, CANDIDATES[:1]))
    Path(first.cache).write_text(json.dumps({"kernels": vars(kernels[0]), "tree": vars(CANDIDATES[0]),
                                             "speedup_over_reference": 1.2}))
    logged: list[str] = []
    again = strict_of(load, kernels, prompts, plan(tmp_path, CANDIDATES[:1], log=logged.append))
    assert not again.cached and again.cache == first.cache
    assert any(line.startswith(f"calibration record {first.cache} is unreadable") for line in logged)
    assert records.load(Path(again.cache)).tree == again.tree  # the new schema's record in its place


def test_the_calibration_record_follows_the_weights_not_the_path_they_were_loaded_from(tmp_path):
    load, _ = tiny_pair_loader()

    def moved(dtype: str):  # the same files reached by another path (a converted GGUF under another cache)
        target, head = load(dtype)
        target.config._name_or_path = str(tmp_path / "elsewhere" / "model")
        return target, head

    def retrained(dtype: str):  # one inner layer changed; the configuration and the output layer are not
        target, head = load(dtype)
        with torch.no_grad():
            target.model.layers[0].mlp.up_proj.weight.mul_(1.01)
        return target, head

    kernels, prompts = kernel_candidates("cpu", "float32", prepack=False), prompts_of()

    def record(loader) -> Calibration:
        return strict_of(loader, kernels, prompts, plan(tmp_path, CANDIDATES[:1]))
    first = record(load)
    assert not first.cached
    again = record(moved)
    assert again.cached and again.cache == first.cache
    other = record(retrained)
    assert not other.cached and other.cache != first.cache


def test_the_calibration_key_ignores_load_paths_at_any_depth_of_the_configuration():
    """A composite model's sub-configuration carries its own `_name_or_path`: another path is the same key,
    another setting in it is not."""
    from transformers import PretrainedConfig

    from mars.tuning.record import fingerprint

    target, head = tiny_pair_loader()[0]("float32")
    target.config.vision_config = PretrainedConfig(name_or_path="/somewhere/vision")
    nested = fingerprint(target, head)
    target.config.vision_config = PretrainedConfig(name_or_path="/elsewhere/vision")
    assert fingerprint(target, head) == nested
    target.config.vision_config = PretrainedConfig(name_or_path="/elsewhere/vision", patch_size=7)
    assert fingerprint(target, head) != nested


def test_calibration_never_times_kernels_whose_strict_output_differs_from_plain_decoding(tmp_path, monkeypatch):
    """Kernels whose strict greedy output differed from their plain decoding are no candidates for the trees:
    no tree is profiled, predicted or timed at them; their plain decoding still races, and the run's precision
    reason says why they were left out."""
    from eval.runner.job_settings import kernels_reason

    real = search.check_kernels

    def packed_is_wrong(gens, *args, **kwargs):
        found = real(gens, *args, **kwargs)
        return {k.label: found[k.label] and not k.prepack for k in gens}

    monkeypatch.setattr(search, "check_kernels", packed_is_wrong)
    load, _ = tiny_pair_loader()
    packed, unpacked = Kernels("float32", False, True), Kernels("float32", False, False)
    fixed = TreeShape(8, 4, 2)
    record = strict_of(load, [packed, unpacked], prompts_of(),
                       plan(tmp_path, fixed_candidates(fixed, sampled=False), forced=True))
    assert record.kernels == unpacked and record.tree == TreeShape(8, 4, 2, drafting="topk") and record.forced
    assert record.identical == {packed.label: False, unpacked.label: True}
    assert all(p.kernels != packed for p in record.predictions) and record.predictions
    assert all(p.kernels != packed for p in record.profiles)
    assert not any(label.startswith(f"{packed.label} ") for label in record.finals) and record.finals
    assert f"vanilla {packed.label}" in {p.label for p in record.plains}  # a candidate for the fastest plain decoding
    assert f"{packed.label} no candidate (its strict output differed from its plain decoding)" in kernels_reason(
        record, record.kernels, [packed])


def test_a_batched_calibration_times_batches_as_its_units(tmp_path, monkeypatch):
    """At batch B a unit is B prompts decoded together: calibration takes the first UNITS * B prompts, every
    timed block decodes a whole batch, and the record's paired figures count batches, so a batched prediction
    rests on as many units as batch 1's. The prompts past them are neither timed nor in the key."""
    monkeypatch.setattr(search, "UNITS", 4)
    blocks: list[list[torch.Tensor]] = []
    for module in (plain_race, finals):  # the plain race's blocks and the finals'
        real = module.time_block
        monkeypatch.setattr(module, "time_block", lambda contenders, unit, *rest, real=real:
                            blocks.append(unit) or real(contenders, unit, *rest))
    load, _ = tiny_pair_loader()
    prompts, kernels = prompts_of(count=10), kernel_candidates("cpu", "float32", prepack=False)
    record = strict_of(load, kernels, prompts, plan(tmp_path, CANDIDATES[:1], batch=2))
    assert record.batch == 2 and blocks and all(len(unit) == 2 for unit in blocks)
    assert {id(p) for unit in blocks for p in unit} <= {id(p) for p in prompts[:8]}  # 4 batches of 2
    assert record.measured.pairs == 4 - PROFILE_UNITS  # the held-out batches
    assert strict_of(load, kernels, prompts[:8], plan(tmp_path, CANDIDATES[:1], batch=2)).cached  # the same record


def test_a_batched_calibration_leaves_out_the_trees_batched_decoding_cannot_draft(tmp_path):
    """Batched decoding drafts fixed-size trees (`SpeculativeGenerator.check_batching`): at batch 2 the adaptive
    candidate, which every default candidate list holds (`mars.tuning.candidates.CANDIDATES`), is no candidate."""
    load, _ = tiny_pair_loader()
    adaptive = next(t for t in CANDIDATES if t.adaptive)
    record = strict_of(load, kernel_candidates("cpu", "float32", prepack=False), prompts_of(count=8),
                       plan(tmp_path, (CANDIDATES[0], adaptive), batch=2))
    assert record.tree.batchable and all(p.tree.batchable for p in record.profiles)


@pytest.mark.parametrize("bound", [0.0, float("inf")], ids=["cannot win", "can win"])
def test_a_tree_whose_bound_cannot_win_is_skipped_after_the_first_profiles(tmp_path, monkeypatch, bound):
    """The first MIN_PROFILES trees are profiled whatever their bound (a close call under load must not skip the
    second of a user's two drafting modes); after them a tree whose every-draft-accepted bound is below the best
    prediction so far is skipped."""
    monkeypatch.setattr(search, "speed_bound", lambda parts, tree, overhead: bound)
    trees = CANDIDATES[: search.MIN_PROFILES + 1]
    kernels = [Kernels("float32", False, False)]
    record = strict_of(tiny_pair_loader()[0], kernels, prompts_of(), plan(tmp_path, trees, budget=60.0))
    profiled = [p.tree for p in record.profiles]
    assert profiled == (list(trees[: search.MIN_PROFILES]) if bound == 0.0 else list(trees))


def test_a_spent_budget_still_profiles_the_chains_and_the_first_branching_tree(tmp_path):
    """Past the profiles' deadline the search still profiles the prior's first MIN_PROFILES trees, which reach its
    first branching tree (where a relaxed rule's longer accepted paths may pay), and no tree after them."""
    trees = CALIBRATED[: search.MIN_PROFILES + 2]  # the shipped prior
    record = strict_of(tiny_pair_loader()[0], [Kernels("float32", False, False)], prompts_of(),
                       plan(tmp_path, trees, budget=0.0))
    profiled = [p.tree for p in record.profiles]
    assert profiled == list(trees[: search.MIN_PROFILES])
    assert any(t.branching > 1 for t in profiled), "no branching tree among the trees a spent budget profiles"


def test_sampled_calibration_predicts_both_drafting_modes_and_keeps_one(tmp_path):
    """tree.drafting=auto when sampling: a fixed tree is a candidate with top-k drafts and with sampled children,
    both profiled and predicted, and the record's tree is one of them; drafting="sample" only sampled children;
    greedy calibrations top-k only."""
    load, _ = tiny_pair_loader()
    prompts, kernels = prompts_of(), [Kernels("float32", False, False)]
    fixed, t1 = TreeShape(8, 4, 2), SamplingConfig(temperature=1.0)

    def drafted(sampling: SamplingConfig, tree: TreeShape, drafting: str = "auto") -> Calibration:
        candidates = fixed_candidates(tree, not sampling.greedy, drafting)
        return strict_of(load, kernels, prompts, plan(tmp_path, candidates, forced=True, drafting=drafting), sampling)

    both = drafted(t1, fixed)
    assert {p.tree.drafting for p in both.predictions} == {"sample", "topk"}
    assert {p.tree.label for p in both.predictions} == {"8/4/2", "8/4/2 sampled"}
    assert both.tree in {p.tree for p in both.predictions}
    only = drafted(t1, fixed, "sample")
    assert only.tree.drafting == "sample" and {p.tree.drafting for p in only.predictions} == {"sample"}
    greedy = drafted(SamplingConfig(), fixed.sampled())
    assert greedy.tree.drafting == "topk" and {p.tree.label for p in greedy.predictions} == {"8/4/2"}
    assert tree_candidates(True, "auto") == SAMPLED_CANDIDATES + CALIBRATED  # sampled first: the better prior
    assert tree_candidates(False, "sample") == CALIBRATED and tree_candidates(True, "topk") == CALIBRATED
    with pytest.raises(ValueError, match="a sampled tree's shape must not depend on its draws"):
        TreeShape(20, 6, 5, adaptive=True, drafting="sample")
