"""Task quality of answer files on the registered benchmarks, and the `python -m eval.score` CLI.

    python -m eval.score BENCH ANSWERS.jsonl [--data-dir DIR] [--source local|hub|auto] [--baseline VANILLA.jsonl]
                         [--per-question] [--judge-url URL --judge-key KEY --judge-model NAME]
                         [--allow-unisolated]

prints a few readable lines, then the metrics as ONE JSON object on the last line of stdout; bad
input exits with code 2 and a one-line message.

Answers are JSONL records in the EAGLE / MARS layout (`question_id`, `choices[0]["turns"]`); the
scored text is the first turn, or every turn of a multi-turn set (MT-bench). What a benchmark
measures is its own file's business (`eval/benchmarks/`): humaneval pass@1 (unit tests in the
sandbox), gsm8k and aime2025 accuracy of the final number, wmt19 BLEU/chrF, sum ROUGE, alpaca ROUGE against
its reference answers, mt_bench and qa agreement with the same model's vanilla answers (ROUGE-L, token F1,
exact match) and
an LLM judge where configured, spec_bench per category. Metrics: `eval.scoring.text`.

HumanEval's programs run in the sandbox (`eval.scoring.sandbox`); where it cannot hide the caller's
private files (not root, no bubblewrap, no unprivileged user namespaces) scoring refuses, unless
`--allow-unisolated`; the output then says `sandbox: unisolated` (the JSON's "sandbox" key names the
isolation level in every HumanEval result).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from eval.benchmarks import BENCHMARKS, benchmark
from eval.benchmarks.score_files import read_answer_file, score


def _describe(result: dict) -> list[str]:
    lines = [f"{result['bench']}: {result['n']} questions scored"]
    if "sandbox" in result:
        lines.append(f"  sandbox: {result['sandbox']}" + ("   <- model-written code ran with your permissions"
                                                           if result["sandbox"] == "unisolated" else ""))
    for key, value in result.items():
        if key in ("bench", "n", "metric", "per_question", "sandbox"):
            continue
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<24} {shown}{'   <- headline' if key == result['metric'] else ''}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", help=f"benchmark: {', '.join(BENCHMARKS)}")
    parser.add_argument("answers", help="answer file (JSONL, EAGLE / MARS layout)")
    parser.add_argument("--data-dir", help="directory of the benchmark files (default $MARS_BENCH_DIR or "
                        "../shared/data/bench)")
    parser.add_argument("--source", choices=("local", "hub", "auto"), default="local",
                        help="questions from the benchmark directory (local), the Hugging Face hub, or local when "
                        "there (auto)")
    parser.add_argument("--baseline", help="the same model's vanilla answers (sets scored against vanilla)")
    parser.add_argument("--per-question", action="store_true", help="include each question's figures in the JSON")
    parser.add_argument("--judge-url", help="OpenAI-compatible endpoint of an LLM judge (or $MARS_JUDGE_URL)")
    parser.add_argument("--judge-key", help="its API key (or $MARS_JUDGE_KEY)")
    parser.add_argument("--judge-model", help="judge model name (or $MARS_JUDGE_MODEL; default gpt-4)")
    parser.add_argument("--allow-unisolated", action="store_true",
                        help="score HumanEval even where the sandbox cannot hide your private files (not root, no "
                        "bubblewrap, no unprivileged user namespaces): model-written code then runs with your "
                        "permissions; the result records sandbox: unisolated")
    args = parser.parse_args(argv)

    from eval.scoring import sandbox
    from eval.scoring.judge import JudgeError

    if args.allow_unisolated:
        sandbox.allow_unisolated(True)

    judge = {k: v for k, v in (("url", args.judge_url), ("key", args.judge_key), ("model", args.judge_model)) if v}
    try:
        with warnings.catch_warnings(record=True) as caught:  # shown as one line each, without source lines
            warnings.simplefilter("always")
            try:
                spec = benchmark(args.bench)  # before reading files, so a typo is reported as such
                records = read_answer_file(args.answers)
                baseline = read_answer_file(args.baseline) if args.baseline else None
                if spec.sandboxed:
                    level = sandbox.isolation()  # refuses (SandboxUnavailable) before anything is scored
                result = score(args.bench, records, args.data_dir, baseline=baseline, judge=judge or None,
                               per_question=args.per_question, source=args.source)
                if spec.sandboxed:
                    result["sandbox"] = level
            finally:
                for warning in caught:
                    print(f"warning: {warning.message}", file=sys.stderr)
    except (ValueError, FileNotFoundError, JudgeError, ImportError, sandbox.SandboxUnavailable) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"answers: {args.answers}" + (f" (vanilla baseline: {args.baseline})" if args.baseline else ""))
    print("\n".join(_describe(result)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
