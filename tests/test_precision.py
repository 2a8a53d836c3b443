"""Precision by the hardware where nothing is measured (eagle.precision), and the fastest kernels and
tree on this machine, measured together (mars.tuning.calibrate): what is resolved, and that the engine and
eval.run follow it."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import OracleHead, hf_greedy, random_prompt, tiny_llama, tiny_model

from eagle import Eagle3Head
from eagle import precision as P
from eagle.kernels import packs
from mars import SamplingConfig, SpeculativeGenerator
from mars.tuning.calibrate import CANDIDATES as CALIBRATED
from mars.tuning.calibrate import (
    SAMPLED_CANDIDATES,
    Kernels,
    TreeShape,
    calibrate,
    kernel_candidates,
    tree_candidates,
)

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


def test_calibration_chooses_kernels_and_tree_together_and_caches_them(tmp_path):
    load, asked = tiny_pair_loader()
    rng = random.Random(0)
    prompts = [random_prompt(rng, 16, 8) for _ in range(2)]
    kernels = kernel_candidates("cpu")
    first = calibrate(load, kernels, prompts, SamplingConfig(), CANDIDATES, max_new_tokens=12, cache_dir=tmp_path,
                      log=lambda _: None)
    assert not first["cached"] and set(first["kernel_candidates"]) == {k.label for k in kernels}
    figures = first["kernel_candidates"]
    # the chosen kernels reproduce plain decoding; every kernels x tree pair was timed (precision and tree
    # are searched together); the chosen pair was never dropped and is the fastest of those timed as long
    chosen, tree = Kernels(**first["kernels"]), TreeShape(**first["tree"])
    assert figures[chosen.label]["identical"] and tree in CANDIDATES
    timed = first["timed_prompts"]
    assert set(timed) == {f"{k.label} {t.label}" for k in kernels for t in CANDIDATES} and min(timed.values()) >= 1
    label = f"{chosen.label} {tree.label}"
    assert label not in first["dropped"] and timed[label] == max(timed.values())
    speed = {f"{k} {t}": v for k, f in figures.items() for t, v in f["trees"].items()}
    # the survivors timed as long: slower than the chosen pair, or tied with it (the cheaper cycle wins a tie)
    tied = set((first["tied"] or {}).get("candidates", []))
    assert all(speed[c] <= speed[label] or c in tied for c, n in timed.items() if n == timed[label])
    assert all(d["tokens_per_s"] < d["best_tokens_per_s"] for d in first["dropped"].values())
    assert first["fastest_plain"]["kernels"] in figures and first["rounds"][0]["candidates"] == len(timed)
    assert asked == ["float32", "bfloat16"]  # both held at once (they fit), timed interleaved, loaded once
    again = calibrate(load, kernels, prompts, SamplingConfig(), CANDIDATES, max_new_tokens=12, cache_dir=tmp_path,
                      log=lambda _: None)
    assert again["cached"] and again["kernels"] == first["kernels"] and again["tree"] == first["tree"]
    assert json.loads(open(first["cache"]).read())["tokens_per_s"] == first["tokens_per_s"]
    # as many prompts, other token ids: another record (the key hashes the prompts, not only their count)
    others = [random_prompt(rng, 16, 8) for _ in range(2)]
    moved = calibrate(load, kernels[:1], others, SamplingConfig(), CANDIDATES[:1], max_new_tokens=12,
                      cache_dir=tmp_path, log=lambda _: None)
    assert not moved["cached"] and moved["cache"] != first["cache"]
    # sampled decoding is calibrated separately (the draft is accepted less often there)
    sampled = calibrate(load, kernels, prompts, SamplingConfig(temperature=1.0), CANDIDATES, max_new_tokens=12,
                        cache_dir=tmp_path, log=lambda _: None)
    assert not sampled["cached"] and sampled["cache"] != first["cache"] and sampled["sampled"]
    # another model (here: other draft weights) is calibrated anew
    other, _ = tiny_pair_loader(head_seed=2)
    assert calibrate(other, kernels[:1], prompts, SamplingConfig(), CANDIDATES, max_new_tokens=12, cache_dir=tmp_path,
                     log=lambda _: None)["cache"] != first["cache"]


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

    kernels, prompts = kernel_candidates("cpu", "float32", prepack=False), [random_prompt(random.Random(0), 16, 8)]

    def record(loader) -> dict:
        return calibrate(loader, kernels, prompts, SamplingConfig(), CANDIDATES[:1], max_new_tokens=8,
                         cache_dir=tmp_path, log=lambda _: None)
    first = record(load)
    assert not first["cached"]
    again = record(moved)
    assert again["cached"] and again["cache"] == first["cache"]
    other = record(retrained)
    assert not other["cached"] and other["cache"] != first["cache"]


def test_the_calibration_key_ignores_load_paths_at_any_depth_of_the_configuration():
    """A composite model's sub-configuration carries its own `_name_or_path`: another path is the same key,
    another setting in it is not."""
    from transformers import PretrainedConfig

    from mars.tuning.calibrate import fingerprint

    target, head = tiny_pair_loader()[0]("float32")
    target.config.vision_config = PretrainedConfig(name_or_path="/somewhere/vision")
    nested = fingerprint(target, head)
    target.config.vision_config = PretrainedConfig(name_or_path="/elsewhere/vision")
    assert fingerprint(target, head) == nested
    target.config.vision_config = PretrainedConfig(name_or_path="/elsewhere/vision", patch_size=7)
    assert fingerprint(target, head) != nested


def test_calibration_never_times_kernels_whose_strict_output_differs_from_plain_decoding(tmp_path, monkeypatch):
    """Kernels whose strict greedy output differed from their plain decoding are not candidates."""
    from mars.tuning import calibrate as C

    real = C.check_kernels

    def packed_is_wrong(gens, *args, **kwargs):
        return {k: ok and not k.prepack for k, ok in real(gens, *args, **kwargs).items()}

    monkeypatch.setattr(C, "check_kernels", packed_is_wrong)
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(0), 16, 8)]
    kernels = [Kernels("float32", False, True), Kernels("float32", False, False)]
    record = calibrate(load, kernels, prompts, SamplingConfig(), None, fixed_tree=TreeShape(8, 4, 2),
                       max_new_tokens=8, cache_dir=tmp_path, log=lambda _: None)
    assert record["kernels"] == {"dtype": "float32", "exact_attention": False, "prepack": False, "onednn": True}
    # no tree timed at them; their plain decoding is, as a candidate for the fastest plain decoding
    packed = record["kernel_candidates"]["float32+packed"]
    assert (packed["trees"], packed["identical"]) == ({}, False) and packed["plain"] > 0
    from eval.runner.settings import untimed_why
    assert untimed_why(record, "float32+packed") == "its output differed from plain decoding"
    assert record["kernels_reproduce_plain"] and record["tree"] == {**TreeShape(8, 4, 2, drafting="topk").__dict__}


def test_a_lone_survivor_ends_the_search_and_is_timed_on_the_prompts_kept_for_its_prediction(tmp_path, monkeypatch):
    """One tree far ahead after the first prompt wins the halving at once: the search ends there (what is left of
    the budget goes to the calibrations after it), and the winner's prediction still rests on more than that one
    prompt, the ones kept for it (`Halving.confirm`)."""
    from mars.tuning import calibrate as C

    real = C.decode

    def one_tree_is_fast(gen, plain, *args, **kwargs):
        tokens, seconds = real(gen, plain, *args, **kwargs)
        return tokens, seconds * (1 if plain or gen.tree.label == CALIBRATED[0].label else 10)

    monkeypatch.setattr(C, "decode", one_tree_is_fast)
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(8)]
    record = calibrate(load, [Kernels("float32", False, False)], prompts, SamplingConfig(), CALIBRATED,
                       max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None, progress=False)
    assert TreeShape(**record["tree"]) == CALIBRATED[0]
    assert [(r["prompts"], r["kept"], r.get("for")) for r in record["rounds"]] == [(1, 1, None), (4, 1, "prediction")]
    assert record["timed_prompts"][f"float32 {CALIBRATED[0].label}"] == 1 + 4
    assert record["prediction"]["prompts"] == 4 and record["spread"]["prompts"] == 4


def test_a_batched_calibration_times_as_many_batches_as_batch_one_times_prompts(tmp_path, monkeypatch):
    """At batch B calibration takes the first UNITS * B prompts, UNITS batches, so a batched prediction rests on as
    many units as B = 1's (from the 24 prompts B = 1 takes, B = 4's rested on 3 batches, +-11%, and could not tell
    4/4/1's 1.13x from plain decoding). The prompts past them are neither timed nor in the key."""
    from mars.tuning import calibrate as C

    monkeypatch.setattr(C, "UNITS", 6)
    monkeypatch.setattr(C, "PREDICTION_UNITS", 3)
    real, seen = C.decode, set()

    def spy(gen, plain, group, *args, **kwargs):
        seen.update(id(p) for p in group)
        return real(gen, plain, group, *args, **kwargs)

    monkeypatch.setattr(C, "decode", spy)
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(16)]

    def at(batch: int, given: list[torch.Tensor], cache: str) -> dict:
        return calibrate(load, [Kernels("float32", False, False)], given, SamplingConfig(), CALIBRATED[:2],
                         max_new_tokens=8, cache_dir=tmp_path / cache, log=lambda _: None, progress=False,
                         batch=batch, budget=0.0)

    two = at(2, prompts, "two")
    assert seen <= {id(p) for p in prompts[:12]}  # 6 batches of 2
    assert {id(p) for p in prompts[6:12]} <= seen  # the last 3 of them held out for the prediction
    assert two["prediction"]["prompts"] == 3 and two["spread"]["prompts"] == 3 and two["prompts"] == 12
    one = at(1, prompts, "one")
    assert one["prediction"]["prompts"] == 3 and one["prompts"] == 6
    assert at(1, prompts[:6], "one")["cached"]  # the same 6 prompts timed: the same record


def clocked(monkeypatch, speed_of) -> None:
    """Calibration's timer made a clock: each decode really runs (its tokens are real) but takes
    tokens / speed_of(tree) seconds (tree None: plain decoding), so which arms a round keeps is the rule's
    alone; the tiny pair's real timings differ by less than one prompt's noise (CI's AVX2 pass kept 8 of 13)."""
    from mars.tuning import calibrate as C

    real = C.decode

    def decode(gen, plain, *args, **kwargs):
        tokens, _ = real(gen, plain, *args, **kwargs)
        return tokens, sum(map(len, tokens)) / speed_of(None if plain else gen.tree)

    monkeypatch.setattr(C, "decode", decode)


def test_arms_tied_with_the_fastest_go_on_past_the_half_until_more_prompts_settle_them(tmp_path, monkeypatch):
    """Halving keeps at most half of the arms; two left within the tie band of each other would be split by one
    prompt's noise (the embedded pair's MARS: 8/8/1 dropped 0.3% behind 6/6/1 after 7 timed prompts, then ran 6% faster
    on the 64 held-out ones). Tied arms go on, on more prompts, until the search's prompts or budget run
    out; then the tie goes to the cheaper cycle (`chosen`). Speeds here are set per tree, so the test is exact."""
    deep, chain = CALIBRATED[2], CALIBRATED[1]  # 8/8/1 and 6/6/1: the deeper chain 0.5% faster
    speed = {deep.label: 100.0, chain.label: 99.5}
    clocked(monkeypatch, lambda tree: 50.0 if tree is None else speed.get(tree.label, 10.0))
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(16)]  # 8 for the search, 8 kept
    record = calibrate(load, [Kernels("float32", False, False)], prompts, SamplingConfig(), CALIBRATED,
                       max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None, progress=False)
    search = [(r["prompts"], r["kept"]) for r in record["rounds"] if "for" not in r]
    assert search == [(1, 2), (2, 2), (4, 2), (8, 2)]  # both on, round after round (halving alone: (2, 1) in round 2)
    assert f"float32 {chain.label}" not in record["dropped"] and f"float32 {deep.label}" not in record["dropped"]
    assert record["timed_prompts"][f"float32 {deep.label}"] == 15 and record["tied"]["candidates"] == [
        f"float32 {chain.label}", f"float32 {deep.label}"]
    assert TreeShape(**record["tree"]) == chain  # tied after 15 prompts: the cheaper cycle


def test_a_winners_prediction_rests_only_on_prompts_the_search_never_timed(tmp_path, monkeypatch):
    """The prompts that chose a winner flatter it (the fastest of many candidates on a prompt was also the luckiest
    there): its prediction, speedup and spread come from prompts kept for it, which the search never times. Here
    every tree runs 4x faster on the first prompt, the one the search chose on; the prediction does not see it."""
    from mars.tuning import calibrate as C

    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(6)]
    real = C.decode

    def lucky_first_prompt(gen, plain, group, *args, **kwargs):
        tokens, seconds = real(gen, plain, group, *args, **kwargs)
        return tokens, seconds / (4 if not plain and group[0] is prompts[0] else 1)

    monkeypatch.setattr(C, "decode", lucky_first_prompt)
    monkeypatch.setattr(C, "PREDICTION_UNITS", 3)
    record = calibrate(load, [Kernels("float32", False, False)], prompts, SamplingConfig(), CALIBRATED,
                       max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None, progress=False, budget=0.0)
    winner = f"float32 {TreeShape(**record['tree']).label}"
    assert record["timed_prompts"][winner] == 4  # chosen on the first prompt, then the last three
    prediction = record["prediction"]
    assert prediction["prompts"] == 3 and prediction["tree"] == winner
    # the search's speedup is the lucky one; the prediction's, on the last three prompts, is not
    assert prediction["search_speedup"] > 2 * record["speedup_over_reference"]
    assert record["tokens_per_s"][TreeShape(**record["tree"]).label] > prediction["tokens_per_s"]
    reference = record["reference"]
    assert reference["tokens_per_s"] == prediction["plains"][reference["label"]]
    assert record["speedup_over_reference"] == pytest.approx(prediction["tokens_per_s"] / reference["tokens_per_s"],
                                                             rel=0.01)
    assert C.speedup_over_reference(record)[0] == pytest.approx(record["speedup_over_reference"], rel=0.01)
    assert record["spread"]["prompts"] == 3


def test_a_winners_prediction_past_the_budget_is_not_taken_from_the_next_calibrations_share():
    """Strict's calibration times its winner past its share for the prediction (`Halving.confirm`); the rules'
    calibrations after it still get theirs (on SmolLM2 on an AVX2-only EPYC, MARS's got 0 s before this)."""
    from mars.tuning.calibrate import Budget

    shares = Budget(100.0, [1, 1])
    assert shares.next() == pytest.approx(50.0, abs=1.0)
    shares.extend({"cached": False, "prediction_s": 30.0})
    assert shares.next() == pytest.approx(130.0, abs=1.0)  # nothing was really spent here: all that is left
    cached = Budget(100.0, [1, 1])
    cached.next()
    cached.extend({"cached": True, "prediction_s": 30.0})  # a cached record spent nothing now
    assert cached.next() == pytest.approx(100.0, abs=1.0)


def test_calibration_drops_clearly_slower_candidates_early_and_keeps_to_its_budget(tmp_path, monkeypatch):
    from mars.tuning.calibrate import SLACK, TIE

    def speed_of(tree: TreeShape | None) -> float:  # tok/s: the trees 4% apart in CANDIDATES' order, wide ones 3x slow
        if tree is None:
            return 100.0
        return (150.0 - 6.0 * CALIBRATED.index(tree)) / (3 if tree.total_tokens >= 32 else 1)

    clocked(monkeypatch, speed_of)
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(4)]
    kernels = [Kernels("float32", False, False)]
    record = calibrate(load, kernels, prompts, SamplingConfig(), CALIBRATED, max_new_tokens=12, cache_dir=tmp_path,
                       log=lambda _: None, progress=False)
    wide = [f"float32 {t.label}" for t in CALIBRATED if t.total_tokens >= 32]
    assert all(record["dropped"][c]["round"] == 1 and record["dropped"][c]["prompts"] == 1 for c in wide)
    search = [r["prompts"] for r in record["rounds"] if "for" not in r]  # the halving's own rounds
    assert search == [1, 2, 4][: len(search)]
    # after one prompt: the faster half within SLACK of the fastest, and any within the tie band past the half
    ranked = sorted(CALIBRATED, key=speed_of, reverse=True)
    best = speed_of(ranked[0])
    half = {t for t in ranked[: -(-len(ranked) // 2)] if speed_of(t) >= (1 - SLACK) * best}
    banded = {t for t in ranked if speed_of(t) >= (1 - TIE * SLACK) * best}
    first = {f"float32 {t.label}" for t in CALIBRATED} - {c for c, d in record["dropped"].items() if d["round"] == 1}
    assert first == {f"float32 {t.label}" for t in half | banded} and len(first) <= -(-len(CALIBRATED) // 2)
    assert record["rounds"][0]["kept"] == len(first) and TreeShape(**record["tree"]) == ranked[0]
    # A budget spent before the first round ends: the first candidate (a chain) is timed, the rest dropped untimed.
    spent = calibrate(load, kernels, prompts, SamplingConfig(), CALIBRATED, max_new_tokens=12,
                      cache_dir=tmp_path / "spent", log=lambda _: None, progress=False, budget=0.0)
    assert [r.get("for") for r in spent["rounds"]] == [None, "prediction"] and not spent["cached"]
    assert spent["budget_s"] == 0.0
    assert TreeShape(**spent["tree"]) == CALIBRATED[0] and len(spent["dropped"]) == len(CALIBRATED) - 1
    # The search stopped at one prompt, the winner's prediction did not: it and plain decoding were timed, past the
    # budget, on the prompts kept for it (half of them here, fewer than PREDICTION_UNITS), so its spread has more
    # than one prompt to go on
    assert spent["timed_prompts"][f"float32 {CALIBRATED[0].label}"] == 1 + len(prompts) // 2
    assert spent["spread"]["prompts"] == len(prompts) // 2 and spent["prediction_s"] > 0
    assert spent["prediction"]["prompts"] == len(prompts) // 2
    assert all(d["reason"] == "not timed within the budget" for d in spent["dropped"].values())
    # and the settings' reasons say so, instead of "the fastest of 13 candidates"
    from eval.runner.settings import measured_of
    tied = record["tied"]  # 4/4/1 and 6/6/1 are 4% apart: a tie after few prompts, which the smaller wins
    chosen = "the fastest" if tied is None else (f"the smallest tree of {len(tied['candidates'])} candidates tied "
                                                 f"for fastest (within {100 * tied['within']:.1f}%)")
    if tied:  # "float32 8/4/2", "float32 20/6/5 adaptive": fixed trees before the adaptive one, then the fewest rows
        trees = [label.split(" ", 1)[1] for label in tied["candidates"]]
        assert TreeShape(**record["tree"]).label in trees
        fixed = [int(t.split("/")[0]) for t in trees if not t.endswith("adaptive")]
        assert not fixed or min(fixed) == record["tree"]["total_tokens"]
    assert measured_of(record, len(CALIBRATED)) == f"{chosen} of {len(CALIBRATED)} candidates"
    assert measured_of(spent, len(CALIBRATED)) == (
        f"the fastest timed of {len(CALIBRATED)} candidates ({len(CALIBRATED) - 1} of {len(CALIBRATED)} candidate "
        "runs not timed within the 0 s budget)")


def test_sampled_calibration_times_both_drafting_modes_and_keeps_the_faster(tmp_path):
    """tree.drafting=auto when sampling: the fixed tree is timed with top-k and with sampled children,
    and the record's tree is the faster of the two; greedy calibrations time top-k only."""
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(0), 16, 8) for _ in range(2)]
    kernels = [Kernels("float32", False, False)]
    fixed = TreeShape(8, 4, 2)
    sampled = calibrate(load, kernels, prompts, SamplingConfig(temperature=1.0), None, fixed_tree=fixed,
                        max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None)
    speeds = sampled["kernel_candidates"]["float32"]["trees"]
    assert set(speeds) == {"8/4/2", "8/4/2 sampled"}
    assert TreeShape(**sampled["tree"]).label == max(speeds, key=speeds.get)
    greedy = calibrate(load, kernels, prompts, SamplingConfig(), None, fixed_tree=fixed.sampled(),
                       max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None)
    assert set(greedy["kernel_candidates"]["float32"]["trees"]) == {"8/4/2"} and greedy["tree"]["drafting"] == "topk"
    only = calibrate(load, kernels, prompts, SamplingConfig(temperature=1.0), None, fixed_tree=fixed,
                     max_new_tokens=12, cache_dir=tmp_path, log=lambda _: None, drafting="sample")
    assert only["tree"]["drafting"] == "sample" and set(only["kernel_candidates"]["float32"]["trees"]) == {
        "8/4/2 sampled"}
    assert tree_candidates(True, "auto") == SAMPLED_CANDIDATES + CALIBRATED  # sampled first: the better prior
    assert tree_candidates(False, "sample") == CALIBRATED and tree_candidates(True, "topk") == CALIBRATED
    with pytest.raises(ValueError, match="a sampled tree's shape must not depend on its draws"):
        TreeShape(20, 6, 5, adaptive=True, drafting="sample")


def test_halving_takes_the_cheapest_of_the_candidates_tied_for_fastest():
    """The one-standard-error rule: arms left within the tie band of the fastest are a tie, and the cheapest
    cycle (fewest rows verified, then fewest draft steps) wins it; one clearly faster wins outright."""
    from mars.tuning.calibrate import SLACK, TIE, Arm, Halving

    def left(speeds: dict[TreeShape, float], seen: int) -> Halving:
        arms = [Arm(kernels=Kernels("float32", False, False), tree=t, tokens=round(100 * v), seconds=100.0,
                    units=seen) for t, v in speeds.items()]
        return Halving({}, arms, [], [], SamplingConfig(), 8, 0.0, seen, print, False)

    chain, deep, wide = TreeShape(4, 4, 1), TreeShape(6, 6, 1), TreeShape(12, 4, 3)
    band = TIE * SLACK / 2  # after 4 units
    winner = left({deep: 60.0, chain: 60.0 * (1 - band / 2), wide: 60.0 * (1 - 2 * band)}, 4).chosen(4)
    assert winner.tree == chain  # within the band of the fastest: the cheaper chain
    assert winner.tied["candidates"] == ["float32 6/6/1", "float32 4/4/1"] and winner.tied["within"] == band
    clear = left({deep: 60.0, chain: 60.0 * (1 - 2 * band)}, 4).chosen(4)
    assert clear.tree == deep and clear.tied is None  # clearly faster: the fastest
    assert left({deep: 60.0, chain: 60.0 * (1 - 2 * band)}, 1).chosen(1).tree == chain  # wider band on 1 unit
