"""Plain decoding with transformers' own `model.generate` for a job: in this process, or in a worker process
whose torch and oneDNN are limited to an instruction set (`generate@bfloat16+avx2`).

The decoding and the worker are the engine's (`mars.decoding.reference`: the calibration times the same
configurations, so it judges trees against the plain decoding the job reports); here they take a job's
config.
"""

from __future__ import annotations

from eval.config.schema import RunConfig
from mars.decoding.generate import GenerationOutput
from mars.decoding.reference import GenerateWorker as Worker
from mars.decoding.reference import hf_generate_batch
from mars.verification.sampling import SamplingConfig

__all__ = ["GenerateWorker", "hf_generate", "hf_generate_batch"]


def hf_generate(model, ids: list[int], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
                seed: int) -> GenerationOutput:
    """Plain decoding with transformers' own `model.generate` and the same logits processing."""
    return hf_generate_batch(model, [ids], sampling, max_new_tokens, eos, seed)[0]


class GenerateWorker(Worker):
    """`mars.decoding.reference.GenerateWorker` on the run's target (a local directory or hub id,
    `eval.runner.models.target_source`), with this process's torch threads."""

    def __init__(self, run: RunConfig, dtype: str, isa: str):
        from eval.runner.models import target_source

        super().__init__(target_source(run), dtype, isa)
