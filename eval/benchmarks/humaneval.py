"""HumanEval (Chen et al. 2021): pass@1 of the answers' code against the official unit tests, each
program run in the sandbox (`eval.scoring.sandbox`)."""

from __future__ import annotations

from pathlib import Path

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.rundirs.jsonl import read_jsonl  # the original tasks with their unit tests, next to humaneval.jsonl
from eval.scoring.unit_tests import TASKS_FILE

INSTRUCTION = "Complete the code I provided.\n\n"  # the collected set's wording


@register_benchmark
class HumanEval(Benchmark):
    name = "humaneval"
    headline = "pass@1"
    question_figure = "passed"
    side_files = (TASKS_FILE,)  # the official tasks with their unit tests (completion prompts; scoring)
    sandboxed = True  # model-written programs run against the tests
    hub = HubSource("openai/openai_humaneval", split="test")

    def from_hub(self, row: dict, index: int) -> dict:
        # The hub rows carry the tests too: kept as the question's task, scored without the side file.
        task = {k: row[k] for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}
        return {"question_id": int(row["task_id"].split("/")[1]), "category": "code",
                "turns": [INSTRUCTION + row["prompt"]], "completion_prompt": row["prompt"], "task": task}

    def prepare(self, questions: list, directory: Path | None) -> None:
        """HumanEval's own prompt (signature + docstring) as `meta["completion_prompt"]`, by task number:
        the set's turns ask a chat model to write the function; a base model continues the header."""
        tasks = directory / TASKS_FILE if directory is not None else None
        if tasks is None or not tasks.exists():
            return  # chat formats do not need it; a completion model then gets the chat turn as text
        prompts = {int(r["task_id"].split("/")[1]): r["prompt"] for r in read_jsonl(tasks).values()}
        for q in questions:
            if q.question_id in prompts:
                q.meta.setdefault("completion_prompt", prompts[q.question_id])

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        from eval.scoring.unit_tests import score_humaneval

        tasks = {int(q["question_id"]): q["task"] for q in questions.values() if "task" in q} or None
        result = score_humaneval(context.records, data_dir=context.data_dir, tasks=tasks)
        return {"pass@1": result["pass@1"], "n": result["n"]}, result.get("per_question", {})
