"""AIME 2025 (30 problems): accuracy of the final number against the reference integer."""

from __future__ import annotations

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.benchmarks.gsm8k import score_final_numbers
from eval.scoring.text import aime_reference_answer

INSTRUCTION = ("Solve the following math problem step by step. At the end, Present the answer in LaTeX format: "
               "\\boxed{Your answer}.\n\n")  # the collected set's wording


@register_benchmark
class AIME2025(Benchmark):
    name = "aime2025"
    headline = "accuracy"
    question_figure = "correct"
    hub = HubSource("opencompass/AIME2025", split="test", config="AIME2025-I")

    def from_hub(self, row: dict, index: int) -> dict:
        return {"question_id": index, "category": "math", "turns": [INSTRUCTION + row["question"]],
                "reference": [str(row["answer"])]}

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        return score_final_numbers(answers, questions, aime_reference_answer)
