"""A job's model pair, settings and prompts, for measurements outside a job (the scripts of experiments/).

A measurement should decode what `python -m eval.run` would: the config it composes, the settings its
resolver picks (precision, kernels, tree, measured where a job measures them), the target and head it
loads, its prompt encoding and its plain-decoding baselines. `JobPair` goes through the same doors a
job does (`eval.runner`), so a script needs nothing else of the runner:

    pair = JobPair.of("model=embedded", "tree=cpu")        # the job config, composed and validated
    settings = pair.settings("batch_size=4")               # what a job with one more override resolves
    with pair.generator(settings) as gen:                  # the target in that precision, its head, the loop
        outs = gen.generate([torch.tensor(p) for p in pair.prompts(4)])
    plain = pair.plain_decoders()                          # model.generate as a user has it on this machine
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from eval.benchmarks import load_questions
from eval.benchmarks.prompting import PromptFormat, encode
from eval.benchmarks.questions import Question
from eval.config.schema import RunConfig, run_config
from eval.runner.job import machine
from eval.runner.job_settings import resolve_settings
from eval.runner.models import load_head, load_target, load_tokenizer, make_generator, target_source
from eval.runner.plain import GenerateWorker, hf_generate_batch
from mars.decoding.generate import GenerationOutput, SpeculativeGenerator
from mars.decoding.settings import DecodeSettings
from mars.verification.sampling import SamplingConfig

__all__ = ["JobPair", "PlainDecoder", "machine", "run_config"]


class PlainDecoder:
    """transformers' `model.generate` on a batch of prompts (one prompt: exactly `model.generate` on it),
    EOS ignored, seeded: on a model loaded here, or in a worker process whose torch is limited to an
    instruction set (`eval.runner.plain.GenerateWorker`)."""

    def __init__(self, model: Any = None, worker: GenerateWorker | None = None):
        self.model, self.worker = model, worker

    def __call__(self, batch: list[list[int]], cfg: SamplingConfig, max_new_tokens: int) -> list[GenerationOutput]:
        if self.worker is not None:
            return self.worker.answer_batch(batch, cfg, max_new_tokens, [], seed=0)
        return hf_generate_batch(self.model, batch, cfg, max_new_tokens, [], seed=0)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


@dataclass
class JobPair:
    """The job config `overrides` compose (`config`), its prompt format and tokenizer; targets and heads are
    loaded on first use, once per precision."""

    overrides: tuple[str, ...]
    config: RunConfig
    fmt: PromptFormat
    tokenizer: Any
    targets: dict[str, Any] = field(default_factory=dict)  # precision -> the target loaded in it
    heads: dict[tuple[str, str], Any] = field(default_factory=dict)  # (head, precision) -> the head

    @classmethod
    def of(cls, *overrides: str) -> JobPair:
        config = run_config(*overrides)
        return cls(overrides, config, PromptFormat.of(config.model.prompt), load_tokenizer(config))

    @property
    def source(self) -> str:
        """Where the target loads from: a directory, a hub id, or a GGUF file's converted directory."""
        return target_source(self.config)

    def prompts(self, count: int | None = None) -> list[list[int]]:
        """The first turns of the first `count` questions of the job's benchmark, encoded as the job encodes
        them."""
        bench = self.config.bench
        questions = load_questions(bench.questions, bench.data_dir, count, bench.source)
        return [encode(self.tokenizer, q, [], self.fmt) for q in questions]

    def encode(self, text: str) -> list[int]:
        """One user turn `text` in the model's prompt format."""
        return encode(self.tokenizer, Question(0, [text]), [], self.fmt)

    def settings(self, *overrides: str) -> DecodeSettings:
        """What a job of this config with `overrides` added resolves (`eval.runner.job_settings.resolve_settings`:
        read from the calibration cache, or timed first where a job times)."""
        config = run_config(*self.overrides, *overrides) if overrides else self.config
        return resolve_settings(config, self.fmt)

    def target(self, dtype: str) -> Any:
        """The target in precision `dtype` ("float32", "bfloat16", ...), loaded as a job loads it."""
        if dtype not in self.targets:
            self.targets[dtype] = load_target(self.config, getattr(torch, dtype))
        return self.targets[dtype]

    def generator(self, settings: DecodeSettings, profile: bool = False) -> SpeculativeGenerator:
        """Our decoding loop with `settings`: the target in their precision and their head (each loaded once)."""
        dtype = settings.dtype.value
        target = self.target(dtype)
        key = (settings.head.value, dtype)
        if key not in self.heads:
            self.heads[key] = load_head(settings.head, target)
        plain = settings.plain.dtype
        return make_generator(target, self.heads[key], settings, self.config, profile=profile,
                              plain_model=self.target(plain) if plain != dtype else None)

    def plain_decoders(self, names: list[str] | None = None) -> dict[str, PlainDecoder]:
        """`model.generate` as a user has it here (`names`: only those): in float32 and bf16, and on a CPU
        with more than AVX2 in bf16 under the AVX2 limits, in a worker process (`generate@bfloat16+avx2`: on
        AVX-512 BF16 CPUs the fastest plain bf16 decoding). Close them when done (the worker's process)."""
        wanted = names or ["generate@float32", "generate@bfloat16", "generate@bfloat16+avx2"]
        decoders = {f"generate@{d}": PlainDecoder(self.target(d)) for d in ("float32", "bfloat16")
                    if f"generate@{d}" in wanted}
        if "generate@bfloat16+avx2" in wanted and torch.backends.cpu.get_cpu_capability() != "AVX2":
            decoders["generate@bfloat16+avx2"] = PlainDecoder(worker=GenerateWorker(self.config, "bfloat16", "avx2"))
        return decoders
