"""Spec-Bench (Xia et al., Findings of ACL 2024; github.com/hemingkx/Spec-Bench): 480 questions in 13
categories: the 8 MT-bench categories (10 each, two turns), translation (WMT14 de->en), summarization
(CNN/DM), qa (Natural Questions), math_reasoning (GSM8K) and rag (DPR), 80 each. Its leaderboard
reports speedup and tau per category; `eval.report` does too (`by_category`).

Quality, with the existing scorers where the category has references: translation BLEU/chrF,
summarization ROUGE, math_reasoning accuracy of the final number, rag whether the answer contains one
of the reference answers and token F1 against the best one; every category (qa and MT-bench's have
no references) against the same model's vanilla answers, the headline.
"""

from __future__ import annotations

from eval.benchmarks import ScoreContext, register_benchmark
from eval.benchmarks.against_vanilla import AgainstVanilla, score_against_vanilla
from eval.benchmarks.gsm8k import score_final_numbers
from eval.benchmarks.sum import score_summaries
from eval.benchmarks.wmt19 import score_translation
from eval.scoring.text import gsm8k_reference_answer, squash, token_f1


def _flat(references) -> list[str]:
    """RAG references come as [[answer, ...]]: one list of acceptable answers."""
    out = []
    for r in references or []:
        out.extend(_flat(r) if isinstance(r, list) else [str(r)])
    return out


def score_open_answers(answers: dict[str, list[str]], questions: dict[str, dict]) -> tuple[dict, dict]:
    each = {}
    for qid, turns in answers.items():
        refs = _flat(questions[qid].get("reference"))
        text = squash(turns[0]).lower()
        each[qid] = {"contains_answer": any(squash(r).lower() in text for r in refs),
                     "token_f1": max((token_f1(turns[0], r) for r in refs), default=0.0)}
    n = len(each)
    return {"contains_answer": sum(e["contains_answer"] for e in each.values()) / n,
            "token_f1": sum(e["token_f1"] for e in each.values()) / n}, each


# category -> how its answers are scored against references
BY_REFERENCE = {
    "translation": lambda answers, questions, context: score_translation(answers, questions, context.per_question),
    "summarization": lambda answers, questions, context: score_summaries(answers, questions),
    "math_reasoning": lambda answers, questions, context: score_final_numbers(answers, questions,
                                                                              gsm8k_reference_answer),
    "rag": lambda answers, questions, context: score_open_answers(answers, questions),
}


@register_benchmark
class SpecBench(AgainstVanilla):
    name = "spec_bench"
    by_category = True
    # The question file of the Spec-Bench repository (data/spec_bench/question.jsonl) is not on the hub as
    # a dataset; its JSONL layout is this project's: bench.source=local (the default).
    hub = None

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        metrics: dict = {}
        each: dict[str, dict] = {qid: {} for qid in answers}
        for category, scorer in BY_REFERENCE.items():
            chosen = {qid: a for qid, a in answers.items() if questions[qid].get("category") == category}
            if chosen:
                found, per = scorer(chosen, questions, context)
                metrics |= {f"{category}/{k}": v for k, v in found.items()}
                for qid, figures in per.items():
                    each[qid] |= figures
        if context.baseline is not None or context.judge:
            found, per = score_against_vanilla(self.name, answers, questions, context)
            metrics |= found
            for qid, figures in per.items():
                each[qid] |= figures
        return metrics, each
