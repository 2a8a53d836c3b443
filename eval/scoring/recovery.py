"""Quality recovery of a method against strict verification, with what it rests on.

The paper's recovery is quality(method) / quality(strict) on one benchmark. On a few questions that
ratio says little, and where strict scores about zero (a 135M model on HumanEval) it says nothing, so
a run reports, beside it:

  n            questions both methods answered (paired: the same questions, the same order)
  nonzero      questions on which either method scored above zero: what a 0/1 metric (accuracy,
               pass@1) actually rests on; 3 of 40 GSM8K questions solved is a ratio of two tiny counts
  low, high    a paired percentile bootstrap interval of the ratio of means (RESAMPLES resamples of the
               questions with replacement, fixed seed, so a rerun gives the same figures); resamples
               whose strict mean is zero have no ratio and are left out, and when more of them are
               left out than the interval's tail share, the interval is given as unknown (None)
  undefined    why there is no recovery at all: strict scored zero on every question, or above zero on fewer than
               MIN_SCORED_SHARE of them (a 135M model on GSM8K or HumanEval: a ratio of two near-zero means says
               nothing about kept quality), or nothing was paired (the recovery and interval are then None)

The per-question figure resampled is the benchmark's own (`Benchmark.figure_of_question`): the headline's
per-question value (correct, passed, ROUGE-L), or its sentence-level form where the headline is a corpus
figure (WMT19: sentence BLEU under corpus BLEU). The point estimate is the headline's ratio, as the paper's.

Two figures that hold at small n go beside it: agreement with strict's answers (`agreement`: ROUGE-L and
exact match per turn; at T = 0 strict's answers are plain decoding's, so any difference is the
relaxation's; at T = 1 two lossless samples differ too, and vanilla's agreement with strict is the
floor to read a relaxed method's against), and the target's mean log-likelihood of each method's
answers (`eval.scoring.quality`, bench.quality=[loglik]).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from eval.scoring.text import mean_figure, vs_vanilla_each

RESAMPLES = 2000
LEVEL = 0.95
MIN_SCORED_SHARE = 0.1  # strict must score above zero on at least this share of the questions for a recovery


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def paired_recovery(method: Sequence[float], strict: Sequence[float], *, resamples: int = RESAMPLES,
                    level: float = LEVEL, seed: int = 0) -> dict:
    """{"n", "nonzero", "recovery", "low", "high", "level", "undefined"} of per-question figures paired by
    position (method[i] and strict[i] score the same question); see the module docstring."""
    if len(method) != len(strict):
        raise ValueError(f"paired figures need one strict figure per question ({len(method)} vs {len(strict)})")
    n = len(method)
    out = {"n": n, "nonzero": sum(1 for m, s in zip(method, strict, strict=True) if m > 0 or s > 0),
           "recovery": None, "low": None, "high": None, "level": level, "undefined": None}
    if n == 0:
        out["undefined"] = "no question answered by both"
        return out
    if sum(strict) == 0:
        out["undefined"] = f"strict scores 0 on all {n} questions"
        return out
    scored = sum(1 for s in strict if s > 0)
    if scored < MIN_SCORED_SHARE * n:
        out["undefined"] = (f"strict scores above 0 on {scored} of {n} questions, under {MIN_SCORED_SHARE:.0%}: a "
                            "score about 0, left out of recovery")
        return out
    out["recovery"] = _mean(method) / _mean(strict)
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        den = sum(strict[i] for i in picks)
        if den > 0:
            ratios.append(sum(method[i] for i in picks) / den)
    tail = (1 - level) / 2
    if resamples - len(ratios) > tail * resamples:  # the dropped resamples could hold either end
        return out
    ratios.sort()
    # Percentiles over all resamples, the dropped ones (strict mean 0: an unbounded ratio) counted as +inf.
    out["low"] = ratios[int(tail * resamples)]
    top = int((1 - tail) * resamples) - 1
    out["high"] = ratios[top] if top < len(ratios) else None
    return out


def agreement(answers: Sequence[Sequence[str]], strict: Sequence[Sequence[str]]) -> dict:
    """{"rougeL_vs_strict", "exact_match_vs_strict", "n"}: each answer's turns against strict's answer to the
    same question (ROUGE-L F x100, identical after collapsing whitespace), the mean over every turn."""
    each = vs_vanilla_each(answers, strict)
    return {"rougeL_vs_strict": mean_figure(each, "rougeL_vs_vanilla"),
            "exact_match_vs_strict": mean_figure(each, "exact_match_vs_vanilla"), "n": len(answers)}
