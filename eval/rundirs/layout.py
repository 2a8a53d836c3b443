"""Answer files and run directories: work is written as it finishes and never lost or mixed.

The one place the run-directory layout is spelled (the runner, the report, tracking and the scripts
use these names):

    <out_dir>/<method>-T<temperature>-<run id>[-shard<i>of<n>]/     `directory_name`
        identity.json            every setting that determines the method's answers (IDENTITY)
        answers/<method>.jsonl   one line per answered question (`answers_file`)
        skipped/<method>.jsonl   questions it could not answer, and why (kind=SKIPPED)
        summary.json, config.yaml   the job whose method it is: its figures, its resolved config
        .lock                    held by the job answering it

Answer files use the EAGLE / MARS layout, one JSON line per question:

    {"question_id", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text], "idxs": [cycles], "new_tokens": [n], "wall_time": [s]}],
     "eval": {...}}

`idxs` is our number of draft-verify cycles per turn (the reference tools store the last 0-based
loop index, one less). `eval` holds what the summary needs beyond that (token ids, accepted and
relaxed tokens, quality figures, verification counts, the token budget used), so a resumed run
summarises questions it did not generate itself exactly like new ones.

A run directory is named by a hash of everything that affects its answers (`run_id`): rerunning
the same settings finds the same directory and resumes; any other setting gets a directory of its
own. Nothing is truncated or deleted: a torn last line (a run killed mid-write) is dropped by an
atomic rewrite (temporary file + `os.replace`), and any other malformed line is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

from eagle.files import write_atomic
from eval.rundirs.jsonl import read_jsonl


def answer_record(question_id, model_id: str, turns: list[str], cycles: list[int], new_tokens: list[int],
                  wall_time: list[float], extra: dict) -> dict:
    return {
        "question_id": question_id,
        "answer_id": uuid.uuid4().hex,
        "model_id": model_id,
        "tstamp": time.time(),
        "choices": [{"index": 0, "turns": turns, "idxs": cycles, "new_tokens": new_tokens, "wall_time": wall_time}],
        "eval": extra,
    }


SUMMARY, IDENTITY, CONFIG, LOCK = "summary.json", "identity.json", "config.yaml", ".lock"
ANSWERS, SKIPPED = "answers", "skipped"  # the kinds of answer file
# An answer record's "timing" (eval.runner.locks.timed) holds the CPU seconds other processes of ours used
# while it was timed. More than this share of one core of its wall time marks it contended, and a method
# whose answers add up to more marks its speed figures contended (eval.reporting.metrics).
CONTENDED_SHARE = 0.1


def run_id(identity: dict) -> str:
    """A short stable hash of the settings that determine a run's answers (key order does not matter)."""
    return hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]


def directory_name(method: str, temperature: float, identity: dict) -> str:
    """A method's run directory name: its display name, temperature and the hash of its identity, and the
    shard it answers (identity["shard"], "i/n" as validated: -shard<i>of<n>)."""
    name = f"{method}-T{temperature:g}-{run_id(identity)}"
    shard = identity.get("shard")
    return name + (f"-shard{shard.replace('/', 'of')}" if shard else "")


def answers_file(directory: Path, method: str, kind: str = ANSWERS) -> Path:
    """A method's answers (kind ANSWERS) or skipped questions (SKIPPED) in its run directory."""
    return directory / kind / f"{method}.jsonl"


def run_directory_of(answers: Path) -> Path | None:
    """The run directory an answers file lies in (None for a file outside the layout)."""
    return answers.parent.parent if answers.parent.name in (ANSWERS, SKIPPED) else None


def read_answers(path: str | Path) -> list[dict]:
    """The records of a JSONL answer file, in file order; [] if it does not exist.

    A last line without its newline that is not valid JSON is a run killed mid-write and is
    ignored; any other line that is not a JSON object raises a ValueError naming file and line.
    """
    return _parse(Path(path))[0]


def _parse(path: Path) -> tuple[list[dict], bool]:
    """(records, whether a torn last line was skipped)."""
    if not path.exists():
        return [], False
    lines = read_jsonl(path)
    for n, record in lines.records:
        if not isinstance(record, dict) or "question_id" not in record:
            raise ValueError(f"{path}:{n}: not an answer record (a JSON object with 'question_id')")
    return lines.values(), lines.torn


class AnswerFile:
    """Appends one record per finished question and flushes it; what is already there is kept."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records, torn = _parse(self.path)
        if torn:  # drop the torn last line; the complete records are rewritten as they were read
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))
        self.records = {r["question_id"]: r for r in records}

    def done(self, question_id) -> bool:
        return question_id in self.records

    def append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[record["question_id"]] = record
