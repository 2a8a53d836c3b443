"""Runs never lose or mix work: run directories named by their settings, resume after SIGKILL,
context budgets, errors before any model loads. On a tiny stand-in pair built from configs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import save_standin_pair
from hydra import compose, initialize_config_dir

from eval.answers import AnswerFile, read_answers
from eval.bench import REPO_ROOT
from eval.run import run, run_directory

pytestmark = pytest.mark.usefixtures("single_thread")
METHODS = ["generate", "vanilla", "strict", "mars@0.9"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return save_standin_pair(tmp_path_factory.mktemp("standin"))


def overrides(standin: Path, out: Path, *more: str) -> list[str]:
    return [f"model.target={standin / 'target'}", f"model.draft={standin / 'draft'}", "model.dtype=float32",
            "model.exact_attention=false", "num_prompts=2", "max_new_tokens=8", "threads=1", "warmup=false",
            f"out_dir={out}", f"methods=[{','.join(METHODS)}]", *more]


def config(standin: Path, out: Path, *more: str):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return compose("config", overrides=overrides(standin, out, *more))


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_run_lives_in_a_directory_named_by_its_settings_and_resumes_there(standin, tmp_path, capsys):
    out = tmp_path / "out"
    cfg = config(standin, out)
    summary = run(cfg)
    directory = run_directory(cfg)
    assert directory.parent == out and directory.name.startswith("T0-")
    assert json.loads((directory / "summary.json").read_text()) == json.loads(json.dumps(summary))
    methods = summary["methods"]
    assert list(methods) == METHODS
    # transformers' own greedy decoding and ours emit the same tokens (fp32); speedups against both.
    assert methods["generate"]["identical_to_vanilla"] == 1.0 and methods["strict"]["identical_to_vanilla"] == 1.0
    assert methods["strict"]["speedup_vs_generate"] > 0 and methods["strict"]["speedup"] > 0
    assert methods["mars@0.9"]["margin_histogram"]["theta"] == 0.9
    assert sum(methods["strict"]["margin_histogram"]["counts"]) > 0
    assert summary["quality_metric"] == "parse_rate" and "quality" in methods["strict"]
    assert "run:" in capsys.readouterr().out
    first = {m: read_answers(directory / "answers" / f"{m}.jsonl") for m in METHODS}
    assert all([r["question_id"] for r in recs] == [0, 1] for recs in first.values())

    # The same settings with more questions: the same directory, the finished answers kept as they were.
    again = run(config(standin, out, "num_prompts=3"))
    assert run_directory(config(standin, out, "num_prompts=3")) == directory
    for m in METHODS:
        resumed = read_answers(directory / "answers" / f"{m}.jsonl")
        assert [r["answer_id"] for r in resumed[:2]] == [r["answer_id"] for r in first[m]]
        assert [r["question_id"] for r in resumed] == [0, 1, 2]
    assert again["methods"]["vanilla"]["questions"] == 3

    # Another setting: another directory; the first one is not touched.
    before = snapshot(directory)
    run(config(standin, out, "max_new_tokens=4"))
    assert run_directory(config(standin, out, "max_new_tokens=4")) != directory
    assert snapshot(directory) == before
    with pytest.raises(ValueError, match="resume=false"):
        run(config(standin, out, "resume=false"))
    assert snapshot(directory) == before


def test_bad_settings_fail_before_any_model_loads(standin, tmp_path):
    missing = f"model.target={tmp_path / 'missing'}"  # would fail only when loading
    with pytest.raises(ValueError, match="unknown method 'mars@x'"):
        run(config(standin, tmp_path, missing, "methods=[vanilla,mars@x]"))
    with pytest.raises(ValueError, match="theta=1.5"):
        run(config(standin, tmp_path, missing, "methods=[mars@1.5]"))
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(config(standin, tmp_path, missing, "max_new_tokens=0"))
    with pytest.raises(FileNotFoundError, match="no_such_set"):
        run(config(standin, tmp_path, missing, "bench.questions=no_such_set"))
    assert not (tmp_path / "T0").exists() and not list(tmp_path.glob("T*"))  # nothing created
    with pytest.raises(FileNotFoundError, match="target model not found"):
        run(config(standin, tmp_path, missing))


def test_long_prompts_get_the_budget_that_fits_or_are_skipped_with_the_reason(standin, tmp_path):
    questions = tmp_path / "long.jsonl"
    # The stand-in's context is 2048 tokens; its tokenizer spends about one token per character here.
    fits = "x = 1\n" * 40
    tight = "y" * 2045
    too_long = "z" * 3000
    questions.write_text("".join(json.dumps({"question_id": i, "prompt": p}) + "\n"
                                 for i, p in enumerate([fits, tight, too_long])))
    cfg = config(standin, tmp_path / "out", f"bench.questions={questions}", "bench.name=long", "num_prompts=null",
                 "methods=[vanilla,strict]", "max_new_tokens=16")
    summary = run(cfg)
    directory = run_directory(cfg)
    for method in ("vanilla", "strict"):
        answers = {r["question_id"]: r for r in read_answers(directory / "answers" / f"{method}.jsonl")}
        assert answers[0]["eval"]["max_new_tokens"] == [16]
        budget = answers[1]["eval"]["max_new_tokens"][0]
        assert 0 < budget < 16 and answers[1]["choices"][0]["new_tokens"][0] <= budget
        skipped = read_answers(directory / "skipped" / f"{method}.jsonl")
        assert [s["question_id"] for s in skipped] == [2] and "fills the context" in skipped[0]["reason"]
    assert summary["methods"]["strict"]["questions"] == 2


def test_a_malformed_answer_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"question_id": 0}\nnot json\n{"question_id": 2}\n')
    with pytest.raises(ValueError, match=r"answers.jsonl:2: malformed JSON"):
        read_answers(path)
    path.write_text('{"question_id": 0}\n{"question_id": 1, "tor')  # torn by a kill: dropped atomically
    answers = AnswerFile(path)
    assert list(answers.records) == [0] and path.read_text() == '{"question_id": 0}\n'


def test_runs_killed_at_random_moments_resume_to_one_answer_per_question(standin, tmp_path):
    out = tmp_path / "out"
    args = overrides(standin, out, "num_prompts=6", "max_new_tokens=12")
    cfg = config(standin, out, "num_prompts=6", "max_new_tokens=12")
    directory = run_directory(cfg)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(0)
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-m", "eval.run", *args], cwd=REPO_ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill once answering has started (some answer lines exist) plus a random moment, or at a random time.
        start, wait = time.time(), rng.uniform(0.0, 1.5)
        while proc.poll() is None and time.time() - start < 60:
            lines = sum(len(read_answers(p)) for p in (directory / "answers").glob("*.jsonl")) \
                if (directory / "answers").exists() else 0
            if lines >= 1 + kills * 3:
                time.sleep(wait)
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2  # the test killed runs mid-way, not only after they had finished
    subprocess.run([sys.executable, "-m", "eval.run", *args], cwd=REPO_ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for m in METHODS:
        ids = [r["question_id"] for r in read_answers(directory / "answers" / f"{m}.jsonl")]
        assert sorted(ids) == list(range(6)), (m, ids)  # exactly one answer per question
    assert json.loads((directory / "summary.json").read_text())["methods"]["strict"]["questions"] == 6
