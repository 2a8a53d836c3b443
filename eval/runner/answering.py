"""Answering questions: one method on one question (all its turns), and every pending method on
every question, interleaved and appended to its answer file as each question finishes.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from eagle.config import eos_token_ids
from eval.benchmarks.prompting import PromptFormat, encode
from eval.benchmarks.questions import Question
from eval.config.methods import GENERATE, VANILLA, MethodConfig
from eval.config.schema import RunConfig, sampling_of
from eval.runner.directories import answer_path
from eval.runner.plain import GenerateWorker, hf_generate
from eval.runs.layout import SKIPPED, AnswerFile, answer_record
from eval.scoring import quality
from mars.adapter import context_length
from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig


def generate(gen: SpeculativeGenerator, method: MethodConfig, sampling: SamplingConfig, ids: list[int],
             max_new_tokens: int, eos: list[int], seed: int, plain_model=None) -> GenerationOutput:
    """One answer of `method`; `model.generate` runs on `plain_model` (default: the generator's target),
    or in the process of a `GenerateWorker` (`generate@<dtype>+<isa>`)."""
    if isinstance(plain_model, GenerateWorker):
        return plain_model.answer(ids, sampling, max_new_tokens, eos, seed)
    if method.kind == GENERATE:
        return hf_generate(plain_model or gen.target.model, ids, sampling, max_new_tokens, eos, seed)
    input_ids = torch.tensor([ids], dtype=torch.long)
    rng = None
    if not sampling.greedy:
        rng = torch.Generator(device=gen.target.devices.logits).manual_seed(seed)
    decode = gen.vanilla if method.kind == VANILLA else gen.generate
    return decode(input_ids, sampling, max_new_tokens=max_new_tokens, eos_token_id=eos, generator=rng)


class Skip(Exception):
    """A question that cannot be answered under these settings (the reason is recorded)."""


class Evaluator:
    """Runs one method on one question (all its turns) and builds its answer record."""

    def __init__(self, cfg: RunConfig, gen: SpeculativeGenerator, tokenizer, fmt: PromptFormat,
                 plain_models: dict[str, object] | None = None):
        self.cfg, self.gen, self.tokenizer, self.fmt = cfg, gen, tokenizer, fmt
        # generate@<dtype> baselines: the target loaded in that dtype, or a worker process (eval.runner.plain)
        self.plain_models = plain_models or {}
        self.eos = sorted(eos_token_ids(gen.target.model, tokenizer))
        self.context = min(context_length(gen.target.model.config), gen.target.max_length)
        self.figures = set(cfg.bench.quality)
        self._loglik: dict[tuple, tuple[float, int]] = {}  # for the current question only

    def budget(self, ids: list[int]) -> int:
        """max_new_tokens, or what still fits the context after a long prompt."""
        room = self.context - len(ids)
        if room < 1:
            raise Skip(f"the prompt ({len(ids)} tokens) fills the context of {self.context} tokens")
        return min(self.cfg.max_new_tokens, room)

    def loglik(self, ids: list[int], tokens: list[int]) -> tuple[float, int]:
        key = (tuple(ids), tuple(tokens))  # strict greedy repeats vanilla's tokens: score them once
        if key not in self._loglik:
            self._loglik[key] = quality.completion_loglik(self.gen.target.model, ids, tokens)
        return self._loglik[key]

    def start(self, question: Question) -> None:
        self._loglik.clear()

    def answer(self, method: MethodConfig, sampling: SamplingConfig, question: Question, seed: int) -> dict:
        texts, outs, extra = [], [], {"method": method.name, "token_ids": [], "max_new_tokens": [], "parses": [],
                                      "loglik": [], "loglik_tokens": []}
        for turn, prompt in enumerate(question.turns):
            ids = encode(self.tokenizer, question, texts, self.fmt)
            budget = self.budget(ids)
            out = generate(self.gen, method, sampling, ids, budget, self.eos, seed + turn,
                           self.plain_models.get(method.name))
            text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
            texts.append(text)
            outs.append(out)
            extra["token_ids"].append(out.tokens)
            extra["max_new_tokens"].append(budget)
            extra["parses"].append(quality.parses(prompt, text, out.stopped_by == "eos")
                                   if "parses" in self.figures else None)
            ll, n = self.loglik(ids, out.tokens) if "loglik" in self.figures else (None, 0)
            extra["loglik"].append(ll)
            extra["loglik_tokens"].append(n)
        stats = outs[0].stats
        for out in outs[1:]:
            stats.merge(out.stats)
        phases = sum((o.phase_seconds for o in outs), Counter())
        extra.update(accepted=[sum(o.accept_lengths) for o in outs], relaxed=[o.relaxed_tokens for o in outs],
                     stopped_by=[o.stopped_by for o in outs], verify=stats.to_json(),
                     phase_seconds={k: round(v, 6) for k, v in phases.items()})
        return answer_record(question.question_id, f"{self.cfg.model.name}-{method.name}", texts,
                             [o.num_cycles for o in outs], [len(o.tokens) for o in outs],
                             [round(o.seconds, 6) for o in outs], extra)


def answer_questions(config: RunConfig, evaluator: Evaluator, methods: list[MethodConfig],
                     questions: list[tuple[int, Question]], directories: dict[str, Path], tracker) -> set[str]:
    """Every method on every question it has not answered yet, appending each answer as it is made.
    Returns the methods that answered (or skipped) at least one question."""
    files = {m.name: AnswerFile(answer_path(directories[m.name], m)) for m in methods}
    skipped = {m.name: AnswerFile(answer_path(directories[m.name], m, SKIPPED)) for m in methods}
    samplings = {m.name: sampling_of(m, config.sampling) for m in methods}

    def done(m: MethodConfig, qid) -> bool:
        return files[m.name].done(qid) or skipped[m.name].done(qid)

    todo = [(i, q) for i, q in questions if not all(done(m, q.question_id) for m in methods)]
    if config.warmup and todo:  # first calls pay for allocation and kernel selection
        for m in methods:
            try:
                ids = encode(evaluator.tokenizer, todo[0][1], [], evaluator.fmt)
                generate(evaluator.gen, m, samplings[m.name], ids, min(16, evaluator.budget(ids)), evaluator.eos,
                         config.seed, evaluator.plain_models.get(m.name))
            except Skip:
                break
    speed = {m.name: [0, 0.0] for m in methods}
    answered: set[str] = set()
    names = ", ".join(m.name for m in methods)
    bar = tqdm(todo, desc=f"{config.bench.name}: {names}", unit="q", dynamic_ncols=True, file=sys.stderr)
    for n, (i, question) in enumerate(bar):
        evaluator.start(question)
        qid = question.question_id
        for m in methods[i % len(methods):] + methods[: i % len(methods)]:  # i: the index in the whole set
            if done(m, qid):
                continue
            try:
                record = evaluator.answer(m, samplings[m.name], question, config.seed * 1_000_003 + i)
            except Skip as reason:
                skipped[m.name].append({"question_id": qid, "method": m.name, "reason": str(reason)})
                answered.add(m.name)
                continue
            files[m.name].append(record)
            answered.add(m.name)
            tracker.log_question(m.name, record, n + 1, len(todo))
            choice = record["choices"][0]
            speed[m.name][0] += sum(choice["new_tokens"])
            speed[m.name][1] += sum(choice["wall_time"])
        bar.set_postfix({name: f"{t / s:.0f}t/s" for name, (t, s) in speed.items() if s})
    return answered
