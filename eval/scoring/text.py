"""Text metrics of task quality, as pure functions over strings: final numbers (GSM8K, AIME), BLEU and
chrF (sacrebleu), ROUGE (rouge-score), SQuAD token F1, agreement with the same model's vanilla answers,
and the paper's quality recovery. Benchmarks (`eval.benchmarks`) say which apply to them.

Scales: rates of questions are fractions in [0, 1]; overlap scores are in [0, 100].
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from itertools import zip_longest
from typing import TYPE_CHECKING

import sacrebleu

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
VS_VANILLA = ("rougeL_vs_vanilla", "token_f1_vs_vanilla", "exact_match_vs_vanilla")

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

# --- final numbers (GSM8K, AIME) ------------------------------------------------------------------

# A number: optional minus (not when glued to a preceding word, digit or dot, so "3-5" is 3 and 5),
# digits with well-formed thousands commas or plain digits, optional decimals; or a bare ".5".
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_FRAC = re.compile(r"(-?)\\[dt]?frac\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}")
_SLASH = re.compile(r"(?<![\w.])(-?\d+)\s*/\s*(\d+)(?![\w.])")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def _clean_math(text: str) -> str:
    """Text with LaTeX and unit noise that hides numbers removed: $, %, degrees, thin spaces, \\text{}."""
    text = text.replace("\u2212", "-").replace("{,}", ",")  # Unicode minus; "1{,}000" is LaTeX for 1,000
    text = _TEXT_COMMAND.sub(r" \1 ", text)
    text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", text)
    for noise in ("\\,", "\\!", "\\$", "$", "\\%", "%", "\\left", "\\right"):
        text = text.replace(noise, "")
    return text


def _number(match: str) -> str:
    return match.replace(",", "")


def _last_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} (or \\fbox{...}), nested braces balanced; None if there is none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\b", text)]
    for start in reversed(starts):
        rest = text[start:].lstrip()
        if not rest.startswith("{"):  # "\boxed 5": the next token
            token = rest.split()[0] if rest.split() else ""
            if token:
                return token.rstrip(".$")
            continue
        depth = 0
        for i, char in enumerate(rest):
            depth += char == "{"
            depth -= char == "}"
            if depth == 0:
                return rest[1:i]
        # unbalanced (cut off by the token budget): try an earlier \boxed
    return None


def _boxed_value(content: str) -> str | None:
    """The number a \\boxed{} answer states: a fraction a/b, else the first number after the last '='."""
    content = _clean_math(content)
    frac = _FRAC.search(content)
    if frac:
        sign = "-" if (frac.group(1) == "-") != frac.group(2).startswith("-") else ""
        return f"{sign}{frac.group(2).lstrip('-')}/{frac.group(3)}"
    content = content.rsplit("=", 1)[-1]
    slash = _SLASH.search(content)
    if slash:
        return f"{slash.group(1)}/{slash.group(2)}"
    number = _NUMBER.search(content)
    if number:
        return _number(number.group())
    content = content.strip()
    return content or None  # no number (e.g. "\pi"): compared as text


def extract_final_number(text: str | None) -> str | None:
    """The final answer a solution states, as a string without thousands commas.

    Priority: the number after the last "#### ", else the value of the last \\boxed{...}, else the
    last number anywhere in the text. "$", "%", degrees and LaTeX spacing are ignored; a boxed
    \\frac{a}{b} becomes "a/b". None when the text holds no number.
    """
    if not text:
        return None
    hashes = re.findall(r"####([^\n]*)", text)
    if hashes:
        number = _NUMBER.search(_clean_math(hashes[-1]))
        if number:
            return _number(number.group())
    boxed = _last_boxed(text)
    if boxed is not None:
        value = _boxed_value(boxed)
        if value is not None:
            return value
    numbers = _NUMBER.findall(_clean_math(text))
    return _number(numbers[-1]) if numbers else None


def _as_fraction(value: str) -> Fraction | None:
    value = re.sub(r"[\s,$%]", "", value).replace("\\", "")
    try:
        return Fraction(value)  # accepts "18", "18.00", "-5", "3/4", "1e3"
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Whether two answers are the same number ("18" == "18.0" == "18.00", "1,800" == "1800", "3/4" == "0.75").

    Compared exactly as rationals; answers that are not numbers are compared as text without
    whitespace. None equals nothing.
    """
    if a is None or b is None:
        return False
    x, y = _as_fraction(a), _as_fraction(b)
    if x is not None and y is not None:
        return x == y
    return re.sub(r"\s", "", a) == re.sub(r"\s", "", b)


def gsm8k_reference_answer(reference: Sequence[str]) -> str | None:
    """The number after "####" on the last line of a GSM8K worked answer."""
    return extract_final_number(reference[-1]) if reference else None


def aime_reference_answer(reference: Sequence[str]) -> str | None:
    """The AIME answer (an integer; one reference reads "336^\\circ")."""
    return extract_final_number(reference[0]) if reference else None


def _accuracy(answers: Sequence[str], gold: Sequence[str | None]) -> float:
    if len(answers) != len(gold) or not answers:
        raise ValueError(f"need as many answers as references, at least one ({len(answers)} vs {len(gold)})")
    return sum(numbers_equal(extract_final_number(a), g) for a, g in zip(answers, gold, strict=True)) / len(answers)


def gsm8k_accuracy(answers: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Fraction of answers whose final number equals the reference's "#### N" (references as in gsm8k.jsonl)."""
    return _accuracy(answers, [gsm8k_reference_answer(r) for r in references])


def aime_accuracy(answers: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Fraction of answers whose final number equals the reference integer (references as in aime2025.jsonl)."""
    return _accuracy(answers, [aime_reference_answer(r) for r in references])


# --- overlap with references (WMT19, CNN/DM) -----------------------------------------------------

def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"need one reference per hypothesis, at least one ({len(hypotheses)} vs {len(references)})")


def bleu_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and chrF (0-100) against one reference each, sacrebleu's defaults (BLEU tokenizer 13a)."""
    _check_pairs(hypotheses, references)
    hyps, refs = list(hypotheses), [list(references)]  # sacrebleu takes a list of reference streams
    return {"bleu": sacrebleu.corpus_bleu(hyps, refs).score, "chrf": sacrebleu.corpus_chrf(hyps, refs).score}


def _rouge_scorer(types: Sequence[str]) -> RougeScorer:
    # Imported on use: rouge-score pulls in nltk and scipy (~1.5 s), which BLEU and accuracy never need.
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer(list(types), use_stemmer=True)


def rouge_each(hypotheses: Sequence[str], references: Sequence[str]) -> list[dict[str, float]]:
    """Per pair ROUGE-1/2/L F-measure x100 (rouge-score, Porter stemmer, its default English tokenizer)."""
    _check_pairs(hypotheses, references)
    scorer = _rouge_scorer(ROUGE_TYPES)
    each = []
    for hyp, ref in zip(hypotheses, references, strict=True):
        scores = scorer.score(ref, hyp)  # rouge-score's order is (target, prediction)
        each.append({t: 100 * scores[t].fmeasure for t in ROUGE_TYPES})
    return each


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1, ROUGE-2, ROUGE-L: rouge-score's F-measure (use_stemmer=True) per pair, mean over pairs, x100."""
    each = rouge_each(hypotheses, references)
    return {t: sum(s[t] for s in each) / len(each) for t in ROUGE_TYPES}


# --- reference-free: agreement with the same model's vanilla answers -----------------------------

def squash(text: str) -> str:
    """`text` with every run of whitespace one space and none at the ends: what "identical" and "contains"
    compare, so that a wrapped line or a trailing newline is no difference."""
    return " ".join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def _squad_tokens(text: str) -> list[str]:
    """SQuAD normalisation: lower case, punctuation and the articles a/an/the removed, split on whitespace."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 (0-1) of two texts; two texts without tokens score 1 if equal after normalisation, else 0."""
    pred, ref = _squad_tokens(prediction), _squad_tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _pairs(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """(answer turn, vanilla turn) over every turn of every question; a missing turn is the empty string."""
    if len(answers) != len(vanilla) or not answers:
        raise ValueError(f"need one vanilla answer per answer, at least one ({len(answers)} vs {len(vanilla)})")
    return [(a, v) for ans, van in zip(answers, vanilla, strict=True) for a, v in zip_longest(ans, van, fillvalue="")]


def _rougeL_pair(scorer: RougeScorer, answer: str, vanilla: str) -> float:
    # Identical texts score 100 by definition, also when both are empty (rouge-score gives 0 there).
    if squash(answer) == squash(vanilla):
        return 100.0
    return 100 * scorer.score(vanilla, answer)["rougeL"].fmeasure


def vs_vanilla_each(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """The three vanilla-agreement figures (`VS_VANILLA`) of every turn of every question, one dict per
    turn (per question: a list of turns; see the functions below for each figure)."""
    scorer = _rouge_scorer(["rougeL"])
    return [{"rougeL_vs_vanilla": _rougeL_pair(scorer, a, v), "token_f1_vs_vanilla": 100 * token_f1(a, v),
             "exact_match_vs_vanilla": float(squash(a) == squash(v))} for a, v in _pairs(answers, vanilla)]


def mean_figure(each: Sequence[dict[str, float]], key: str) -> float:
    """The mean of figure `key` over `each` (per-turn or per-question figures, at least one)."""
    return sum(e[key] for e in each) / len(each)


def rougeL_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Mean over all turns of ROUGE-L F x100 of each answer turn against vanilla's (per question: a list of turns).

    rouge-score's RougeScorer(use_stemmer=True), vanilla as the target; identical texts score 100.
    """
    return mean_figure(vs_vanilla_each(answers, vanilla), "rougeL_vs_vanilla")


def token_f1_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Mean over all turns of SQuAD token F1 x100 against vanilla's turn."""
    return mean_figure(vs_vanilla_each(answers, vanilla), "token_f1_vs_vanilla")


def exact_match_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Fraction of turns identical to vanilla's after collapsing whitespace."""
    return mean_figure(vs_vanilla_each(answers, vanilla), "exact_match_vs_vanilla")
