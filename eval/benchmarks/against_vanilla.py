"""Sets without references (MT-bench, NQ as collected here; an Alpaca question whose copy lost its reference),
scored against the same model's vanilla answers, as the MARS paper does (a lossless method scores 100 / 100 /
1.0 by construction: agreement, which measures change, not quality), and by an LLM judge where one is
configured (`eval.scoring.judge`). Alpaca with references is scored against them (`eval.benchmarks.alpaca`), and
adds this agreement where vanilla's answers are given."""

from __future__ import annotations

import warnings

from eval.benchmarks import Benchmark, ScoreContext
from eval.config.paths import bench_dir
from eval.scoring.text import VS_VANILLA, mean_figure, vs_vanilla_each


def score_against_vanilla(name: str, answers: dict[str, list[str]], questions: dict[str, dict],
                          context: ScoreContext) -> tuple[dict, dict]:
    from eval.scoring.judge import judge_answers, judge_config, load_judge_prompts

    config = judge_config(**(context.judge or {}))
    if context.judge and config is None:
        raise ValueError("the LLM judge needs both an endpoint URL and an API key (--judge-url and --judge-key, or "
                         "$MARS_JUDGE_URL and $MARS_JUDGE_KEY)")
    if context.baseline is None and config is None:
        raise ValueError(f"{name} has no references: its answers are compared with the same model's vanilla answers. "
                         "Pass baseline=<vanilla records> (command line: --baseline VANILLA.jsonl), or configure an "
                         "LLM judge (--judge-url/--judge-key or $MARS_JUDGE_URL/$MARS_JUDGE_KEY)")
    metrics: dict = {}
    each: dict[str, dict] = {qid: {} for qid in answers}
    if context.baseline is not None:
        vanilla = context.baseline
        common = [qid for qid in answers if qid in vanilla]
        if not common:
            raise ValueError("the baseline answers no question of the answer file; is it the vanilla run of the same "
                             "benchmark?")
        if len(common) < len(answers):
            warnings.warn(f"{len(answers) - len(common)} answers have no vanilla answer; compared on the other "
                          f"{len(common)}", stacklevel=3)
            metrics["n_vs_vanilla"] = len(common)
        pooled = []
        for qid in common:  # per question, then pooled over every turn
            turns = vs_vanilla_each([answers[qid]], [vanilla[qid]])
            each[qid] |= {metric: mean_figure(turns, metric) for metric in VS_VANILLA}
            pooled += turns
        metrics |= {metric: mean_figure(pooled, metric) for metric in VS_VANILLA}
    if config is not None:
        prompts = load_judge_prompts(bench_dir(context.data_dir))
        ratings = judge_answers(questions, answers, config, prompts)
        valid = [r for turns in ratings.values() for r in turns if r is not None]
        metrics["judge_score"] = sum(valid) / len(valid)
        metrics["judge_failed"] = sum(r is None for turns in ratings.values() for r in turns)
        metrics["judge_model"] = config.model
        for qid, turns in ratings.items():
            each[qid]["judge"] = turns
    return metrics, each


class AgainstVanilla(Benchmark):
    """A set without references: ROUGE-L, token F1 and exact match against vanilla; the judge's score."""

    headline = "rougeL_vs_vanilla"
    vs_vanilla = True

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        return score_against_vanilla(self.name, answers, questions, context)
