"""Answer files in the EAGLE / MARS answer format, one JSON line per question, written as they finish.

    {"question_id", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text], "idxs": [cycles], "new_tokens": [n], "wall_time": [s]}],
     "eval": {...}}

`idxs` is our number of draft-verify cycles per turn (the reference tools store the last 0-based
loop index, one less). `eval` holds what the summary needs beyond that (token ids, accepted and
relaxed tokens, quality figures, verification counts), so a resumed run summarises questions it
did not generate itself exactly like new ones.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path


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


def read_answers(path: str | Path) -> list[dict]:
    """Complete records of an answer file; a torn last line (a run killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class AnswerFile:
    """Appends one record per finished question and flushes it; `resume` keeps what is already there."""

    def __init__(self, path: str | Path, resume: bool):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            records = read_answers(self.path)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in records))  # drop a torn line
        else:
            records = []
            self.path.write_text("")
        self.records = {r["question_id"]: r for r in records}

    def done(self, question_id) -> bool:
        return question_id in self.records

    def append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        self.records[record["question_id"]] = record
