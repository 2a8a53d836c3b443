"""Benchmarks as plugins: the registry, public sets read through `datasets` (offline, from datasets built
here), Spec-Bench's categories, and a benchmark defined in this file run through eval.run and eval.score."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import save_standin_pair

from eval.benchmarks import (
    BENCHMARKS,
    Benchmark,
    HubSource,
    ScoreContext,
    benchmark,
    hub_records,
    load_questions,
    question_records,
    register_benchmark,
)
from eval.benchmarks.score_files import score
from eval.config.paths import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")

# One row per hub dataset, in that dataset's own schema (the columns `from_hub` reads).
HUB_ROWS = {
    "gsm8k": {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
    "humaneval": {"task_id": "HumanEval/7", "prompt": "def f(x):\n    \"\"\"Return x.\"\"\"\n",
                  "canonical_solution": "    return x\n", "test": "def check(f):\n    assert f(1) == 1\n",
                  "entry_point": "f"},
    "mt_bench": {"prompt_id": 81, "category": "writing", "prompt": ["Write a haiku.", "Now a limerick."],
                 "reference": []},
    "alpaca": {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    "qa": {"question": "who wrote hamlet", "answer": ["William Shakespeare"]},
    "wmt19": {"translation": {"zh": "你好", "en": "Hello"}},
    "sum": {"article": "A long article.", "highlights": "Short.", "id": "x"},
    "aime2025": {"question": "Find 1 + 1.", "answer": "2"},
}


def local_dataset(tmp_path: Path, row: dict) -> HubSource:
    """A dataset directory `datasets.load_dataset` reads like a hub repository (split "train")."""
    directory = tmp_path / "dataset"
    directory.mkdir(parents=True)
    (directory / "train.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    return HubSource(str(directory), split="train")


@pytest.mark.parametrize("name", sorted(HUB_ROWS))
def test_each_hub_mapping_gives_the_question_layout_through_datasets(name, tmp_path):
    assert BENCHMARKS[name].hub is not None
    records = hub_records(name, hub=local_dataset(tmp_path, HUB_ROWS[name]))
    assert len(records) == 2
    record = records[0]
    assert {"question_id", "turns"} <= set(record) and all(isinstance(t, str) and t for t in record["turns"])
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:1]))
    questions = load_questions(str(tmp_path / "set.jsonl"))  # the local layout reads them back
    assert questions[0].turns == record["turns"]


def test_hub_mappings_keep_what_scoring_needs(tmp_path):
    gsm = hub_records("gsm8k", hub=local_dataset(tmp_path / "g", HUB_ROWS["gsm8k"]))[0]
    assert gsm["reference"] == ["2 + 3 = 5\n#### 5"]
    he = hub_records("humaneval", hub=local_dataset(tmp_path / "h", HUB_ROWS["humaneval"]))[0]
    assert he["question_id"] == 7 and he["task"]["entry_point"] == "f" and he["completion_prompt"].startswith("def f")
    mt = hub_records("mt_bench", hub=local_dataset(tmp_path / "m", HUB_ROWS["mt_bench"]))[0]
    assert mt["turns"] == ["Write a haiku.", "Now a limerick."] and mt["category"] == "writing"


def test_offline_without_a_local_file_names_both_fixes(tmp_path):
    code = ("from eval.benchmarks import question_records\n"
            f"question_records('gsm8k', {str(tmp_path)!r}, source='auto')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "FileNotFoundError" in message and "openai/gsm8k" in message
    assert "gsm8k.jsonl in the benchmark directory" in message and "bench.source=hub" in message


def test_local_is_preferred_by_auto_and_required_by_local(tmp_path):
    assert question_records("gsm8k", source="auto") == question_records("gsm8k", source="local")
    with pytest.raises(FileNotFoundError, match=r"no gsm8k.jsonl in .*or read it from the Hugging Face hub"):
        question_records("gsm8k", tmp_path, source="local")
    with pytest.raises(ValueError, match="bench.source must be one of local, hub, auto"):
        question_records("gsm8k", source="web")


def test_spec_bench_takes_questions_category_by_category():
    questions = load_questions("spec_bench", limit=26)
    counts = Counter(q.category for q in questions)
    assert len(counts) == 13 and set(counts.values()) == {2}


def test_spec_bench_scores_each_category_with_references():
    questions = {q.question_id: q for q in load_questions("spec_bench")}
    chosen = [q for q in load_questions("spec_bench", limit=26)]

    def record(q, text):
        return {"question_id": q.question_id, "choices": [{"turns": [text] * len(q.turns)}]}

    def perfect(q):  # the reference where there is one, else anything
        ref = q.reference[0] if q.reference else "an answer"
        return ref if isinstance(ref, str) else ref[0]

    records = [record(q, perfect(q)) for q in chosen]
    result = score("spec_bench", records, baseline=records)
    assert result["metric"] == "rougeL_vs_vanilla" and result["rougeL_vs_vanilla"] == pytest.approx(100.0)
    assert result["translation/bleu"] == pytest.approx(100.0) and result["summarization/rougeL"] == pytest.approx(100)
    assert result["math_reasoning/accuracy"] == 1.0 and result["rag/contains_answer"] == 1.0
    wrong = score("spec_bench", [record(q, "no idea") for q in chosen], baseline=records)
    assert wrong["math_reasoning/accuracy"] == 0.0 and wrong["rag/contains_answer"] == 0.0
    assert questions[chosen[0].question_id].category == "writing"


@register_benchmark
class Riddles(Benchmark):
    """A benchmark this test file defines: exact answers to riddles."""

    name = "test_riddles"
    headline = "accuracy"

    def score(self, answers, questions, context: ScoreContext):
        each = {qid: {"correct": turns[0].strip() == questions[qid]["reference"][0]} for qid, turns in answers.items()}
        return {"accuracy": sum(e["correct"] for e in each.values()) / len(each)}, each


def test_a_benchmark_defined_outside_eval_runs_through_eval_run_and_eval_score(tmp_path):
    from hydra import compose, initialize_config_dir

    from eval.runner.job import run

    data = tmp_path / "bench"
    data.mkdir()
    riddles = [{"question_id": i, "category": "riddle", "turns": [f"What is {i} + {i}?"], "reference": [str(2 * i)]}
               for i in range(3)]
    (data / "test_riddles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in riddles))
    standin = save_standin_pair(tmp_path / "standin")
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=[
            f"model.target={standin / 'target'}", f"model.draft={standin / 'draft'}", "model.dtype=float32",
            "model.exact_attention=false", "max_new_tokens=4", "threads=1", "warmup=false", "tree=cpu",
            f"out_dir={tmp_path / 'out'}", "method=strict", "baselines=[vanilla]", "bench=embedded",
            "bench.name=test_riddles", "bench.questions=test_riddles", f"bench.data_dir={data}", "bench.quality=[]",
            "num_prompts=3"])
    summary = run(cfg)
    assert summary["quality_metric"] == "accuracy"
    assert summary["methods"]["strict"]["quality"]["accuracy"] == 0.0  # a random stand-in knows no sums
    answers = Path(summary["methods"]["strict"]["run_dir"]) / "answers" / "strict.jsonl"
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert score("test_riddles", records, data) == {"bench": "test_riddles", "n": 3, "accuracy": 0.0,
                                                     "metric": "accuracy"}
    assert benchmark("test_riddles") is BENCHMARKS["test_riddles"]


@register_benchmark
class Programs(Benchmark):
    """A benchmark this test file defines whose answers run as programs (as HumanEval's do)."""

    name = "test_programs"
    headline = "ran"
    sandboxed = True

    def score(self, answers, questions, context: ScoreContext):
        return {"ran": 1.0}, {qid: {} for qid in answers}


def test_the_sandbox_is_asked_of_the_benchmark(tmp_path, monkeypatch, capsys):
    """eval.run (before any model loads) and eval.score check the sandbox for a benchmark that says its
    answers run as programs (`Benchmark.sandboxed`), and for no other."""
    from types import SimpleNamespace

    from eval.runner.job import sandbox_level
    from eval.score import main as score_main
    from eval.scoring import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: "test-level")
    monkeypatch.setattr(sandbox, "allow_unisolated", lambda allow: None)
    assert [name for name, spec in BENCHMARKS.items() if spec.sandboxed] == ["humaneval", "test_programs"]

    def job(bench: str) -> SimpleNamespace:
        return SimpleNamespace(bench=SimpleNamespace(name=bench), sandbox=SimpleNamespace(allow_unisolated=False))

    assert sandbox_level(job("test_programs")) == "test-level"
    assert sandbox_level(job("test_riddles")) is None and sandbox_level(job("not_registered")) is None
    for name in ("test_programs", "test_riddles"):
        question = {"question_id": 0, "turns": ["1 + 1?"], "reference": ["2"]}
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(question) + "\n")
        answers = tmp_path / f"{name}_answers.jsonl"
        answers.write_text(json.dumps({"question_id": 0, "choices": [{"index": 0, "turns": ["2"]}]}) + "\n")
        capsys.readouterr()
        assert score_main([name, str(answers), "--data-dir", str(tmp_path)]) == 0
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert result.get("sandbox") == ("test-level" if name == "test_programs" else None), name


def test_the_paper_checks_the_side_files_a_benchmark_declares(tmp_path, monkeypatch):
    """`eval.paper` refuses to start without a benchmark's files: its questions and its declared side
    files (HumanEval's unit tests), taken from the plugin."""
    from eval.reporting.experiments import bench_files

    humaneval = type(BENCHMARKS["humaneval"])
    assert bench_files("humaneval", tmp_path) == [tmp_path / "humaneval.jsonl",
                                                   *(tmp_path / f for f in humaneval.side_files)]
    monkeypatch.setattr(humaneval, "side_files", ("tests_a.jsonl.gz", "tests_b.jsonl"))
    assert bench_files("humaneval", tmp_path) == [tmp_path / f for f in ("humaneval.jsonl", "tests_a.jsonl.gz",
                                                                         "tests_b.jsonl")]
    assert bench_files("gsm8k", tmp_path) == [tmp_path / "gsm8k.jsonl"]  # no side files


def test_no_module_imports_another_modules_private_names():
    """Helpers a module shares are public, with a docstring (the scoring helpers of eval.scoring.text);
    a name with a leading underscore is its own module's business."""
    found = []
    for package in ("eval", "mars", "eagle", "scripts"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("eval", "mars", "eagle"):
                    found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.module}.{a.name}"
                              for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
    from eval.scoring import text

    public = [f for name, f in vars(text).items()
              if inspect.isfunction(f) and f.__module__ == text.__name__ and not name.startswith("_")]
    assert {"squash", "mean_figure", "vs_vanilla_each"} <= {f.__name__ for f in public}
    assert [f.__name__ for f in public if not f.__doc__] == []


def test_alpaca_scores_quality_against_its_reference_answers_and_agreement_against_vanilla():
    """Quality is ROUGE against the file's reference answers (the headline); agreement with vanilla's answers is
    reported beside it, as agreement: a method that writes vanilla's answers agrees 100% whatever their quality."""
    questions = load_questions("alpaca", limit=3)

    def record(q, text):
        return {"question_id": q.question_id, "choices": [{"turns": [text]}]}

    references = [record(q, q.reference[0]) for q in questions]
    other = [record(q, "I cannot say.") for q in questions]
    perfect = score("alpaca", references, baseline=other)
    assert perfect["metric"] == "rougeL" and perfect["rougeL"] == pytest.approx(100.0)
    assert perfect["rougeL_vs_vanilla"] < 50  # far from vanilla's answers, yet the reference itself
    echo = score("alpaca", other, baseline=other)
    assert echo["rougeL_vs_vanilla"] == pytest.approx(100.0) and echo["rougeL"] < 50
    assert score("alpaca", other)["rougeL"] == echo["rougeL"]  # no baseline needed: the references are the yardstick
