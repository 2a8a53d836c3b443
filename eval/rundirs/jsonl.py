"""The one reader of JSON-lines files (questions, answers, judge prompts, HumanEval's tasks), and its
one policy for a torn last line.

A process killed while appending leaves a last line with no newline after it that is not valid JSON:
that line is skipped (`JsonLines.torn` says so, and the file's next writer drops it). Any other
malformed line is an error naming the file, the line and the fix.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class JsonLines:
    records: list[tuple[int, Any]]  # (line number, parsed value) of every non-blank line
    torn: bool  # a torn last line was skipped

    def values(self) -> list[Any]:
        return [value for _, value in self.records]


def read_jsonl(path: str | Path) -> JsonLines:
    """Every non-blank line of a JSON-lines file (gzip-compressed when it ends in .gz), parsed."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            if n == len(lines):  # nothing after it, not even a newline: torn by a kill
                return JsonLines(records, True)
            raise ValueError(f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno}); each line is one JSON "
                             "object: fix or delete that line (or restore the file from its source)") from None
    return JsonLines(records, False)
