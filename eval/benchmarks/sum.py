"""CNN/DailyMail summarisation (See et al. 2017): ROUGE-1/2/L F x100 against the highlights."""

from __future__ import annotations

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.benchmarks.wmt19 import first_reference
from eval.scoring.text import ROUGE_TYPES, rouge_each


def score_summaries(answers: dict[str, list[str]], questions: dict[str, dict]) -> tuple[dict, dict]:
    hyps = [turns[0] for turns in answers.values()]
    each = rouge_each(hyps, [first_reference(questions[qid]) for qid in answers])
    return {t: sum(e[t] for e in each) / len(each) for t in ROUGE_TYPES}, dict(zip(answers, each, strict=True))


@register_benchmark
class CNNDailyMail(Benchmark):
    name = "sum"
    headline = "rougeL"
    hub = HubSource("abisee/cnn_dailymail", split="test", config="3.0.0")

    def from_hub(self, row: dict, index: int) -> dict:
        return {"question_id": index, "category": "summarization", "turns": [f"Summarize: {row['article']}\nTL;DR:"],
                "reference": [row["highlights"]]}

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        return score_summaries(answers, questions)
