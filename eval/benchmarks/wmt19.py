"""WMT19 zh->en news translation: corpus BLEU (13a) and chrF with sacrebleu, one reference each."""

from __future__ import annotations

import sacrebleu

from eval.benchmarks import Benchmark, HubSource, ScoreContext, register_benchmark
from eval.scoring.text import bleu_chrf

INSTRUCTION = "Translate the following Chinese text to English.\n\n"  # the collected set's wording


def first_reference(question: dict) -> str:
    references = question.get("reference") or []
    if not references:
        raise ValueError(f"question {question['question_id']} has no reference in the benchmark file")
    return references[0]


def score_translation(answers: dict[str, list[str]], questions: dict[str, dict],
                      per_question: bool) -> tuple[dict, dict]:
    hyps = [turns[0] for turns in answers.values()]
    refs = [first_reference(questions[qid]) for qid in answers]
    each = {}
    if per_question:  # sentence-level figures only on request: they are for reading, not for the headline
        each = {qid: {"bleu": sacrebleu.sentence_bleu(h, [r]).score, "chrf": sacrebleu.sentence_chrf(h, [r]).score}
                for qid, h, r in zip(answers, hyps, refs, strict=True)}
    return bleu_chrf(hyps, refs), each


@register_benchmark
class WMT19(Benchmark):
    name = "wmt19"
    headline = "bleu"
    question_figure = "bleu"  # sentence BLEU: the corpus figure has no per-question parts
    hub = HubSource("wmt/wmt19", split="validation", config="zh-en")

    def from_hub(self, row: dict, index: int) -> dict:
        pair = row["translation"]
        return {"question_id": index, "category": "translation", "turns": [INSTRUCTION + pair["zh"]],
                "reference": [pair["en"]]}

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        return score_translation(answers, questions, context.per_question)
