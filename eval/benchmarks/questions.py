"""A benchmark question, and how one record of a question file becomes one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Question:
    question_id: int | str
    turns: list[str]
    category: str = ""
    meta: dict = field(default_factory=dict)  # e.g. file and name of a stdlib prompt; completion_prompt
    reference: list[str] | None = None  # reference answers, where the set has them


def read_question(record, where: str) -> Question:
    """The `Question` of one record of the JSONL layout (`turns`, or a single `prompt`); `where` (file:line,
    or a hub row) names the record in the ValueError a malformed one raises."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a question is a JSON object, got {type(record).__name__}")
    if "turns" in record:
        turns = record["turns"]
    elif "prompt" in record:
        turns = [record["prompt"]]
    else:
        raise ValueError(f"{where}: a question needs 'turns' (list of user turns) or 'prompt'")
    if isinstance(turns, str):
        turns = [turns]
    if "question_id" not in record or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: a question needs a 'question_id' and non-empty string turns")
    reference = record.get("reference")
    if isinstance(reference, str):  # a single reference answer; the public sets give lists
        reference = [reference]
    meta = {k: v for k, v in record.items() if k not in ("question_id", "turns", "prompt", "category", "reference")}
    return Question(record["question_id"], list(turns), record.get("category", ""), meta,
                    list(reference) if isinstance(reference, list) else None)
