"""GSM8K (Cobbe et al. 2021), test split: accuracy of the final number against the one after "####"."""

from __future__ import annotations

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.scoring.text import extract_final_number, gsm8k_reference_answer, numbers_equal


def score_final_numbers(answers: dict[str, list[str]], questions: dict[str, dict], gold_of) -> tuple[dict, dict]:
    each = {}
    for qid, turns in answers.items():
        gold, given = gold_of(questions[qid].get("reference") or []), extract_final_number(turns[0])
        each[qid] = {"correct": numbers_equal(given, gold), "answer": given, "reference": gold}
    return {"accuracy": sum(e["correct"] for e in each.values()) / len(each)}, each


@register_benchmark
class GSM8K(Benchmark):
    name = "gsm8k"
    headline = "accuracy"
    question_figure = "correct"
    hub = HubSource("openai/gsm8k", split="test", config="main")

    def from_hub(self, row: dict, index: int) -> dict:
        return {"question_id": index, "category": "math", "turns": [row["question"]], "reference": [row["answer"]]}

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        return score_final_numbers(answers, questions, gsm8k_reference_answer)
