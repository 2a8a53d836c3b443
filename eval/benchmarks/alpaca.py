"""Alpaca instructions (Taori et al. 2023), as in the speculative-decoding sets: scored against the reference
answers the local file holds (ROUGE-1/2/L F x100, as CNN/DM against its highlights), and, where vanilla's
answers are given, agreement with them (ROUGE-L, token F1 and exact match against vanilla: agreement, not
quality, since a changed continuation can be as good), and an LLM judge's rating where one is configured.

A question without a reference (a hub copy that lost them) falls back to the vanilla comparison alone."""

from __future__ import annotations

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.benchmarks.against_vanilla import score_against_vanilla
from eval.scoring.text import ROUGE_TYPES, rouge_each


@register_benchmark
class Alpaca(Benchmark):
    name = "alpaca"
    headline = "rougeL"  # against the reference answers
    hub = HubSource("tatsu-lab/alpaca", split="train")

    def from_hub(self, row: dict, index: int) -> dict:
        prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
        return {"question_id": index, "category": "", "turns": [prompt], "reference": [row["output"]]}

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        referenced = [qid for qid in answers if (questions[qid].get("reference") or [""])[0]]
        if len(referenced) < len(answers):
            raise ValueError(f"{len(answers) - len(referenced)} alpaca questions have no reference answer in the "
                             "benchmark file: score them against vanilla (eval.score --baseline) instead")
        rouge = rouge_each([answers[qid][0] for qid in referenced],
                           [questions[qid]["reference"][0] for qid in referenced])
        metrics = {t: sum(r[t] for r in rouge) / len(rouge) for t in ROUGE_TYPES}
        each = {qid: dict(r) for qid, r in zip(referenced, rouge, strict=True)}
        if context.baseline is not None or context.judge:  # agreement with vanilla's answers; a judge's rating
            agreement, per = score_against_vanilla(self.name, answers, questions, context)
            metrics |= agreement
            for qid, figures in per.items():
                each.setdefault(qid, {}).update(figures)
        return metrics, each
