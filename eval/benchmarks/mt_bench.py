"""MT-bench (Zheng et al. 2023): 80 two-turn questions in 8 categories; no references.

Its file lists the 80 by category (writing 81-90, roleplay 91-100, ...), so `num_prompts` takes them category by
category (`by_category`): 12 questions are the first of every category then the second of four, not ten writing
questions and two roleplay ones. Speed depends on the kind of question (on SmolLM2, MARS ran 1.37x on roleplay and
1.08x on writing, docs/real-models.md), and a subset of one kind says little of the rest; the questions calibration
times (tree.calibration_prompts=bench) then continue that round, so they are of the run's kinds too."""

from __future__ import annotations

from eval.benchmarks import HubSource, register_benchmark
from eval.benchmarks.against_vanilla import AgainstVanilla


@register_benchmark
class MTBench(AgainstVanilla):
    name = "mt_bench"
    hub = HubSource("HuggingFaceH4/mt_bench_prompts", split="train")
    by_category = True

    def from_hub(self, row: dict, index: int) -> dict:
        return {"question_id": row["prompt_id"], "category": row["category"], "turns": list(row["prompt"])}
