"""Scoring answer files on a registered benchmark: answers indexed by question, the benchmark's
own scorer called with what it needs (references, the same model's vanilla answers, a judge).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from eval.benchmarks import BENCHMARKS, ScoreContext, benchmark, question_records
from eval.rundirs.jsonl import read_jsonl

# --- benchmark files and answer records ----------------------------------------------------------

def questions_by_id(bench: str, data_dir: str | Path | None = None, source: str = "local") -> dict[str, dict]:
    """The question records of `bench`, keyed by str(question_id), in file order (`question_records`)."""
    try:
        records = question_records(benchmark(bench).name, data_dir, source=source)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (score(): data_dir=...; command line: --data-dir DIR)") from None
    return {str(r["question_id"]): r for r in records}


def load_references(bench: str, data_dir: str | Path | None = None) -> dict[int | str, list[str]]:
    """question_id (as in the file) -> reference list ([] for sets without references)."""
    return {q["question_id"]: list(q.get("reference") or []) for q in questions_by_id(bench, data_dir).values()}


def answer_turns(record: dict, where: str = "answer") -> list[str]:
    """choices[0]["turns"] of an answer record, checked (non-empty list of strings)."""
    if not isinstance(record, dict) or "question_id" not in record:
        raise ValueError(f"{where}: not an answer record (a JSON object with 'question_id' and 'choices')")
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"{where}: answer to question {record['question_id']} has no 'choices' "
                         "(expected choices[0]['turns'], the EAGLE / MARS answer layout)")
    turns = choices[0].get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: answer to question {record['question_id']} has no 'turns' list of strings "
                         "in choices[0]")
    return turns


def read_answer_file(path: str | Path) -> list[dict]:
    """The answer records of a JSONL file, each checked to have choices[0]["turns"].

    A last line without its newline that is not valid JSON is a run killed mid-write: skipped with a
    warning. Any other malformed line, a record without turns, or a file without answers is a
    ValueError naming the file (and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"answer file {path} does not exist")
    lines = read_jsonl(path)
    if lines.torn:
        warnings.warn(f"{path}: ignoring an incomplete last line (a run stopped mid-write)", stacklevel=2)
    records = []
    for n, record in lines.records:
        answer_turns(record, f"{path}:{n}")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no answers")
    return records


def index_answers(records: Sequence[dict], questions: dict[str, dict], bench: str, what: str) -> dict[str, list[str]]:
    """str(question_id) -> turns to score, for records answering questions of `bench`.

    The number of turns scored is the question's; a later record for the same question replaces an
    earlier one (as a resumed run's file would read).
    """
    if not records:
        raise ValueError(f"no {what} to score")
    turns: dict[str, list[str]] = {}
    for i, record in enumerate(records):
        answer = answer_turns(record, f"{what} {i}")  # checks the record before its id is used
        turns[str(record["question_id"])] = answer
    unknown = [qid for qid in turns if qid not in questions]
    if unknown:
        raise ValueError(f"{len(unknown)} of {len(turns)} {what} are for questions not in {bench}.jsonl "
                         f"(question ids {', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}); the answer "
                         "file is probably for another benchmark")
    if len(turns) < len(records):
        warnings.warn(f"{len(records) - len(turns)} {what} repeat a question; the last answer of each is scored",
                      stacklevel=3)
    for qid, answer in turns.items():
        needed = len(questions[qid]["turns"])
        if len(answer) < needed:
            raise ValueError(f"{what}: the answer to question {qid} has {len(answer)} turn(s), the question {needed}")
        turns[qid] = answer[:needed]
    return turns


# --- scoring -------------------------------------------------------------------------------------

def score(bench: str, records: list[dict], data_dir: str | Path | None = None, baseline: list[dict] | None = None,
          judge: dict | None = None, *, per_question: bool = False, source: str = "local") -> dict:
    """Quality of `records` (answer records) on `bench`: {"bench", "n", <metrics>, "metric", ["per_question"]}.

    `n` is the number of questions scored. `baseline`: the same model's vanilla answers, needed by
    the sets scored against vanilla (mt_bench, alpaca, qa, spec_bench). `judge`: {"url", "key", "model"}
    of an LLM judge for those sets; None uses $MARS_JUDGE_URL / $MARS_JUDGE_KEY if both are set, else
    no judge. `per_question=True` adds {question_id: {...}} with each question's figures. `source`:
    where the questions come from (`eval.benchmarks.question_records`).
    """
    questions = questions_by_id(bench, data_dir, source)  # an unknown benchmark is refused here
    spec = benchmark(bench)
    if judge and not spec.vs_vanilla:
        raise ValueError(f"the LLM judge grades the sets scored against vanilla "
                         f"({', '.join(n for n, b in BENCHMARKS.items() if b.vs_vanilla)}); {bench} is scored "
                         "against references")
    answers = index_answers(records, questions, bench, "answers")
    vanilla = index_answers(baseline, questions, bench, "baseline answers") if baseline is not None else None
    context = ScoreContext(records, vanilla, judge, data_dir, per_question)
    metrics, each = spec.score(answers, questions, context)
    n = metrics.pop("n", len(answers))
    summary = {"bench": bench, "n": n, **metrics,
               "metric": "judge_score" if "judge_score" in metrics else spec.headline}
    if per_question:
        summary["per_question"] = each
    return summary
