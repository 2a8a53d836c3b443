"""Trees judged against the fastest plain decoding, and "speculation off" where none pays (mars.tuning.search's
plain race and paired finals, mars.tuning.verdict): the record's reference is the fastest plain decoding raced; a
method whose chosen tree is slower decodes exactly as the plain decoding it names and says so (first lines,
settings record, summary, report); a tree set explicitly speculates anyway and says when it is slower. "No tree
pays" is made deterministic by slowing every tree's timed calls in the finals (never by asserting a speed): the
verdict is the production one."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import random_prompt, save_standin_pair
from test_precision import CANDIDATES, plan, strict_of, tiny_pair_loader
from test_runs import answers, config

from mars import SamplingConfig, SpeculativeGenerator
from mars.decoding.settings import DecodeSettings, Kernels, Setting, TreeShape
from mars.tuning import search
from mars.tuning.candidates import kernel_candidates
from mars.tuning.measure import Request, measure
from mars.tuning.plan import DEFAULT_BUDGET, TIMED_TOKENS
from mars.tuning.search import PROFILE_UNITS
from mars.tuning.verdict import speculation_of

pytestmark = pytest.mark.usefixtures("single_thread")


def slow_trees(monkeypatch, factor: float = 1e4) -> None:
    """Every speculative call a calibration times end to end (the finals' arms) takes `factor` times the seconds
    it ran; plain decoding as it ran. The factor is far beyond what contention does to one call: at 50, a plain
    decode slowed ~20x by a loaded CI host made the two held-out pairs' interval straddle 1, and the verdict
    came out "uncertain" (only the reported seconds are scaled, so a larger factor costs nothing)."""
    real = search.arm_contender

    def slowed(*args, **kwargs):
        contender = real(*args, **kwargs)
        timer = contender.time

        def timed(unit, seed, tokens):
            decoded, seconds = timer(unit, seed, tokens)
            return decoded, seconds * factor
        contender.time = timed
        return contender

    monkeypatch.setattr(search, "arm_contender", slowed)


class Instant:
    """A caller's plain decoding out of this process (as `mars.decoding.reference.LimitedGenerate` is) that decodes
    100,000 tokens/s, tens of times the tiny pair's: the fastest plain decoding of any calibration it joins."""

    label = "generate@bfloat16+avx2"

    def start(self) -> None:
        pass

    def pids(self) -> list[int]:
        return []

    def time(self, unit, sampling, max_new_tokens, seed) -> tuple[int, float]:
        return max_new_tokens * len(unit), max_new_tokens * 1e-5

    def close(self) -> None:
        pass


def tiny_prompts(count: int = 4) -> list[torch.Tensor]:
    """Prompts for the tiny pair: calibration's least is PROFILE_UNITS + 1; one more gives the finals a pair."""
    return [random_prompt(random.Random(i), 16, 8) for i in range(count)]


def prompt_file(path: Path, stem: str, count: int = 4) -> Path:
    """A calibration prompt file of `count` single-turn prompts."""
    path.write_text("".join(json.dumps({"question_id": i, "prompt": f"def {stem}{i}(x):\n    "}) + "\n"
                            for i in range(count)))
    return path


def fixed_settings(plain: Kernels | None = None, **more) -> DecodeSettings:
    """A run's settings as a config sets them (float32, prepacked, a fixed tree); `plain`: plain decoding's own
    kernels, where not the trees'."""
    return DecodeSettings(
        dtype=Setting("float32", "set explicitly"), exact_attention=Setting(False, "set explicitly"),
        prepack=Setting(True, "set explicitly"), tree=Setting(TreeShape(4, 2, 2), "set in the config (tree=...)"),
        drafting_reason="greedy", placement=Setting("cpu", "model.device"), head=Setting("draft", "model.draft"),
        plain_kernels=None if plain is None else Setting(plain, "measured"), **more)


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return save_standin_pair(tmp_path_factory.mktemp("standin"))


def test_the_reference_is_the_fastest_plain_decoding_raced_and_slower_trees_turn_speculation_off(tmp_path,
                                                                                                monkeypatch):
    load, _ = tiny_pair_loader()
    kernels = kernel_candidates("cpu", "float32")
    slow_trees(monkeypatch)
    record = strict_of(load, kernels, tiny_prompts(), plan(tmp_path))
    # our vanilla at the kernel sets of the cheapest plain steps and model.generate in the precision loaded
    assert {f"vanilla {k.label}" for k in kernels} | {"generate@float32"} <= {p.label for p in record.plains}
    fastest = max(record.plains, key=lambda p: p.relative)
    assert record.reference == fastest and fastest.relative == 1.0 and fastest.tokens_per_s > 0
    # the production verdict: off, decoding with that plain decoding
    verdict = speculation_of("strict", record)
    assert not record.speculate and not verdict.speculate and verdict.state == "off" and verdict.predicted == 1.0
    assert verdict.plain == record.reference.label == verdict.reference["label"]
    assert verdict.reason.startswith(f"speculation off for strict: the best tree ({record.tree.label}) ran at ")
    assert verdict.reason.endswith(f"strict decodes with {record.reference.label}, the fastest plain decoding")
    forced = speculation_of("strict", record, forced=True)  # a tree set explicitly speculates anyway
    assert forced.speculate and forced.state == "forced" and forced.reason.endswith("slower than plain decoding")
    # a caller's plain decoding joins the race (and the cache key): here it is the fastest
    joined = strict_of(load, kernels[:1], tiny_prompts(), plan(tmp_path, CANDIDATES[:1], references=[Instant()]))
    assert joined.reference.label == Instant.label and not joined.cached
    assert max(joined.plains, key=lambda p: p.relative).label == Instant.label


def test_speculation_off_decodes_exactly_as_plain_decoding_and_says_so(standin, tmp_path, monkeypatch, capsys):
    from eval.reporting.summaries import load_runs, merge_runs
    from eval.reporting.tables import report_markdown
    from eval.runner import job_settings as S
    from eval.runner.job import run

    monkeypatch.setattr(S, "limited_references", lambda *args: [])  # no worker process: a second saved
    slow_trees(monkeypatch)
    prompts = prompt_file(tmp_path / "calibration.jsonl", "f")
    summary = run(config(standin, tmp_path / "out", "tree=calibrated", f"tree.calibration_prompts={prompts}",
                         "tree.calibration_budget=3", "method=mars", "baselines=[vanilla,strict]"))
    lines = capsys.readouterr().out
    assert "speculation off for strict: the best tree (" in lines  # the run's first lines
    strict = summary["methods"]["strict"]
    assert strict["speculation"] == "off" and strict["identical_to_vanilla"] == 1.0 and strict["tau"] == 1.0
    assert strict["predicted_speedup_vs_fastest"] == 1.0 and "speedup_vs_fastest" in strict
    recorded = summary["settings"]["speculation"]["strict"]
    assert recorded["speculate"] is False and recorded["reason"].startswith("speculation off for strict")
    assert recorded["plain"] == summary["settings"]["calibration"]["reference"]["label"]  # what it decodes with
    identity = json.loads((Path(strict["run_dir"]) / "identity.json").read_text())
    assert identity["speculation"] == "off"  # plain decoding's answers are never resumed as the tree's
    # Decoded once: strict's answers are the run's plain method's, named so (no generate in this run: vanilla)
    assert strict["answers_of"] == "vanilla" and "its answers are vanilla's in this run" in strict["speculation_reason"]
    mine, vanillas = ({r["question_id"]: r for r in answers(Path(summary["methods"][m]["run_dir"]), m)}
                      for m in ("strict", "vanilla"))
    assert mine.keys() == vanillas.keys() and len(mine) == summary["settings"]["questions"]
    for qid, record in mine.items():
        assert record["answers_of"] == "vanilla" and record["model_id"].endswith("-strict")
        assert record["choices"] == vanillas[qid]["choices"]
        assert record["eval"]["token_ids"] == vanillas[qid]["eval"]["token_ids"]
    # A relaxed rule whose speculation is off takes them too: plain decoding verifies nothing, so the rule
    # does not change its tokens.
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


def test_an_off_method_takes_the_answers_of_the_runs_plain_method_its_verdict_names():
    """`eval.runner.job.plain_method`: the run's generate@<dtype>[+isa] method where the verdict names it, else the
    run's vanilla, else none (the method decodes plainly itself)."""
    from eval.config.methods import Dtype, GenerateConfig, method_spec
    from eval.runner.job import plain_method

    generate, limited = method_spec("generate"), GenerateConfig(dtype=Dtype.bfloat16, isa="avx2")
    methods = [generate, method_spec("vanilla"), limited, method_spec("strict")]
    settings = fixed_settings()
    assert plain_method("generate@float32", methods, settings) == "generate"  # the run's precision
    assert plain_method("generate@bfloat16+avx2", methods, settings) == limited.name == "generate@bfloat16+avx2"
    assert plain_method("vanilla float32+packed", methods, settings) == "vanilla"
    assert plain_method("generate@bfloat16+avx2", methods[:2], settings) == "vanilla"  # not in the run
    assert plain_method("generate@float32", [method_spec("strict")], settings) is None


def test_a_forced_tree_speculates_even_where_calibration_found_it_slower(standin, tmp_path, monkeypatch):
    from mars import tuned

    monkeypatch.setattr("mars.tuning.tuned.limited_references", lambda *args: [])  # no worker process
    slow_trees(monkeypatch)
    logged: list[str] = []
    common = {"prompts": [torch.tensor([[1, 5 + i, 9, 33, 7, 12]]) for i in range(4)], "dtype": "float32",
              "cache_dir": tmp_path / "cache", "budget": 3.0, "max_new_tokens": 8, "log": logged.append}
    forced = tuned(standin / "target", standin / "draft", tree=TreeShape(4, 2, 2), **common)
    assert forced.speculate and forced.speculation["strict"].state == "forced"
    assert any(line.startswith("speculation forced for strict") and line.endswith("slower than plain decoding")
               for line in logged)
    default = tuned(standin / "target", standin / "draft", **common)  # tree="auto": no tree pays, plain decoding
    assert not default.speculate and any(line.startswith("speculation off for strict") for line in logged)
    named = default.speculation["strict"].plain
    assert named == default.calibration["strict"].reference.label
    # it decodes with that plain decoding: our vanilla loop, or model.generate (here, in this process)
    assert (default.plain_decoding is None) == named.startswith("vanilla")
    assert default.plain_decoding is None or default.plain_decoding.label == named
    with default:
        prompt = common["prompts"][0]
        assert default.generate(prompt, max_new_tokens=8).tokens == default.vanilla(prompt, max_new_tokens=8).tokens
    # and the run's first lines and settings record say it
    record = forced.calibration["strict"]
    settings = fixed_settings(calibration=record, speculation={"strict": speculation_of("strict", record, forced=True)})
    assert settings.speculates("strict") and settings.describe()[-1].startswith("speculation forced for strict")
    assert settings.record()["speculation"]["strict"]["state"] == "forced"
    assert settings.record()["calibration"]["tree"] == vars(record.tree)


def test_eval_run_and_mars_tuned_reach_one_record_through_one_door_and_other_prompts_miss(standin, tmp_path,
                                                                                          monkeypatch):
    """`eval.run`'s settings and `mars.tuned` both go through `mars.tuning.measure`: for the same machine,
    models, rule, batch and prompts they time once and share the record; other prompts are another record."""
    from eval.benchmarks.prompting import PromptFormat
    from eval.config.schema import validate
    from eval.runner import job_settings as S
    from mars import tuned

    monkeypatch.setenv("MARS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "limited_references", lambda *args: [])  # no worker process (the same on both sides)
    monkeypatch.setattr("mars.tuning.tuned.limited_references", lambda *args: [])
    prompts = prompt_file(tmp_path / "calibration.jsonl", "g")
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
    assert gen.calibration["strict"].cached and gen.calibration["strict"].cache == settings.calibration.cache
    (mars,) = settings.method_trees.values()  # the run's MARS method, whatever its display name
    assert gen.calibration["mars"].cached and gen.calibration["mars"].cache == mars.calibration.cache
    other = tuned(standin / "target", standin / "draft", dtype="float32", prompts=same[::-1], budget=3.0,
                  max_new_tokens=run.max_new_tokens, log=logged.append)
    assert other.calibration["strict"].cache != settings.calibration.cache  # other prompts miss


def test_the_cache_key_holds_every_sampling_parameter(tmp_path):
    """Top-p and top-k change what is drafted and accepted: a calibration differing in either alone is another
    record; the same call again finds its record."""
    load, _ = tiny_pair_loader()
    kernels, prompts = kernel_candidates("cpu", "float32")[:1], tiny_prompts()

    def strict_at(**sampling):
        request = Request(SamplingConfig(temperature=1.0, **sampling), trees=CANDIDATES[:1], budget=3.0,
                          max_new_tokens=8, cache_dir=tmp_path, log=lambda _: None)
        return measure(load, kernels, prompts, request).records["strict"]

    base = strict_at()
    again = strict_at()
    assert not base.cached and again.cached and again.cache == base.cache
    top_p, top_k = strict_at(top_p=0.9), strict_at(top_k=5)
    assert not top_p.cached and not top_k.cached and len({base.cache, top_p.cache, top_k.cache}) == 3
    assert (top_p.sampling, top_k.sampling) == ({"temperature": 1.0, "top_p": 0.9, "top_k": 0},
                                                {"temperature": 1.0, "top_p": 1.0, "top_k": 5})


def test_calibration_times_second_turns_after_the_targets_plain_answer(standin, tmp_path, monkeypatch):
    """A calibration question with a second turn is timed on both turns, the second after the target's plain
    greedy answer to the first (a run's second turns carry that context); the answers are kept, so a
    second resolution finds them without loading the target again. The turns come in two passes (even
    questions' first turns and odd ones' second, then the rest): a prefix, such as the first units that rank the
    candidates, holds as many questions as turns."""
    from eval.benchmarks.prompting import PromptFormat, encode
    from eval.config.schema import validate
    from eval.runner import job_settings as S

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
    category the run answers (MT-bench orders its questions by category); where too few are spare for a
    calibration, the model's own calibration prompts, and the run's first lines say so."""
    from eval.benchmarks import load_questions
    from eval.config.schema import validate
    from eval.runner import job_settings as S

    bench = tmp_path / "bench.jsonl"
    kinds = ["writing"] * 3 + ["math"] * 12 + ["writing"] * 2 + ["coding"] * 10
    bench.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                             for i, c in enumerate(kinds)))

    def at(*more: str, questions: Path = bench):
        return validate(config(standin, tmp_path / "out", "tree.calibration_prompts=bench",
                               f"bench.questions={questions}", *more))
    run = at("num_prompts=3")
    chosen = [q.question_id for q in S.calibration_questions(run)]
    # the run's category (writing) first, then the benchmark's order, until 16 turns
    assert chosen == [15, 16, *range(3, 15), 17, 18]
    # at batch 2 until 32 turns (as many batches as batch 1 times turns): every spare question, in that order
    assert [q.question_id for q in S.calibration_questions(at("num_prompts=3", "batch_size=2"))] == [
        *chosen, *range(19, 27)]
    # the run's mix first: for each of the run's questions the next spare one of its kind, then the rest
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                             for i, c in enumerate("abbaaabbbccdd")))  # 10 spare: a calibration's least
    interleaved = at("num_prompts=3", questions=mixed)
    assert [q.question_id for q in S.calibration_questions(interleaved)] == [3, 6, 7, 4, 5, 8, 9, 10, 11, 12]
    assert S.calibration_mix(run) == (f"calibration times 16 of {run.bench.name}'s questions the run does not answer "
                                      "(writing 2, math 12, coding 2); the run answers writing 3")
    # every writing and math question answered: the run's first lines say what the predictions are of
    spent = at("num_prompts=17")
    assert S.calibration_mix(spent).endswith("the run answers writing 5, math 12; writing, math have none to spare: "
                                             "the predicted speedups are the other categories'")
    # too few spare turns for the profiles and the finals' floor: the model's own prompts, said so
    assert not S.too_few_spare(spent)
    drained = at("num_prompts=19")  # 8 spare: fewer than the profiles' 2 and the finals' floor of 8
    assert S.too_few_spare(drained)
    own = load_questions(drained.model.calibration_prompts)
    assert [q.question_id for q in S.calibration_questions(drained)] == [q.question_id for q in own] and own
    assert S.calibration_mix(drained) == (
        f"calibration times the model's own prompts ({drained.model.calibration_prompts}): {drained.bench.name} has "
        f"{len(kinds)} questions and the run answers 19, too few to spare")


def test_a_run_whose_benchmark_has_no_question_to_spare_calibrates_on_the_models_prompts(standin, tmp_path,
                                                                                           monkeypatch, capsys):
    """tree.calibration_prompts=bench with every question answered: the run calibrates on the model's own prompts
    (model.calibration_prompts) and its first lines say so, instead of refusing to run."""
    from eval.runner import job_settings as S
    from eval.runner.job import run

    monkeypatch.setattr(S, "limited_references", lambda *args: [])
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question_id": i, "category": "coding", "turns": [f"def q{i}(x):\n    "]})
                             + "\n" for i in range(2)))
    own = prompt_file(tmp_path / "own.jsonl", "o")
    summary = run(config(standin, tmp_path / "out", "tree=calibrated", "tree.calibration_prompts=bench",
                         f"bench.questions={bench}", "num_prompts=2", f"model.calibration_prompts={own}",
                         "tree.calibration_budget=3", "method=strict", "baselines=[]"))
    lines = capsys.readouterr().out
    assert f"calibration times the model's own prompts ({own}): " in lines and "too few to spare" in lines
    assert summary["settings"]["calibration"]["method"] == "strict" and summary["settings"]["questions"] == 2


def test_rules_compared_at_one_tree_all_draft_stricts_tree_and_speculate(standin, tmp_path, monkeypatch):
    """tree.per_method=false (the zoo, the theta sweep, the paper scripts): no rule gets a tree of its own,
    every method drafts strict's calibrated tree and speculates even where calibration found it slower."""
    from eval.runner import job_settings as S
    from eval.runner.job import run

    monkeypatch.setattr(S, "limited_references", lambda *args: [])
    slow_trees(monkeypatch)
    prompts = prompt_file(tmp_path / "calibration.jsonl", "h")
    summary = run(config(standin, tmp_path / "out", "tree=calibrated", "tree.per_method=false",
                         f"tree.calibration_prompts={prompts}", "tree.calibration_budget=3", "method=mars",
                         "baselines=[vanilla,strict]"))
    settings = summary["settings"]
    assert settings["method_trees"] == {}  # no rule's own tree: one calibration, strict's
    assert settings["speculation"]["strict"]["state"] == "forced"
    assert "rules compared at one tree" in settings["tree_reason"]
    assert ", slower than plain decoding; predicted for this run" in settings["speculation"]["strict"]["reason"]
    methods = summary["methods"]
    (mars,) = [name for name in methods if name.startswith("mars")]
    # both speculate (the stand-in head is random, so tau says nothing here), at the one tree
    assert methods["strict"]["speculation"] == methods[mars]["speculation"] == "forced"
    assert "predicted_speedup_vs_fastest" not in methods[mars]  # strict's tree was not timed for MARS
    assert methods["strict"]["tree"] == methods[mars]["tree"] == TreeShape(**settings["tree"]).label


def test_vanillas_run_directory_names_plain_decodings_kernels_where_they_are_not_the_trees(standin, tmp_path):
    """Vanilla decodes at plain decoding's own kernels (`DecodeSettings.plain`), which round otherwise than the
    trees': its directory names them where they differ, and only there (earlier directories keep their names)."""
    from eval.config.methods import method_spec
    from eval.config.schema import validate
    from eval.runner.directories import method_identity

    run = validate(config(standin, tmp_path / "out"))
    vanilla, strict = method_spec("vanilla"), method_spec("strict")
    trees, aten = Kernels("float32", False, True), Kernels("bfloat16", False, False, onednn=False)
    same = method_identity(run, vanilla, fixed_settings())
    assert "plain_kernels" not in same and same["dtype"] == "float32"
    assert method_identity(run, vanilla, fixed_settings(trees)) == same  # named plain kernels equal to the trees'
    moved = method_identity(run, vanilla, fixed_settings(aten))
    assert (moved["plain_kernels"], moved["dtype"]) == (aten.label, "bfloat16")
    assert method_identity(run, strict, fixed_settings(aten)) == method_identity(run, strict, fixed_settings())


def test_plain_kernels_set_by_label_name_vanillas_directory_as_a_calibration_that_picked_them_would(standin, tmp_path):
    """`model.plain_kernels` forces our vanilla's kernels with no calibration, so a calibrated run's directories can
    be resumed with every setting forced: vanilla's identity is the one the calibration's pick gave; a label equal
    to the trees' kernels names nothing; a label that names no kernels is refused at validation."""
    from eval.benchmarks.prompting import PromptFormat
    from eval.config.methods import method_spec
    from eval.config.schema import validate
    from eval.runner.directories import method_identity
    from eval.runner.job_settings import resolve_settings

    aten = Kernels("bfloat16", False, False, onednn=False)
    forced = ("model.dtype=bfloat16", "model.exact_attention=true", "model.prepack=false")
    run = validate(config(standin, tmp_path / "out", *forced, f"model.plain_kernels={aten.label}"))
    settings = resolve_settings(run, PromptFormat.of(run.model.prompt), log=lambda line: None)
    assert settings.plain == aten and "model.plain_kernels" in settings.plain_kernels.reason
    vanilla = method_spec("vanilla")
    calibrated = replace(settings, plain_kernels=Setting(aten, "measured"))
    assert method_identity(run, vanilla, settings) == method_identity(run, vanilla, calibrated)
    assert method_identity(run, vanilla, settings)["plain_kernels"] == "bfloat16+aten"
    trees = settings.kernels.label
    same = validate(config(standin, tmp_path / "out", *forced, f"model.plain_kernels={trees}"))
    assert resolve_settings(same, PromptFormat.of(same.model.prompt), log=lambda line: None).plain_kernels is None
    with pytest.raises(ValueError, match=r"model.plain_kernels: kernels 'bf16\+aten'.*bfloat16\+aten"):
        validate(config(standin, tmp_path / "out", "model.plain_kernels=bf16+aten"))


def test_strict_greedy_is_checked_against_plain_decoding_at_the_trees_kernels():
    """Plain decoding's fastest kernels need not be the trees' (bf16 on the AVX-512 EPYC: torch's own one-row
    products, a tree packed): a run's vanilla decodes at the plain kernels, and strict greedy's answers are checked
    against plain decoding at the trees' (`exact_at_tree_kernels`)."""
    from helpers import tiny_model

    from eagle import Eagle3Head
    from eval.config.methods import method_spec
    from eval.runner.answer_loop import exact_at_tree_kernels

    aten = Kernels("bfloat16", False, False, onednn=False)
    if torch.backends.mkldnn.is_available():
        assert aten in kernel_candidates("cpu", "bfloat16")
        assert all(k.onednn for k in kernel_candidates("cpu", "bfloat16", prepack=True))
    model = tiny_model("llama").to(torch.bfloat16)
    torch.manual_seed(4)
    head = Eagle3Head.for_target(model.config).to(torch.bfloat16)
    batch = [random_prompt(random.Random(5), model.config.vocab_size, 9)[0].tolist()]
    strict, vanilla, greedy = method_spec("strict"), method_spec("vanilla"), SamplingConfig()
    with SpeculativeGenerator(model, head, TreeShape(6, 3, 2), exact_attention=True, prepack=False,
                              plain_kernels=aten) as gen:
        outs = gen.generate([torch.tensor(x) for x in batch], greedy, max_new_tokens=16)
        assert exact_at_tree_kernels(gen, strict, greedy, batch, outs, 16, []) == [True]
        assert exact_at_tree_kernels(gen, vanilla, greedy, batch, outs, 16, []) is None
        wrong = [replace(outs[0], tokens=[t + 1 for t in outs[0].tokens])]
        assert exact_at_tree_kernels(gen, strict, greedy, batch, wrong, 16, []) == [False]
    with SpeculativeGenerator(model, head, TreeShape(6, 3, 2)) as same:  # vanilla is the check already
        assert exact_at_tree_kernels(same, strict, greedy, batch, outs, 16, []) is None


def test_a_rules_calibration_joins_stricts_finals_against_stricts_reference(tmp_path):
    """`measure`: strict and a rule are calibrated together, one plain race and one set of paired finals, so the
    rule is judged against strict's reference; a rule asked for after strict's record was cached is timed alone at
    strict's kernels against strict's reference, timed again."""
    from mars.rules import make_rule

    load, _ = tiny_pair_loader()
    prompts, kernels = tiny_prompts(), kernel_candidates("cpu", "float32")[:1]
    relaxed = SamplingConfig(rule=make_rule("mars", theta=0.9))

    def measured(rules: dict, cache: Path):
        return measure(load, kernels, prompts, Request(SamplingConfig(), rules=rules, trees=CANDIDATES[:2],
                                                       references=[Instant()], budget=3.0, max_new_tokens=8,
                                                       cache_dir=cache, log=lambda _: None))

    together = measured({"mars": relaxed}, tmp_path / "together")
    strict, rule = together.records["strict"], together.records["mars"]
    assert strict.reference.label == rule.reference.label == Instant.label and rule.plains == strict.plains
    assert rule.kernels == strict.kernels and rule.rule["name"] == "mars"
    assert strict.measured.pairs == rule.measured.pairs == len(prompts) - PROFILE_UNITS  # the same blocks
    verdict = together.speculation["mars"]
    assert not verdict.speculate and verdict.plain == verdict.reference["label"] == Instant.label
    # strict's record first, the rule later
    assert set(measured({}, tmp_path / "later").records) == {"strict"}
    later = measured({"mars": relaxed}, tmp_path / "later")
    strict, rule = later.records["strict"], later.records["mars"]
    assert strict.cached and not rule.cached
    assert rule.reference.label == Instant.label and rule.kernels == strict.kernels and rule.plains == strict.plains
    assert rule.measured.pairs == len(prompts) - PROFILE_UNITS  # its reference timed again beside it
    assert later.speculation["mars"].plain == Instant.label


def test_a_rule_after_stricts_cached_record_is_timed_at_stricts_precision_when_it_is_not_the_first_candidates(
        tmp_path):
    """Strict's cached record may name kernels in another precision than the first candidate's (SmolLM2 on the
    Xeon: bf16 trees, float32 listed first): a rule asked for later loads strict's precision and is timed there."""
    from mars.rules import make_rule
    from mars.tuning import record as records

    load, _ = tiny_pair_loader()
    prompts = tiny_prompts()
    kernels = [kernel_candidates("cpu", "float32")[0], kernel_candidates("cpu", "bfloat16")[0]]

    def measured(rules: dict):
        return measure(load, kernels, prompts, Request(SamplingConfig(), rules=rules, trees=CANDIDATES[:1],
                                                       references=[Instant()], budget=3.0, max_new_tokens=8,
                                                       cache_dir=tmp_path, log=lambda _: None))

    path = Path(measured({}).records["strict"].cache)
    bf16 = replace(records.load(path), kernels=kernels[1])  # as if the bf16 trees had won
    path.write_text(json.dumps(bf16.to_dict()))
    later = measured({"mars": SamplingConfig(rule=make_rule("mars", theta=0.9))})
    assert later.records["strict"].cached and later.records["mars"].kernels == kernels[1]


def test_calibration_times_turns_of_at_most_timed_tokens_in_the_default_budget(tmp_path):
    """With no budget given, `measure` hands the calibration DEFAULT_BUDGET whatever the run's length, and it
    times turns of the run's length up to TIMED_TOKENS: a 128-token run and a TIMED_TOKENS one share a record.
    A budget given is kept."""
    load, _ = tiny_pair_loader()
    prompts, kernels = tiny_prompts(), kernel_candidates("cpu", "float32")[:1]

    def strict_at(tokens: int, budget: float | None, cache: str):
        request = Request(SamplingConfig(), trees=CANDIDATES[:1], budget=budget, max_new_tokens=tokens,
                          cache_dir=tmp_path / cache, log=lambda _: None)
        return measure(load, kernels, prompts, request).records["strict"]
    short, long = strict_at(8, None, "a"), strict_at(128, None, "a")
    assert (short.budget_s, short.max_new_tokens, short.cached) == (DEFAULT_BUDGET, 8, False)
    assert (long.budget_s, long.max_new_tokens, long.cached) == (DEFAULT_BUDGET, TIMED_TOKENS, False)
    again = strict_at(TIMED_TOKENS, None, "a")
    assert again.cached and again.cache == long.cache
    assert strict_at(128, 3.0, "b").budget_s == 3.0
