"""Trees judged against the fastest plain decoding, and "speculation off" where none pays
(mars.tuning.calibrate's `reference` and `speculation_of`): the record's reference is the fastest plain
configuration timed; a method whose best tree is slower decodes exactly as plain decoding does and says so
(first lines, settings record, summary, report); a tree set explicitly speculates anyway and says when it is
slower. "No tree pays" is made deterministic by slowing every tree's timing (never by asserting a speed):
the decision is the production one."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import random_prompt, save_standin_pair
from test_precision import CANDIDATES, tiny_pair_loader
from test_runs import answers, config

from eval.runner.settings import measured_against, standing
from mars import SamplingConfig, SpeculativeGenerator
from mars.decoding.settings import DecodeSettings, Kernels, Setting, TreeShape
from mars.tuning import calibrate as C

pytestmark = pytest.mark.usefixtures("single_thread")


def slow_trees(monkeypatch, factor: float = 50.0) -> None:
    """Every speculative call of a calibration is timed `factor` times slower; plain decoding as it ran."""
    real = C.decode

    def slowed(gen, plain, *args, **kwargs):
        tokens, seconds = real(gen, plain, *args, **kwargs)
        return tokens, seconds * (1 if plain else factor)

    monkeypatch.setattr(C, "decode", slowed)


class Instant:
    """A caller's plain configuration (as `mars.decoding.reference.LimitedGenerate` is) that decodes a unit
    in next to no time: the fastest plain decoding of any calibration it joins."""

    label = "generate@bfloat16+avx2"

    def time(self, unit, sampling, max_new_tokens, seed) -> tuple[int, float]:
        return max_new_tokens * len(unit), 1e-6


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return save_standin_pair(tmp_path_factory.mktemp("standin"))


def test_the_reference_is_the_fastest_plain_configuration_and_slower_trees_turn_speculation_off(tmp_path,
                                                                                                   monkeypatch):
    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(2)]
    kernels = C.kernel_candidates("cpu", "float32")
    common = {"max_new_tokens": 8, "log": lambda _: None, "progress": False, "budget": 5.0}
    slow_trees(monkeypatch)
    record = C.calibrate(load, kernels, prompts, SamplingConfig(), CANDIDATES, cache_dir=tmp_path, **common)
    plains = record["plains"]  # our vanilla at every kernel candidate and model.generate in the precision loaded
    assert {f"vanilla {k.label}" for k in kernels} | {"generate@float32"} <= set(plains)
    # the reference: the fastest plain configuration timed beside the tree after it was chosen (its prediction)
    beside = record["prediction"]["plains"]
    assert f"vanilla {Kernels(**record['kernels']).label}" in beside and set(beside) <= set(plains)
    fastest = max(beside, key=beside.get)
    assert record["reference"] == {"label": fastest, "tokens_per_s": beside[fastest]}
    best = record["prediction"]["tokens_per_s"]
    assert record["speedup_over_reference"] == pytest.approx(best / beside[fastest], abs=2e-3)
    ours = {label: p["tokens_per_s"] for label, p in plains.items() if label.startswith("vanilla ")}
    assert f"vanilla {record['fastest_plain']['kernels']}" == max(ours, key=ours.get)
    # the production verdict: off, decoding plainly at our fastest plain decoding's kernels
    verdict = C.speculation_of("strict", record)
    assert not verdict.speculate and verdict.state == "off" and verdict.reference == record["reference"]
    assert verdict.reason.startswith(f"speculation off for strict: the best tree ({TreeShape(**record['tree']).label})"
                                     " ran at ") and "x the fastest plain decoding" in verdict.reason
    tree_kernels, plain_kernels = C.decoding_kernels(record, False)
    assert plain_kernels.label == record["fastest_plain"]["kernels"] and tree_kernels.dtype == plain_kernels.dtype
    assert tree_kernels.label in {label for label, k in record["kernel_candidates"].items() if k["trees"]}
    forced = C.speculation_of("strict", record, forced=True)  # a tree set explicitly speculates anyway
    assert forced.speculate and forced.state == "forced" and forced.reason.endswith("slower than plain decoding")
    # a caller's plain configuration joins the race (and the cache key): here it is the fastest
    joined = C.calibrate(load, kernels[:1], prompts, SamplingConfig(), CANDIDATES[:1], cache_dir=tmp_path,
                         references=[Instant()], **common)
    assert joined["reference"]["label"] == Instant.label and not joined["cached"]
    assert joined["reference"]["tokens_per_s"] == max(p["tokens_per_s"] for p in joined["plains"].values())
    # a rule's record, timed at one kernel, is judged against strict's reference too (carried over through
    # our vanilla at those kernels, which both timed)
    rule = {**record, "kernels": vars(kernels[0]), "reference": {"label": "vanilla float32", "tokens_per_s": 1.0}}
    assert C.reference_of(rule, strict=joined)["label"] == Instant.label


def test_speculation_off_decodes_exactly_as_plain_decoding_and_says_so(standin, tmp_path, monkeypatch, capsys):
    from eval.reporting.summaries import load_runs, merge_runs
    from eval.reporting.tables import report_markdown
    from eval.runner import settings as S
    from eval.runner.job import run

    monkeypatch.setattr(S, "limited_references", lambda *args: [])  # no worker process: a second saved
    slow_trees(monkeypatch)
    prompts = tmp_path / "calibration.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "prompt": f"def f{i}(x):\n    "}) + "\n"
                               for i in range(2)))
    summary = run(config(standin, tmp_path / "out", "tree=calibrated", f"tree.calibration_prompts={prompts}",
                         "tree.calibration_budget=3", "method=mars", "baselines=[vanilla,strict]"))
    lines = capsys.readouterr().out
    assert "speculation off for strict: the best tree (" in lines  # the run's first lines
    strict = summary["methods"]["strict"]
    assert strict["speculation"] == "off" and strict["identical_to_vanilla"] == 1.0 and strict["tau"] == 1.0
    assert strict["predicted_speedup_vs_fastest"] > 0 and "speedup_vs_fastest" in strict
    recorded = summary["settings"]["speculation"]["strict"]
    assert recorded["speculate"] is False and recorded["reason"].startswith("speculation off for strict")
    identity = json.loads((Path(strict["run_dir"]) / "identity.json").read_text())
    assert identity["speculation"] == "off"  # plain decoding's answers are never resumed as the tree's
    # Decoded once: strict's answers are the run's vanilla's, named so (the same loop, kernels and seeds).
    assert strict["answers_of"] == "vanilla" and "its answers are vanilla's in this run" in strict["speculation_reason"]
    mine, vanillas = ({r["question_id"]: r for r in answers(Path(summary["methods"][m]["run_dir"]), m)}
                      for m in ("strict", "vanilla"))
    assert mine.keys() == vanillas.keys() and len(mine) == summary["settings"]["questions"]
    for qid, record in mine.items():
        assert record["answers_of"] == "vanilla" and record["model_id"].endswith("-strict")
        assert record["choices"] == vanillas[qid]["choices"]
        assert record["eval"]["token_ids"] == vanillas[qid]["eval"]["token_ids"]
    # A relaxed rule whose speculation is off takes them too: plain decoding verifies nothing, so the rule
    # does not change its tokens (decoded again, a MARS run timed the same tokens at 0.96x vanilla's speed).
    relaxed = summary["methods"]["mars@0.9"]
    assert relaxed["speculation"] == "off" and relaxed["answers_of"] == "vanilla" and relaxed["relaxed_frac"] == 0
    assert "speculation off for mars@0.9: the best tree (" in lines
    # Without a vanilla in the run, strict decodes plainly itself: the same tokens.
    alone = run(config(standin, tmp_path / "alone", "tree=calibrated", f"tree.calibration_prompts={prompts}",
                       "tree.calibration_budget=3", "method=strict", "baselines=[]"))["methods"]["strict"]
    assert alone["speculation"] == "off" and "answers_of" not in alone
    decoded = {r["question_id"]: r for r in answers(Path(alone["run_dir"]), "strict")}
    assert {q: r["eval"]["token_ids"] for q, r in decoded.items()} == {
        q: r["eval"]["token_ids"] for q, r in vanillas.items()} and not any("answers_of" in r for r in decoded.values())
    runs = load_runs([tmp_path / "out"])
    report = report_markdown(runs, merge_runs(runs), [])
    assert "## Speculation: calibration's prediction and the run" in report and "| off |" in report
    # The engine's own switch: `generate` with speculation off is `vanilla`, token for token (tau 1).
    from transformers import AutoModelForCausalLM

    from eagle.checkpoint import load_draft

    model = AutoModelForCausalLM.from_pretrained(standin / "target", dtype=torch.float32).eval()
    with SpeculativeGenerator(model, load_draft(standin / "draft", model), TreeShape(8, 4, 2)) as gen:
        gen.speculate = False
        prompt = torch.tensor([[1, 5, 9, 33, 7]])
        out, plain = gen.generate(prompt, max_new_tokens=12), gen.vanilla(prompt, max_new_tokens=12)
        assert out.tokens == plain.tokens and out.tau == 1.0


def test_a_forced_tree_speculates_even_where_calibration_found_it_slower(standin, tmp_path, monkeypatch):
    from mars import tuned

    monkeypatch.setattr("mars.tuning.tuned.limited_references", lambda *args: [])  # no worker process
    slow_trees(monkeypatch)
    logged: list[str] = []
    common = {"prompts": [torch.tensor([[1, 5 + i, 9, 33, 7, 12]]) for i in range(2)], "dtype": "float32",
              "cache_dir": tmp_path / "cache", "budget": 3.0, "log": logged.append}
    forced = tuned(standin / "target", standin / "draft", tree=TreeShape(4, 2, 2), **common)
    assert forced.speculate and forced.speculation["strict"].state == "forced"
    assert any(line.startswith("speculation forced for strict") and line.endswith("slower than plain decoding")
               for line in logged)
    default = tuned(standin / "target", standin / "draft", **common)  # tree="auto": no tree pays, plain decoding
    assert not default.speculate and any(line.startswith("speculation off for strict") for line in logged)
    with default:
        prompt = common["prompts"][0]
        assert default.generate(prompt, max_new_tokens=8).tokens == default.vanilla(prompt, max_new_tokens=8).tokens
    # and the run's first lines and settings record say it
    record = forced.calibration["strict"]
    settings = DecodeSettings(
        dtype=Setting("float32", "set explicitly"), exact_attention=Setting(False, "set explicitly"),
        prepack=Setting(False, "set explicitly"), tree=Setting(TreeShape(4, 2, 2), "set in the config (tree=...)"),
        drafting_reason="greedy", placement=Setting("cpu", "model.device"), head=Setting("draft", "model.draft"),
        calibration=record, speculation={"strict": C.speculation_of("strict", record, forced=True)})
    assert settings.speculates("strict") and settings.describe()[-1].startswith("speculation forced for strict")
    assert settings.record()["speculation"]["strict"]["state"] == "forced"


def test_eval_run_and_mars_tuned_reach_one_record_through_one_door_and_other_prompts_miss(standin, tmp_path,
                                                                                          monkeypatch):
    """`eval.run`'s settings and `mars.tuned` both go through `mars.tuning.measure`: for the same machine,
    models, rule, batch and prompts they time once and share the record; other prompts are another record."""
    from eval.benchmarks.prompting import PromptFormat
    from eval.config.schema import validate
    from eval.runner import settings as S
    from mars import tuned

    monkeypatch.setenv("MARS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "limited_references", lambda *args: [])  # no worker process (the same on both sides)
    monkeypatch.setattr("mars.tuning.tuned.limited_references", lambda *args: [])
    prompts = tmp_path / "calibration.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "prompt": f"def g{i}(x):\n    "}) + "\n"
                               for i in range(3)))
    run = validate(config(standin, tmp_path / "out", "tree=calibrated", f"tree.calibration_prompts={prompts}",
                          "tree.calibration_budget=3", "model.dtype=float32", "method=mars",
                          "method.theta=0.9", "baselines=[vanilla]"))
    fmt = PromptFormat.of(run.model.prompt)
    logged: list[str] = []
    settings = S.resolve_settings(run, fmt, log=logged.append)
    assert any(line.startswith("calibrating") for line in logged)  # timed the first time
    same = S.calibration_prompts(run, fmt)
    # a file of single-turn prompts: the run times them in the file's order, as `mars.tuned` reads such a file
    from mars.tuning.tuned import calibration_prompts as api_prompts
    assert [t.tolist() for t in same] == [t.tolist() for t in api_prompts(S.load_tokenizer(run), prompts)]
    logged.clear()
    gen = tuned(standin / "target", standin / "draft", rule="mars", theta=0.9, dtype="float32", prompts=same,
                budget=3.0, max_new_tokens=run.max_new_tokens, log=logged.append)  # the run's prompts and length
    assert not any(line.startswith("calibrating") for line in logged)  # the records eval.run made
    assert gen.calibration["strict"]["cache"] == settings.calibration["cache"]
    (mars,) = settings.method_trees.values()  # the run's MARS method, whatever its display name
    assert gen.calibration["mars"]["cache"] == mars.calibration["cache"]
    other = tuned(standin / "target", standin / "draft", dtype="float32", prompts=same[:1], budget=3.0,
                  max_new_tokens=run.max_new_tokens, log=logged.append)
    assert other.calibration["strict"]["cache"] != settings.calibration["cache"]  # other prompts miss


def test_calibration_times_second_turns_after_the_targets_plain_answer(standin, tmp_path, monkeypatch):
    """A calibration question with a second turn is timed on both turns, the second after the target's plain
    greedy answer to the first (a run's second turns carry that context); the answers are kept, so a
    second resolution finds them without loading the target again. The turns come in two passes (even
    questions' first turns and odd ones' second, then the rest): a prefix, which is what successive halving
    times, holds as many questions as turns."""
    from eval.benchmarks.prompting import PromptFormat, encode
    from eval.config.schema import validate
    from eval.runner import settings as S

    monkeypatch.setenv("MARS_CACHE_DIR", str(tmp_path / "cache"))
    prompts = tmp_path / "calibration.jsonl"
    records = [{"question_id": 0, "turns": ["def f(x):\n    ", "def g(y):\n    "]},
               {"question_id": 1, "turns": ["def h(z):\n    ", "def k(w):\n    "]},
               {"question_id": 2, "prompt": "def m(v):\n    "}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = validate(config(standin, tmp_path / "out", f"tree.calibration_prompts={prompts}", "max_new_tokens=6"))
    fmt = PromptFormat.of(run.model.prompt)
    turns = S.calibration_prompts(run, fmt)
    questions = S.calibration_questions(run)
    tokenizer = S.load_tokenizer(run)
    target = S.load_target(run, torch.float32)
    firsts = [encode(tokenizer, q, [], fmt) for q in questions]
    answers = [target.generate(torch.tensor([first]), max_new_tokens=6, do_sample=False)[0, len(first):]
               for first in firsts[:2]]
    seconds = [encode(tokenizer, q, [tokenizer.decode(a, skip_special_tokens=True)], fmt)
               for q, a in zip(questions[:2], answers, strict=True)]
    expected = [firsts[0], seconds[1], firsts[2], seconds[0], firsts[1]]
    assert [t[0].tolist() for t in turns] == expected
    assert len(seconds[0]) > len(firsts[0]) + len(answers[0]) - 2  # the first exchange is the second turn's context
    monkeypatch.setattr(S, "load_target", lambda *a, **k: pytest.fail("the answers were not kept"))
    assert [t[0].tolist() for t in S.calibration_prompts(run, fmt)] == expected
    # only the turns calibration times (UNITS per batch) are made: no answer decoded for question 0's second turn
    monkeypatch.setattr(S, "UNITS", 2)
    asked = []
    monkeypatch.setattr(S, "first_answers", lambda run, prompts, *a: asked.append(prompts) or ["x"] * len(prompts))
    cut = [t[0].tolist() for t in S.calibration_prompts(run, fmt)]
    assert cut == [firsts[0], encode(tokenizer, questions[1], ["x"], fmt)] and asked == [[firsts[1]]]


def test_bench_calibration_prefers_spare_questions_of_the_runs_categories(standin, tmp_path):
    """tree.calibration_prompts=bench: never a question the run answers, and first the spare questions of a
    category the run answers (MT-bench orders its questions by category)."""
    from eval.config.schema import validate
    from eval.runner import settings as S

    bench = tmp_path / "bench.jsonl"
    kinds = ["writing"] * 3 + ["math"] * 12 + ["writing"] * 2 + ["coding"] * 3
    bench.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                             for i, c in enumerate(kinds)))
    run = validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench", f"bench.questions={bench}",
                          "num_prompts=3"))
    chosen = [q.question_id for q in S.calibration_questions(run)]
    # the run's category (writing) first, then the benchmark's order, until 16 turns
    assert chosen == [15, 16, *range(3, 15), 17, 18]
    # at batch 2 until 32 turns (as many batches as batch 1 times turns): every spare question, in that order
    doubled = validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench", f"bench.questions={bench}",
                              "num_prompts=3", "batch_size=2"))
    assert [q.question_id for q in S.calibration_questions(doubled)] == [*chosen, 19]
    # the run's mix first: for each of the run's questions the next spare one of its kind, then the rest
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                             for i, c in enumerate("abbaaabbbcc")))
    interleaved = validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench",
                                  f"bench.questions={mixed}", "num_prompts=3"))
    assert [q.question_id for q in S.calibration_questions(interleaved)] == [3, 6, 7, 4, 5, 8, 9, 10]
    assert S.calibration_mix(run) == (f"calibration times 16 of {run.bench.name}'s questions the run does not answer "
                                      "(writing 2, math 12, coding 2); the run answers writing 3")
    # every writing and math question answered: the run's first lines say what the predictions are of
    spent = validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench", f"bench.questions={bench}",
                            "num_prompts=17"))
    assert S.calibration_mix(spent).endswith("the run answers writing 5, math 12; writing, math have none to spare: "
                                             "the predicted speedups are the other categories'")
    with pytest.raises(ValueError, match="lower num_prompts"):
        S.calibration_questions(validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench",
                                                f"bench.questions={bench}", "num_prompts=19")))


def test_rules_compared_at_one_tree_all_draft_stricts_tree_and_speculate(standin, tmp_path, monkeypatch):
    """tree.per_method=false (the zoo, the theta sweep, the paper scripts): no rule gets a tree of its own,
    every method drafts strict's calibrated tree and speculates even where calibration found it slower."""
    from eval.runner import settings as S
    from eval.runner.job import run

    monkeypatch.setattr(S, "limited_references", lambda *args: [])
    slow_trees(monkeypatch)
    prompts = tmp_path / "calibration.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "prompt": f"def h{i}(x):\n    "}) + "\n"
                               for i in range(2)))
    summary = run(config(standin, tmp_path / "out", "tree=calibrated", "tree.per_method=false",
                         f"tree.calibration_prompts={prompts}", "tree.calibration_budget=3", "method=mars",
                         "baselines=[vanilla,strict]"))
    settings = summary["settings"]
    assert settings["method_trees"] == {}  # no rule's own tree: one calibration, strict's
    assert settings["speculation"]["strict"]["state"] == "forced"
    assert "rules compared at one tree" in settings["tree_reason"]
    methods = summary["methods"]
    (mars,) = [name for name in methods if name.startswith("mars")]
    # both speculate (the stand-in head is random, so tau says nothing here), at the one tree
    assert methods["strict"]["speculation"] == methods[mars]["speculation"] == "forced"
    assert "predicted_speedup_vs_fastest" not in methods[mars]  # strict's tree was not timed for MARS
    assert methods["strict"]["tree"] == methods[mars]["tree"] == TreeShape(**settings["tree"]).label


def test_plain_decoding_changes_kernels_only_where_they_are_clearly_faster():
    """Plain decoding at other kernels than the trees' rounds otherwise, so strict no longer reproduces it token for
    token: it moves only for a gain beyond the tie band, on the figures beside the prediction where it was timed
    there (the embedded pair's bfloat16+aten: 2.9% faster over 25 prompts, 0.5% slower on the prediction's 8)."""
    from mars.tuning.calibrate import SLACK, TIE

    float32, aten = Kernels("float32", False, False), Kernels("bfloat16", False, False, onednn=False)

    def record(over_all: float, beside: float | None) -> dict:
        plains = {"vanilla float32": 125.3, **({"vanilla bfloat16+aten": beside} if beside else {})}
        return {"kernels": dataclasses.asdict(float32), "precisions_held_together": True,
                "prediction": {"prompts": 8, "plains": plains},
                "kernel_candidates": {k.label: {"kernels": dataclasses.asdict(k), "plain": speed, "trees": {}}
                                      for k, speed in ((float32, 114.5), (aten, over_all))}}

    assert C.plain_kernels_of(record(117.8, 124.7), float32) == float32  # faster over all, tied beside: stays
    band = TIE * SLACK / 8 ** 0.5
    assert C.plain_kernels_of(record(117.8, 125.3 * (1 + band / 2)), float32) == float32  # within the band
    assert C.plain_kernels_of(record(117.8, 125.3 * (1 + 2 * band)), float32) == aten  # clearly faster: moves
    assert C.plain_kernels_of(record(150.0, None), float32) == aten  # dropped before the prediction: over all
    assert C.plain_kernels_of(record(116.0, None), float32) == float32  # ... where it is not clearly faster


def test_plain_decoding_runs_at_the_fastest_plain_kernels_of_the_trees_precision_and_strict_is_checked_at_its_own():
    """Plain decoding's fastest kernels need not be the tree's (bf16 on the AVX-512 EPYC: torch's own one-row
    products, a tree packed): a run's vanilla and speculation-off methods decode at the fastest plain kernels of
    the trees' precision, and strict greedy's first answers are checked against plain decoding at the trees'."""
    from helpers import tiny_model

    from eagle import Eagle3Head
    from eval.config.methods import method_spec
    from eval.runner.answering import exact_at_tree_kernels

    packed, unpacked, aten = (Kernels("bfloat16", True, True), Kernels("bfloat16", True, False),
                              Kernels("bfloat16", False, False, onednn=False))
    candidates = {k.label: {"kernels": dataclasses.asdict(k), "plain": speed, "trees": trees, "identical": same}
                  for k, speed, trees, same in [(packed, 30.0, {"4/4/1": 40.0}, True), (unpacked, 25.0, {}, True),
                                                (aten, 42.0, {"4/4/1": 20.0}, False),
                                                (Kernels("float32", False, True), 50.0, {"4/4/1": 45.0}, True)]}
    float32 = Kernels("float32", False, True)
    record = {"kernels": dataclasses.asdict(packed), "plain_kernels": dataclasses.asdict(float32),
              "kernel_candidates": candidates}
    assert C.decoding_kernels(record, True) == (packed, aten)  # float32's faster plain is another model
    # ... which plain decoding takes where calibration held both precisions' models at once
    assert C.decoding_kernels({**record, "precisions_held_together": True}, True) == (packed, float32)
    # strict off: float32 plain decoding, and float32's fastest tree kernels for a rule's or forced tree
    assert C.decoding_kernels(record, False) == (float32, float32)
    record["plain_kernels"] = dataclasses.asdict(aten)
    assert C.decoding_kernels(record, False) == (packed, aten)  # never the aten trees: they did not reproduce
    # strict off with both precisions held: the rules' trees where trees ran fastest, whatever plain decoding's
    record["kernels"] = dataclasses.asdict(float32)
    assert C.decoding_kernels(record, False)[0] == packed  # one model: the plain precision's fastest tree
    assert C.decoding_kernels({**record, "precisions_held_together": True}, False)[0] == float32
    if torch.backends.mkldnn.is_available():
        assert aten in C.kernel_candidates("cpu", "bfloat16")
        assert all(k.onednn for k in C.kernel_candidates("cpu", "bfloat16", prepack=True))

    model = tiny_model("llama").to(torch.bfloat16)
    torch.manual_seed(4)
    head = Eagle3Head.for_target(model.config).to(torch.bfloat16)
    batch = [random_prompt(random.Random(5), model.config.vocab_size, 9)[0].tolist()]
    strict, vanilla, greedy = method_spec("strict"), method_spec("vanilla"), SamplingConfig()
    with SpeculativeGenerator(model, head, TreeShape(6, 3, 2), exact_attention=True, prepack=False,
                              plain_kernels=Kernels("bfloat16", False, False, onednn=False)) as gen:
        outs = gen.generate([torch.tensor(x) for x in batch], greedy, max_new_tokens=16)
        assert exact_at_tree_kernels(gen, strict, greedy, batch, outs, 16, []) == [True]
        assert exact_at_tree_kernels(gen, vanilla, greedy, batch, outs, 16, []) is None
        wrong = [replace(outs[0], tokens=[t + 1 for t in outs[0].tokens])]
        assert exact_at_tree_kernels(gen, strict, greedy, batch, wrong, 16, []) == [False]
    with SpeculativeGenerator(model, head, TreeShape(6, 3, 2)) as same:  # vanilla is the check already
        assert exact_at_tree_kernels(same, strict, greedy, batch, outs, 16, []) is None


def test_a_rules_calibration_is_judged_against_stricts_reference_without_timing_it_again(tmp_path):
    """`measure`: a rule's tree is timed at the run's kernels beside our vanilla there, not beside the
    references (a worker under the AVX2 limits), and judged against strict's reference carried over."""
    from mars.rules import make_rule
    from mars.tuning.measure import measure

    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(2)]
    kernels = C.kernel_candidates("cpu", "float32")[:1]
    found = measure(load, kernels, prompts, SamplingConfig(),
                    {"mars": SamplingConfig(rule=make_rule("mars", theta=0.9))}, trees=CANDIDATES[:2],
                    references=[Instant()], budget=5.0, cache_dir=tmp_path, max_new_tokens=8, log=lambda _: None)
    assert Instant.label in found.records["strict"]["plains"]
    assert Instant.label not in found.records["mars"]["plains"]  # not timed again
    assert f"vanilla {kernels[0].label}" in found.records["mars"]["plains"]  # what carries strict's reference over
    verdict = found.speculation["mars"]
    assert verdict.reference["label"] == Instant.label and "carried" in verdict.reference and not verdict.speculate


def test_speculation_is_on_only_where_the_tree_is_faster_beyond_its_prompt_to_prompt_spread():
    """A tree 3% faster than plain decoding in calibration whose speedup varies by ±5% from prompt to prompt
    does not speculate (the run decodes other prompts); one clearly faster does; and a calibration records
    that spread from the units the tree and the reference both decoded."""
    plain = Kernels("bfloat16", False, False, onednn=False)
    record = {"tree": vars(TreeShape(8, 4, 2)), "tokens_per_s": {"8/4/2": 41.2},
              "reference": {"label": f"vanilla {plain.label}", "tokens_per_s": 40.0}, "plain_kernels": vars(plain),
              "kernel_candidates": {plain.label: {"plain": 40.0}}}
    spread = {"log_se": 0.05, "prompts": 8}
    unsure = C.speculation_of("strict", {**record, "spread": spread})
    assert not unsure.speculate and "1.03x the fastest" in unsure.reason and "(± 5% over 8 prompts)" in unsure.reason
    batched = C.speculation_of("strict", {**record, "spread": spread, "batch": 4})
    assert "(± 5% over 8 batches of 4 prompts)" in batched.reason  # a batched record's units are batches
    assert "not clearly faster" in unsure.reason
    assert unsure.predicted == 1.0  # plain decoding's own speed is what the run gets
    assert C.speculation_of("strict", {**record, "spread": {"log_se": 0.01, "prompts": 16}}).speculate
    # one-sided at 95% (SURE = 1.645 standard errors): SmolLM2's strict 8/4/2, 1.11x +/- 10% over 8 prompts, ran at
    # 0.98x on MT-bench; it decodes plainly now, and 1.20x at that spread still speculates
    close = {**record, "tokens_per_s": {"8/4/2": 40.0 * 1.114}, "spread": {"log_se": 0.0941, "prompts": 8}}
    assert not C.speculation_of("strict", close).speculate
    assert C.speculation_of("strict", {**close, "tokens_per_s": {"8/4/2": 48.0}}).speculate
    # the prediction (timed after the choice) is what is judged, not the search's figure
    chosen_after = {**record, "tokens_per_s": {"8/4/2": 48.0}, "spread": spread,
                    "prediction": {"tokens_per_s": 41.2, "plains": {f"vanilla {plain.label}": 40.0}}}
    assert not C.speculation_of("strict", chosen_after).speculate
    assert C.speculation_of("strict", chosen_after).reason.startswith("speculation off for strict: the best tree "
                                                                       "(8/4/2) ran at 1.03x")
    clear = {**record, "tokens_per_s": {"8/4/2": 48.0}, "spread": spread}
    assert C.speculation_of("strict", clear).speculate  # 1.20x, beyond the spread
    assert C.speculation_of("strict", {**record, "spread": spread}, forced=True).speculate
    # a rule's record (timed at the run's tree kernels only) that is off decodes with the run's plain decoding:
    # strict's fastest vanilla, which its message and prediction name
    packed = Kernels("bfloat16", True, True)
    strict = {**record, "kernel_candidates": {plain.label: {"plain": 40.0}, packed.label: {"plain": 27.0}}}
    rule = {"tree": vars(TreeShape(4, 4, 1)), "tokens_per_s": {"4/4/1": 41.2}, "kernels": vars(packed),
            "reference": {"label": f"vanilla {packed.label}", "tokens_per_s": 27.0}, "plain_kernels": vars(packed),
            "kernel_candidates": {packed.label: {"plain": 27.0}}, "spread": spread}
    off = C.speculation_of("mars", rule, strict=strict)
    assert not off.speculate and off.predicted == 1.0
    assert off.reason.endswith(f"mars decodes plainly (vanilla {plain.label}, 40.0 tok/s in strict's calibration)")


def test_the_spread_pairs_the_units_the_tree_and_the_reference_both_decoded():
    """`paired_spread`: the standard error of the mean log speedup over the units both decoded (the same prompt
    at the same length); the units only one decoded do not count, and fewer than two pairs give none."""
    arm, plain = C.Timed(), C.Timed()
    for index, (fast, slow) in enumerate([(60, 40), (45, 40), (50, 40)]):
        arm.add(fast, 1.0, index)
        plain.add(slow, 1.0, index)
    arm.add(99, 1.0, 7)  # a unit the reference did not decode
    logs = [math.log(r) for r in (1.5, 1.125, 1.25)]
    mean = sum(logs) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2 / 3)
    assert C.paired_spread(arm, plain) == {"log_se": round(se, 4), "prompts": 3}
    lone = C.Timed()
    lone.add(50, 1.0, 0)
    assert C.paired_spread(lone, plain) is None


def test_the_precision_reason_compares_kernels_on_the_prompts_both_decoded_not_raw_speeds():
    """Halving times most arms on one prompt: a bf16 tree dropped after a fast first prompt has a higher raw
    tok/s than the float32 winner's mean over 13 prompts. The reason quotes each kernel set's best tree paired
    against the fastest candidate on the same prompts (below 1 where it lost), never the raw speeds."""
    record = {
        "tree": vars(TreeShape(8, 8, 1)),
        "kernel_candidates": {label: {"trees": trees, "plain": 60.0, "identical": True} for label, trees in {
            "float32+packed": {"8/8/1": 145.7, "12/4/3": 171.9},
            "bfloat16+exact+packed": {"6/6/1": 143.8, "32/6/6": 184.1},
            "bfloat16+exact": {"6/6/1": 185.1}}.items()},
        "timed_prompts": {"float32+packed 8/8/1": 13, "float32+packed 12/4/3": 1, "bfloat16+exact+packed 6/6/1": 13,
                          "bfloat16+exact+packed 32/6/6": 1, "bfloat16+exact 6/6/1": 1},
        "dropped": {
            "float32+packed 12/4/3": {"round": 1, "prompts": 1, "tokens_per_s": 171.9, "best_tokens_per_s": 234.9},
            "bfloat16+exact+packed 32/6/6": {"round": 1, "prompts": 1, "tokens_per_s": 184.1,
                                             "best_tokens_per_s": 234.9},
            "bfloat16+exact+packed 6/6/1": {"round": 4, "prompts": 13, "tokens_per_s": 143.8,
                                            "best_tokens_per_s": 145.7},
            "bfloat16+exact 6/6/1": {"round": 1, "prompts": 1, "tokens_per_s": 185.1, "best_tokens_per_s": 234.9}},
    }
    assert standing(record, "float32+packed") == (1.0, 13, "8/8/1")
    assert standing(record, "bfloat16+exact+packed") == (143.8 / 145.7, 13, "6/6/1")  # lasted longest, not fastest raw
    assert standing(record, "bfloat16+exact") == (185.1 / 234.9, 1, "6/6/1")  # not a prefix of "+packed"'s arms
    assert standing(record, "float32") is None
    text = measured_against(record, Kernels("float32", False, True), ["bfloat16+exact+packed", "bfloat16+exact"])
    assert text.startswith("measured: strict at float32+packed 8/8/1 145.7 tok/s over 13 prompts")
    assert "bfloat16+exact+packed 0.99x (6/6/1, 13 prompts)" in text
    assert "bfloat16+exact 0.79x (6/6/1, 1 prompt)" in text
    assert "184.1" not in text and "185.1" not in text
    # a tie left two arms at the end and the cheaper won: the faster one left reads above it, the run's tree is named
    record["kernel_candidates"]["bfloat16+aten"] = {"trees": {"4/4/1": 150.0}, "plain": 80.0, "identical": True}
    record["timed_prompts"]["bfloat16+aten 4/4/1"] = 13
    assert standing(record, "float32+packed") == (145.7 / 150.0, 13, "8/8/1")
    assert standing(record, "bfloat16+aten") == (1.0, 13, "4/4/1")
    text = measured_against(record, Kernels("float32", False, True), ["bfloat16+aten"])
    assert text.startswith("measured: strict at float32+packed 8/8/1 145.7 tok/s over 13 prompts")
    assert text.endswith("bfloat16+aten 1.00x (4/4/1, 13 prompts)")


def test_the_default_calibration_budget_grows_with_the_turns_it_times(tmp_path):
    """With no budget given, `measure` hands strict's calibration the default for the run's turn length: at 128
    tokens twice the 64-token budget, so longer turns buy as many halving rounds; a budget given is kept."""
    from mars.tuning.measure import measure

    load, _ = tiny_pair_loader()
    prompts = [random_prompt(random.Random(i), 16, 8) for i in range(2)]
    kernels = C.kernel_candidates("cpu", "float32")[:1]
    budgets = {}
    for tokens, budget in ((8, None), (128, None), (128, 0.5)):
        found = measure(load, kernels, prompts, SamplingConfig(), trees=CANDIDATES[:1], budget=budget,
                        cache_dir=tmp_path / f"{tokens}-{budget}", max_new_tokens=tokens, log=lambda _: None)
        budgets[tokens, budget] = found.records["strict"]["budget_s"]
    assert budgets[8, None] == pytest.approx(C.DEFAULT_BUDGET, abs=0.05)  # the share left after setting up
    assert budgets[128, None] == pytest.approx(2 * C.DEFAULT_BUDGET, abs=0.05)
    assert budgets[128, 0.5] == pytest.approx(0.5, abs=0.05)


def test_the_precision_reason_says_where_trees_verify_when_strict_decodes_plainly():
    """Strict off: the run's first lines name plain decoding's kernels and the trees' (a rule's own), which are in
    another precision where calibration held both precisions' models (`decoding_kernels`)."""
    from eval.runner.settings import plain_reason

    record = {"fastest_plain": {"kernels": "bfloat16+aten", "tokens_per_s": 12.9},
              "kernel_candidates": {"bfloat16+aten": {"plain": 12.9}},
              # the speed beside the prediction, on the prompts held out for it, is the one the lines quote
              "prediction": {"plains": {"vanilla bfloat16+aten": 12.7}}}
    held = plain_reason(record, Kernels("float32", False, True))
    assert "decodes plainly at our fastest plain decoding (vanilla bfloat16+aten 12.7 tok/s" in held
    assert "verifies at float32+packed, where trees ran fastest" in held
    same = plain_reason(record, Kernels("bfloat16", True, True))
    assert "so the precision of our fastest plain decoding" in same and "verifies at bfloat16+exact+packed" in same
