"""MT-bench (Zheng et al. 2023): 80 two-turn questions in 8 categories; no references."""

from __future__ import annotations

from eval.benchmarks import HubSource, register_benchmark
from eval.benchmarks.against_vanilla import AgainstVanilla


@register_benchmark
class MTBench(AgainstVanilla):
    name = "mt_bench"
    hub = HubSource("HuggingFaceH4/mt_bench_prompts", split="train")

    def from_hub(self, row: dict, index: int) -> dict:
        return {"question_id": row["prompt_id"], "category": row["category"], "turns": list(row["prompt"])}
