"""Alpaca instructions (Taori et al. 2023), as in the speculative-decoding sets: scored against vanilla."""

from __future__ import annotations

from eval.benchmarks import HubSource, register_benchmark
from eval.benchmarks.against_vanilla import AgainstVanilla


@register_benchmark
class Alpaca(AgainstVanilla):
    name = "alpaca"
    hub = HubSource("tatsu-lab/alpaca", split="train")

    def from_hub(self, row: dict, index: int) -> dict:
        prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
        return {"question_id": index, "category": "", "turns": [prompt], "reference": [row["output"]]}
