"""Natural Questions (Kwiatkowski et al. 2019) as collected here: questions only, scored against vanilla."""

from __future__ import annotations

from eval.benchmarks import HubSource, register_benchmark
from eval.benchmarks.against_vanilla import AgainstVanilla


@register_benchmark
class NaturalQuestions(AgainstVanilla):
    name = "qa"
    hub = HubSource("google-research-datasets/nq_open", split="validation")

    def from_hub(self, row: dict, index: int) -> dict:
        question = row["question"].strip()
        return {"question_id": index, "category": "qa", "turns": [question[:1].upper() + question[1:] + "?"],
                "reference": list(row["answer"])}
