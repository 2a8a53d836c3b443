"""Task quality of answer files on the public benchmarks, and the `python -m eval.score` CLI.

    python -m eval.score BENCH ANSWERS.jsonl [--data-dir DIR] [--baseline VANILLA.jsonl] [--per-question]
                         [--judge-url URL --judge-key KEY --judge-model NAME]

prints a few readable lines, then the metrics as ONE JSON object on the last line of stdout; bad
input exits with code 2 and a one-line message.

Answers are JSONL records in the EAGLE / MARS layout (`question_id`, `choices[0]["turns"]`); the
scored text is the first turn, or every turn of a multi-turn set (MT-bench). Metrics per set
(scales: rates of questions are fractions in [0, 1]; overlap scores are in [0, 100]):

    humaneval   pass@1                    fraction of functions passing their unit tests (eval.humaneval)
    gsm8k       accuracy                  fraction whose final number (`extract_final_number`) equals the
                                          number after "####" in the reference
    aime2025    accuracy                  same, against the reference integer
    wmt19       bleu, chrf                sacrebleu corpus BLEU (tokenizer 13a) and chrF, one reference each
    sum         rouge1, rouge2, rougeL    rouge-score F-measure with Porter stemming, mean over questions, x100
    mt_bench,   rougeL_vs_vanilla         ROUGE-L F-measure x100 against the same model's vanilla answer
    alpaca, qa  token_f1_vs_vanilla       SQuAD-style token F1 x100 against the vanilla answer
                exact_match_vs_vanilla    fraction of answers equal to vanilla's up to whitespace
                judge_score               mean 1-10 rating of an LLM judge, only when one is configured (eval.judge)

The reference-free sets are compared with the same model's vanilla (plain greedy) output, as the
MARS paper does: a lossless method scores 100 / 100 / 1.0 there by construction. Means over
questions pool every scored turn (MT-bench: both turns). The headline metric (`metric`) is pass@1,
accuracy, bleu, rougeL, or rougeL_vs_vanilla (judge_score when a judge ran).
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING

import sacrebleu

from eval.bench import PUBLIC_SETS, bench_dir

REFERENCE_FREE = ("mt_bench", "alpaca", "qa")
HEADLINE = {"humaneval": "pass@1", "gsm8k": "accuracy", "aime2025": "accuracy", "wmt19": "bleu", "sum": "rougeL",
            "mt_bench": "rougeL_vs_vanilla", "alpaca": "rougeL_vs_vanilla", "qa": "rougeL_vs_vanilla"}
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

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

def _squash(text: str) -> str:
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
    if _squash(answer) == _squash(vanilla):
        return 100.0
    return 100 * scorer.score(vanilla, answer)["rougeL"].fmeasure


def _vs_vanilla_each(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """The three vanilla-agreement figures of every turn (see the public functions below)."""
    scorer = _rouge_scorer(["rougeL"])
    return [{"rougeL_vs_vanilla": _rougeL_pair(scorer, a, v), "token_f1_vs_vanilla": 100 * token_f1(a, v),
             "exact_match_vs_vanilla": float(_squash(a) == _squash(v))} for a, v in _pairs(answers, vanilla)]


def _mean(each: Sequence[dict[str, float]], key: str) -> float:
    return sum(e[key] for e in each) / len(each)


def rougeL_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Mean over all turns of ROUGE-L F x100 of each answer turn against vanilla's (per question: a list of turns).

    rouge-score's RougeScorer(use_stemmer=True), vanilla as the target; identical texts score 100.
    """
    return _mean(_vs_vanilla_each(answers, vanilla), "rougeL_vs_vanilla")


def token_f1_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Mean over all turns of SQuAD token F1 x100 against vanilla's turn."""
    return _mean(_vs_vanilla_each(answers, vanilla), "token_f1_vs_vanilla")


def exact_match_vs_vanilla(answers: Sequence[Sequence[str]], vanilla: Sequence[Sequence[str]]) -> float:
    """Fraction of turns identical to vanilla's after collapsing whitespace."""
    return _mean(_vs_vanilla_each(answers, vanilla), "exact_match_vs_vanilla")


def quality_recovery(method_value: float | None, reference_value: float | None) -> float | None:
    """The paper's quality recovery: method / reference (strict's, or vanilla's, figure).

    None when either value is missing or the reference is 0 (a ratio to nothing is not a recovery).
    """
    if method_value is None or reference_value is None or reference_value == 0:
        return None
    return method_value / reference_value


# --- benchmark files and answer records ----------------------------------------------------------

def _check_bench(bench: str) -> None:
    if bench not in PUBLIC_SETS:
        raise ValueError(f"unknown benchmark {bench!r}; known: {', '.join(PUBLIC_SETS)}")


def _bench_directory(data_dir: str | Path | None) -> Path:
    try:
        return bench_dir(data_dir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (score(): data_dir=...; command line: --data-dir DIR)") from None


def load_questions(bench: str, data_dir: str | Path | None = None) -> dict[str, dict]:
    """The records of `<bench>.jsonl` in the bench directory, keyed by str(question_id), in file order."""
    _check_bench(bench)
    path = _bench_directory(data_dir) / f"{bench}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no {path.name} in {path.parent}; point --data-dir / $MARS_BENCH_DIR at the "
                                "benchmark files")
    questions = {}
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: malformed JSON ({e.msg})") from None
                questions[str(record["question_id"])] = record
    return questions


def load_references(bench: str, data_dir: str | Path | None = None) -> dict[int | str, list[str]]:
    """question_id (as in the file) -> reference list ([] for sets without references)."""
    return {q["question_id"]: list(q.get("reference") or []) for q in load_questions(bench, data_dir).values()}


def answer_turns(record: dict, where: str = "answer") -> list[str]:
    """choices[0]["turns"] of an answer record, checked (non-empty list of strings)."""
    if not isinstance(record, dict) or "question_id" not in record:
        raise ValueError(f"{where}: not an answer record (a JSON object with 'question_id' and 'choices')")
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"{where}: answer to question {record['question_id']} has no 'choices' "
                         "(expected choices[0]['turns'], the EAGLE / MARS answer layout)")
    turns = choices[0].get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: answer to question {record['question_id']} has no 'turns' list of strings "
                         "in choices[0]")
    return turns


def read_answer_file(path: str | Path) -> list[dict]:
    """The answer records of a JSONL file, each checked to have choices[0]["turns"].

    A last line without its newline that is not valid JSON is a run killed mid-write: skipped with a
    warning. Any other malformed line, a record without turns, or a file without answers is a
    ValueError naming the file (and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"answer file {path} does not exist")
    lines = path.read_text().split("\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # nothing after it, not even a newline: torn by a kill
                warnings.warn(f"{path}:{n}: ignoring an incomplete last line (a run stopped mid-write)", stacklevel=2)
                break
            raise ValueError(f"{path}:{n}: malformed JSON ({e.msg}); fix or remove that line") from None
        answer_turns(record, f"{path}:{n}")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no answers")
    return records


def _index(records: Sequence[dict], questions: dict[str, dict], bench: str, what: str) -> dict[str, list[str]]:
    """str(question_id) -> turns to score, for records answering questions of `bench`.

    The number of turns scored is the question's; a later record for the same question replaces an
    earlier one (as a resumed run's file would read).
    """
    if not records:
        raise ValueError(f"no {what} to score")
    turns: dict[str, list[str]] = {}
    for i, record in enumerate(records):
        answer = answer_turns(record, f"{what} {i}")  # checks the record before its id is used
        turns[str(record["question_id"])] = answer
    unknown = [qid for qid in turns if qid not in questions]
    if unknown:
        raise ValueError(f"{len(unknown)} of {len(turns)} {what} are for questions not in {bench}.jsonl "
                         f"(question ids {', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}); the answer "
                         "file is probably for another benchmark")
    if len(turns) < len(records):
        warnings.warn(f"{len(records) - len(turns)} {what} repeat a question; the last answer of each is scored",
                      stacklevel=3)
    for qid, answer in turns.items():
        needed = len(questions[qid]["turns"])
        if len(answer) < needed:
            raise ValueError(f"{what}: the answer to question {qid} has {len(answer)} turn(s), the question {needed}")
        turns[qid] = answer[:needed]
    return turns


# --- scoring -------------------------------------------------------------------------------------

def score(bench: str, records: list[dict], data_dir: str | Path | None = None, baseline: list[dict] | None = None,
          judge: dict | None = None, *, per_question: bool = False) -> dict:
    """Quality of `records` (answer records) on `bench`: {"bench", "n", <metrics>, "metric", ["per_question"]}.

    `n` is the number of questions scored. `baseline`: the same model's vanilla answers, needed by
    the reference-free sets (mt_bench, alpaca, qa). `judge`: {"url", "key", "model"} of an LLM judge
    for those sets; None uses $MARS_JUDGE_URL / $MARS_JUDGE_KEY if both are set, else no judge.
    `per_question=True` adds {question_id: {...}} with each question's figures.
    """
    _check_bench(bench)
    if judge and bench not in REFERENCE_FREE:
        raise ValueError(f"the LLM judge grades {', '.join(REFERENCE_FREE)}; {bench} is scored against references")
    questions = load_questions(bench, data_dir)
    answers = _index(records, questions, bench, "answers")
    if bench == "humaneval":
        from eval.humaneval import score_humaneval  # imported here: it runs code, only this set needs it

        result = score_humaneval(records, data_dir=data_dir)
        metrics, each = {"pass@1": result["pass@1"]}, result.get("per_question", {})
        n = result["n"]
    elif bench in ("gsm8k", "aime2025"):
        metrics, each = _score_math(bench, answers, questions)
        n = len(answers)
    elif bench == "wmt19":
        metrics, each = _score_translation(answers, questions, per_question)
        n = len(answers)
    elif bench == "sum":
        metrics, each = _score_summaries(answers, questions)
        n = len(answers)
    else:
        metrics, each, n = _score_reference_free(bench, answers, questions, baseline, judge, data_dir)
    summary = {"bench": bench, "n": n, **metrics,
               "metric": "judge_score" if "judge_score" in metrics else HEADLINE[bench]}
    if per_question:
        summary["per_question"] = each
    return summary


def _score_math(bench: str, answers: dict[str, list[str]], questions: dict[str, dict]) -> tuple[dict, dict]:
    gold_of = gsm8k_reference_answer if bench == "gsm8k" else aime_reference_answer
    each = {}
    for qid, turns in answers.items():
        gold, given = gold_of(questions[qid].get("reference") or []), extract_final_number(turns[0])
        each[qid] = {"correct": numbers_equal(given, gold), "answer": given, "reference": gold}
    return {"accuracy": sum(e["correct"] for e in each.values()) / len(each)}, each


def _first_reference(question: dict) -> str:
    references = question.get("reference") or []
    if not references:
        raise ValueError(f"question {question['question_id']} has no reference in the benchmark file")
    return references[0]


def _score_translation(answers: dict[str, list[str]], questions: dict[str, dict],
                       per_question: bool) -> tuple[dict, dict]:
    hyps = [turns[0] for turns in answers.values()]
    refs = [_first_reference(questions[qid]) for qid in answers]
    each = {}
    if per_question:  # sentence-level figures only on request: they are for reading, not for the headline
        each = {qid: {"bleu": sacrebleu.sentence_bleu(h, [r]).score, "chrf": sacrebleu.sentence_chrf(h, [r]).score}
                for qid, h, r in zip(answers, hyps, refs, strict=True)}
    return bleu_chrf(hyps, refs), each


def _score_summaries(answers: dict[str, list[str]], questions: dict[str, dict]) -> tuple[dict, dict]:
    hyps = [turns[0] for turns in answers.values()]
    each = rouge_each(hyps, [_first_reference(questions[qid]) for qid in answers])
    return {t: sum(e[t] for e in each) / len(each) for t in ROUGE_TYPES}, dict(zip(answers, each, strict=True))


def _score_reference_free(bench: str, answers: dict[str, list[str]], questions: dict[str, dict],
                          baseline: list[dict] | None, judge: dict | None,
                          data_dir: str | Path | None) -> tuple[dict, dict, int]:
    from eval.judge import judge_answers, judge_config, load_judge_prompts

    config = judge_config(**(judge or {}))
    if judge and config is None:
        raise ValueError("the LLM judge needs both an endpoint URL and an API key (--judge-url and --judge-key, or "
                         "$MARS_JUDGE_URL and $MARS_JUDGE_KEY)")
    if baseline is None and config is None:
        raise ValueError(f"{bench} has no references: its answers are compared with the same model's vanilla answers. "
                         "Pass baseline=<vanilla records> (command line: --baseline VANILLA.jsonl), or configure an "
                         "LLM judge (--judge-url/--judge-key or $MARS_JUDGE_URL/$MARS_JUDGE_KEY)")
    metrics: dict = {}
    each: dict[str, dict] = {qid: {} for qid in answers}
    if baseline is not None:
        vanilla = _index(baseline, questions, bench, "baseline answers")
        common = [qid for qid in answers if qid in vanilla]
        if not common:
            raise ValueError("the baseline answers no question of the answer file; is it the vanilla run of the same "
                             "benchmark?")
        if len(common) < len(answers):
            warnings.warn(f"{len(answers) - len(common)} answers have no vanilla answer; compared on the other "
                          f"{len(common)}", stacklevel=3)
            metrics["n_vs_vanilla"] = len(common)
        names = ("rougeL_vs_vanilla", "token_f1_vs_vanilla", "exact_match_vs_vanilla")
        pooled = []
        for qid in common:  # per question, then pooled over every turn
            turns = _vs_vanilla_each([answers[qid]], [vanilla[qid]])
            each[qid] |= {name: _mean(turns, name) for name in names}
            pooled += turns
        metrics |= {name: _mean(pooled, name) for name in names}
    if config is not None:
        prompts = load_judge_prompts(_bench_directory(data_dir))
        ratings = judge_answers(questions, answers, config, prompts)
        valid = [r for turns in ratings.values() for r in turns if r is not None]
        metrics["judge_score"] = sum(valid) / len(valid)
        metrics["judge_failed"] = sum(r is None for turns in ratings.values() for r in turns)
        metrics["judge_model"] = config.model
        for qid, turns in ratings.items():
            each[qid]["judge"] = turns
    return metrics, each, len(answers)


# --- command line --------------------------------------------------------------------------------

def _describe(result: dict) -> list[str]:
    lines = [f"{result['bench']}: {result['n']} questions scored"]
    for key, value in result.items():
        if key in ("bench", "n", "metric", "per_question"):
            continue
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<24} {shown}{'   <- headline' if key == result['metric'] else ''}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", help=f"benchmark: {', '.join(PUBLIC_SETS)}")
    parser.add_argument("answers", help="answer file (JSONL, EAGLE / MARS layout)")
    parser.add_argument("--data-dir", help="directory of the benchmark files (default $MARS_BENCH_DIR or "
                        "../shared/data/bench)")
    parser.add_argument("--baseline", help="the same model's vanilla answers (mt_bench, alpaca, qa)")
    parser.add_argument("--per-question", action="store_true", help="include each question's figures in the JSON")
    parser.add_argument("--judge-url", help="OpenAI-compatible endpoint of an LLM judge (or $MARS_JUDGE_URL)")
    parser.add_argument("--judge-key", help="its API key (or $MARS_JUDGE_KEY)")
    parser.add_argument("--judge-model", help="judge model name (or $MARS_JUDGE_MODEL; default gpt-4)")
    args = parser.parse_args(argv)

    from eval.judge import JudgeError

    judge = {k: v for k, v in (("url", args.judge_url), ("key", args.judge_key), ("model", args.judge_model)) if v}
    try:
        with warnings.catch_warnings(record=True) as caught:  # shown as one line each, without source lines
            warnings.simplefilter("always")
            try:
                _check_bench(args.bench)  # before reading files, so a typo is reported as such
                records = read_answer_file(args.answers)
                baseline = read_answer_file(args.baseline) if args.baseline else None
                result = score(args.bench, records, args.data_dir, baseline=baseline, judge=judge or None,
                               per_question=args.per_question)
            finally:
                for warning in caught:
                    print(f"warning: {warning.message}", file=sys.stderr)
    except (ValueError, FileNotFoundError, JudgeError, ImportError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"answers: {args.answers}" + (f" (vanilla baseline: {args.baseline})" if args.baseline else ""))
    print("\n".join(_describe(result)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
