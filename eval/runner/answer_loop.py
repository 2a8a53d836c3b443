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
from eval.config.methods import GENERATE, STRICT, VANILLA, MethodConfig
from eval.config.schema import RunConfig, sampling_of
from eval.rundirs.layout import SKIPPED, AnswerFile, answer_record
from eval.runner import locks
from eval.runner.directories import answer_path
from eval.runner.plain import GenerateWorker, hf_generate_batch
from eval.scoring import quality
from mars.adapter import context_length
from mars.decoding.generate import GenerationOutput, SpeculativeGenerator
from mars.decoding.settings import TreeShape
from mars.verification.sampling import SamplingConfig


def decode(gen: SpeculativeGenerator, method: MethodConfig, sampling: SamplingConfig, batch: list[list[int]],
           max_new_tokens: int, eos: list[int], seed: int, *, plain_model=None,
           tree: TreeShape | None = None, speculate: bool = True) -> list[GenerationOutput]:
    """`method`'s answers to the prompts of `batch`, decoded together (one output per prompt, its `seconds`
    the time from the batch's start to its last token): `model.generate` (left-padded) on `plain_model`
    (default: the generator's target) or in the process of a `GenerateWorker` (`generate@<dtype>+<isa>`),
    or our `vanilla` / `generate`; a rule drafts `tree` (None: the generator's current one), or decodes
    plainly with our `vanilla` where its speculation is off (`speculate` False: calibration found no tree
    faster than the fastest plain decoding, `DecodeSettings.speculates`)."""
    if isinstance(plain_model, GenerateWorker):
        return plain_model.answer_batch(batch, sampling, max_new_tokens, eos, seed)
    if method.kind == GENERATE:
        return hf_generate_batch(plain_model or gen.target.model, batch, sampling, max_new_tokens, eos, seed)
    rng = None
    if not sampling.greedy:
        rng = torch.Generator(device=gen.target.devices.logits).manual_seed(seed)
    plain = method.kind == VANILLA or not speculate
    if tree is not None and not plain:
        gen.use_tree(tree)
    run = gen.vanilla if plain else gen.generate
    return run([torch.tensor(ids, dtype=torch.long) for ids in batch], sampling, max_new_tokens=max_new_tokens,
               eos_token_id=eos, generator=rng)


def exact_at_tree_kernels(gen: SpeculativeGenerator, method: MethodConfig, sampling: SamplingConfig,
                          batch: list[list[int]], outs: list[GenerationOutput], max_new_tokens: int,
                          eos: list[int]) -> list[bool] | None:
    """Whether each of strict greedy's `outs` equals plain decoding of its prompt at the tree's kernels
    (`SpeculativeGenerator.vanilla(tree_kernels=True)`, untimed); None where there is nothing to check (another
    method, sampling, speculation off, or plain decoding at the tree's kernels already: vanilla is the check)."""
    if (method.name != STRICT or not sampling.greedy or not gen.speculate or method.kind == VANILLA
            or gen.plain_kernels == gen.tree_kernels):
        return None
    plain = gen.vanilla([torch.tensor(ids, dtype=torch.long) for ids in batch], sampling,
                        max_new_tokens=max_new_tokens, eos_token_id=eos, tree_kernels=True)
    return [p.tokens == o.tokens for p, o in zip(plain, outs, strict=True)]


class Skip(Exception):
    """A question that cannot be answered under these settings (the reason is recorded)."""


class Evaluator:
    """Runs one method on one question (all its turns) and builds its answer record."""

    def __init__(self, run: RunConfig, gen: SpeculativeGenerator, tokenizer, fmt: PromptFormat, *,
                 plain_models: dict[str, object] | None = None, timing_device: str = "cpu",
                 trees: dict[str, TreeShape] | None = None, plain_methods: dict[str, str | None] | None = None):
        self.run, self.gen, self.tokenizer, self.fmt = run, gen, tokenizer, fmt
        self.trees = trees or {}  # {method: the tree it drafts} (DecodeSettings.tree_for); others: the generator's
        # {rule method whose speculation is off: the run's method that decodes as the fastest plain decoding (its
        # answers are taken, `plain_answers`), or None where none of the run's does: it decodes with `vanilla`}
        self.plain_methods = plain_methods or {}
        self.timing_device = timing_device  # the timing lock its answers hold (eval.runner.locks.timed)
        # generate@<dtype> baselines: the target loaded in that dtype, or a worker process (eval.runner.plain)
        self.plain_models = plain_models or {}
        self.eos = sorted(eos_token_ids(gen.target.model, tokenizer))
        self.context = min(context_length(gen.target.model.config), gen.target.max_length)
        self.figures = set(run.bench.quality)
        self._loglik: dict[tuple, tuple[float, int]] = {}  # for the current question only
        self._prompts: dict[tuple, quality.PromptLoglik] = {}  # its prompts, each computed once for every method
        # Strict greedy's answers still to check against plain decoding at the tree's kernels (`exact_at_tree_kernels`),
        # where vanilla runs at other kernels: sums in another order, so vanilla's tokens part from strict's after
        # a rounding tie and `identical_to_vanilla` no longer shows strict exact; this does. None: every question.
        self.exactness_checks = run.exactness_checks

    def budget(self, ids: list[int]) -> int:
        """max_new_tokens, or what still fits the context after a long prompt."""
        room = self.context - len(ids)
        if room < 1:
            raise Skip(f"the prompt ({len(ids)} tokens) fills the context of {self.context} tokens")
        return min(self.run.max_new_tokens, room)

    def loglik(self, ids: list[int], tokens: list[int]) -> tuple[float, int]:
        if not tokens:  # nothing to score: no prompt forward either
            return 0.0, 0
        key = (tuple(ids), tuple(tokens))  # strict greedy repeats vanilla's tokens: score them once
        if key not in self._loglik:
            if key[0] not in self._prompts:
                self._prompts[key[0]] = quality.PromptLoglik(self.gen.target.model, ids)
            self._loglik[key] = self._prompts[key[0]](tokens)
        return self._loglik[key]

    def start(self, question: Question) -> None:
        self._loglik.clear()
        self._prompts.clear()

    def answer(self, method: MethodConfig, sampling: SamplingConfig, question: Question, seed: int) -> dict:
        return self.answer_batch(method, sampling, [question], seed)[0]

    def answer_batch(self, method: MethodConfig, sampling: SamplingConfig, questions: list[Question],
                     seed: int) -> list[dict]:
        """Every turn of each question; with several questions, turn by turn as one batch (`decode`).

        Batched, a turn's `wall_time` is the answer's share of its batch's wall time (by new tokens), so
        that total tokens / total wall_time is the batch's throughput wherever speed is pooled; its
        `latency` the time from the batch's start to the answer's last token."""
        batched = len(questions) > 1
        turns: list[list[tuple[list[int], int, GenerationOutput]]] = [[] for _ in questions]
        texts: list[list[str]] = [[] for _ in questions]
        shares: list[list[float]] = [[] for _ in questions]
        exact: list[list[bool]] = [[] for _ in questions]
        speculate = method.name not in self.plain_methods
        check = self.exactness_checks is None or self.exactness_checks > 0
        for turn in range(max(len(q.turns) for q in questions)):
            rows = [i for i, q in enumerate(questions) if turn < len(q.turns)]
            ids = [encode(self.tokenizer, questions[i], texts[i], self.fmt) for i in rows]
            budgets = [self.budget(x) for x in ids]
            plain = self.plain_models.get(method.name)
            tree = self.trees.get(method.name)
            outs = decode(self.gen, method, sampling, ids, min(budgets), self.eos, seed + turn, plain_model=plain,
                          tree=tree, speculate=speculate)
            checked = exact_at_tree_kernels(self.gen, method, sampling, ids, outs, min(budgets), self.eos) \
                if check and speculate and plain is None else None
            for i, same in zip(rows, checked or [], strict=False):
                exact[i].append(same)
            wall = max(o.seconds for o in outs)
            tokens = sum(len(o.tokens) for o in outs) or 1
            for i, x, out in zip(rows, ids, outs, strict=True):
                turns[i].append((x, min(budgets), out))
                texts[i].append(self.tokenizer.decode(out.tokens, skip_special_tokens=True))
                shares[i].append(wall * len(out.tokens) / tokens if batched else out.seconds)
        if any(exact) and self.exactness_checks is not None:
            self.exactness_checks -= len(questions)
        return [self._record(method, q, texts[i], turns[i], shares[i], len(questions), exact[i])
                for i, q in enumerate(questions)]

    def _record(self, method: MethodConfig, question: Question, texts: list[str],
                turns: list[tuple[list[int], int, GenerationOutput]], wall: list[float], batch: int,
                exact: list[bool]) -> dict:
        """The answer record of one question's turns (ids, budget, output each); `exact`: per turn, whether it
        equals plain decoding at the tree's kernels, where checked (`exact_at_tree_kernels`)."""
        extra = {"method": method.name, "token_ids": [], "max_new_tokens": [], "parses": [], "loglik": [],
                 "loglik_tokens": []}
        for (ids, budget, out), prompt, text in zip(turns, question.turns, texts, strict=False):
            extra["token_ids"].append(out.tokens)
            extra["max_new_tokens"].append(budget)
            extra["parses"].append(quality.parses(prompt, text, out.stopped_by == "eos")
                                   if "parses" in self.figures else None)
            ll, n = self.loglik(ids, out.tokens) if "loglik" in self.figures else (None, 0)
            extra["loglik"].append(ll)
            extra["loglik_tokens"].append(n)
        outs = [out for _, _, out in turns]
        stats = outs[0].stats
        for out in outs[1:]:
            stats.merge(out.stats)
        phases = sum((o.phase_seconds for o in outs), Counter())
        extra.update(accepted=[sum(o.accept_lengths) for o in outs], relaxed=[o.relaxed_tokens for o in outs],
                     stopped_by=[o.stopped_by for o in outs], verify=stats.to_json(),
                     phase_seconds={k: round(v, 6) for k, v in phases.items()})
        if batch > 1:
            extra.update(batch_size=batch, latency=[round(o.seconds, 6) for o in outs])
        if exact:
            extra["exact_at_tree_kernels"] = exact
        return answer_record(question.question_id, f"{self.run.model.name}-{method.name}", texts,
                             [o.num_cycles for o in outs], [len(o.tokens) for o in outs],
                             [round(w, 6) for w in wall], extra)


def plain_answers(evaluator: Evaluator, methods: list[MethodConfig]) -> dict[str, str]:
    """{method: the plain method whose answers it takes}: a rule whose speculation is off decodes with the fastest
    plain decoding calibration raced (`Speculation.plain`), which is one of the run's own plain methods (our
    `vanilla`, or `generate` in a precision, in this process or in an AVX2-limited worker), so its answers are
    that method's (token for token, and the same decoding timed). Decoding them again would cost the run as long
    again and time nothing new: two timings of one decoding differ only by the machine's noise. Every method of a
    run samples at the run's one temperature, top-p and top-k (`sampling_of`); plain decoding verifies nothing."""
    answering = {m.name for m in methods}
    return {name: source for name, source in evaluator.plain_methods.items()
            if source is not None and source in answering and name in answering}


def as_answer_of(record: dict, method: str, model_name: str, source: str) -> dict:
    """`record` (an answer, or a skip, of method `source`) as `method`'s, saying whose it is."""
    copy = {**record, "method": method} if "reason" in record else {
        **record, "model_id": f"{model_name}-{method}", "eval": {**record["eval"], "method": method}}
    copy["answers_of"] = source
    return copy


class _AnswerFiles:
    """The answer and skip files of a call's methods, what each method's answers have shown of its speed so far,
    and how many questions the call has finished (for the tracker)."""

    def __init__(self, methods: list[MethodConfig], directories: dict[str, Path], tracker):
        self.files = {m.name: AnswerFile(answer_path(directories[m.name], m)) for m in methods}
        self.skipped = {m.name: AnswerFile(answer_path(directories[m.name], m, SKIPPED)) for m in methods}
        self.speed = {m.name: [0, 0.0] for m in methods}  # {method: [new tokens, wall seconds]}
        self.tracker = tracker
        self.todo = 0  # questions this call answers (set once known)
        self.finished = 0  # of them, those whose group is done

    def done(self, name: str, qid) -> bool:
        return self.files[name].done(qid) or self.skipped[name].done(qid)

    def keep(self, name: str, record: dict, group: list) -> None:
        """Append `name`'s answer `record` (of a question of `group`), tell the tracker, count its speed."""
        self.files[name].append(record)
        self.tracker.log_question(name, record, self.finished + len(group), self.todo)
        choice = record["choices"][0]
        self.speed[name][0] += sum(choice["new_tokens"])
        self.speed[name][1] += sum(choice["wall_time"])


def answer_questions(config: RunConfig, evaluator: Evaluator, methods: list[MethodConfig],
                     questions: list[tuple[int, Question]], directories: dict[str, Path], tracker) -> set[str]:
    """Every method on every question it has not answered yet, appending each answer as it is made; a rule
    whose speculation is off takes the answer of the run's fastest plain method to each question (`plain_answers`).
    Returns the methods that answered (or skipped) at least one question."""
    books = _AnswerFiles(methods, directories, tracker)
    samplings = {m.name: sampling_of(m, config.sampling) for m in methods}
    shared = plain_answers(evaluator, methods)
    decoding = [m for m in methods if m.name not in shared]
    todo = [(i, q) for i, q in questions if not all(books.done(m.name, q.question_id) for m in methods)]
    books.todo = len(todo)
    size = config.batch_size
    if config.warmup and todo:  # first calls pay for allocation and kernel selection; untimed, so not while others time
        with locks.busy(evaluator.timing_device, config.exclusive_timing):
            warm_up(config, evaluator, decoding, todo, samplings)
    answered: set[str] = set()
    names = ", ".join(m.name for m in methods)
    # Batched (batch_size > 1): the questions in groups of that size, each method answering a group at once;
    # each answer is appended when its group is done (a killed run loses at most the group in flight).
    groups = [todo[k: k + size] for k in range(0, len(todo), size)]
    bar = tqdm(total=len(todo), desc=f"{config.bench.name}: {names}", unit="q", dynamic_ncols=True, file=sys.stderr)
    for group in groups:
        for question in (q for _, q in group):
            evaluator.start(question)
        answered |= _decode_group(config, evaluator, decoding, samplings, group, books, bar.write)
        answered |= _share_group(config, shared, group, books)
        books.finished += len(group)
        bar.update(len(group))
        bar.set_postfix({name: f"{t / s:.0f}t/s" for name, (t, s) in books.speed.items() if s})
    bar.close()
    return answered


def _decode_group(config: RunConfig, evaluator: Evaluator, decoding: list[MethodConfig],
                  samplings: dict[str, SamplingConfig], group: list[tuple[int, Question]], books: _AnswerFiles,
                  log) -> set[str]:
    """Each decoding method on the questions of `group` it has not answered, timed, in an order rotated by the
    group's place (no method always first); returns the methods that answered."""
    answered: set[str] = set()
    i = group[0][0]  # the index of the group's first question in the whole set
    for m in decoding[i % len(decoding):] + decoding[: i % len(decoding)]:
        pending = [(j, q) for j, q in group if not books.done(m.name, q.question_id)]
        if not pending:
            continue
        # Timed alone on the machine (answered again if another process of ours computed meanwhile,
        # else marked contended): eval.runner.locks. Seeded, so a repeat gives the same answers.
        def attempt(m: MethodConfig = m, pending: list = pending) -> tuple[list[dict], list[dict]]:
            skips: list[dict] = []  # kept from the attempt that counts only
            return answer_group(evaluator, m, samplings[m.name], pending, config.seed * 1_000_003, skips), skips

        (records, skips), timing = locks.run_timed(evaluator.timing_device, attempt, config.exclusive_timing, log=log)
        for skip in skips:
            books.skipped[m.name].append(skip)
        for record in records:
            record["timing"] = timing.record()
            books.keep(m.name, record, group)
        answered.add(m.name)
    return answered


def _share_group(config: RunConfig, shared: dict[str, str], group: list[tuple[int, Question]],
                 books: _AnswerFiles) -> set[str]:
    """Each method whose speculation is off takes its plain method's answers (or skips) to `group`'s questions
    it has not answered (`plain_answers`); returns the methods that took one."""
    answered: set[str] = set()
    for name, source in shared.items():
        for qid in (q.question_id for _, q in group if not books.done(name, q.question_id)):
            if books.files[source].done(qid):
                books.keep(name, as_answer_of(books.files[source].records[qid], name, config.model.name, source),
                           group)
            elif books.skipped[source].done(qid):
                books.skipped[name].append(as_answer_of(books.skipped[source].records[qid], name, config.model.name,
                                                        source))
            answered.add(name)
    return answered


def warm_up(config: RunConfig, evaluator: Evaluator, methods: list[MethodConfig], todo: list[tuple[int, Question]],
            samplings: dict[str, SamplingConfig]) -> None:
    """One short untimed run of every method on the first questions."""
    size = config.batch_size
    for m in methods:
        try:
            ids = [encode(evaluator.tokenizer, q, [], evaluator.fmt) for _, q in todo[:size]]
            budget = min(16, *(evaluator.budget(x) for x in ids))
            plain = evaluator.plain_models.get(m.name)
            decode(evaluator.gen, m, samplings[m.name], ids, budget, evaluator.eos, config.seed, plain_model=plain,
                   tree=evaluator.trees.get(m.name), speculate=m.name not in evaluator.plain_methods)
        except Skip:
            break


def answer_group(evaluator: Evaluator, method: MethodConfig, sampling: SamplingConfig,
                 pending: list[tuple[int, Question]], seed: int, skipped: list[dict]) -> list[dict]:
    """The answer records of `pending` (index in the whole set, question) by one method, as one batch
    (or alone, for one question); a question that cannot be answered is recorded in `skipped`. Seeds:
    `seed` + the first question's index (each question's own when alone)."""
    if len(pending) > 1:
        try:
            return evaluator.answer_batch(method, sampling, [q for _, q in pending], seed + pending[0][0])
        except Skip:
            pass  # some question cannot be answered: answer them one by one to record which
    records = []
    for i, question in pending:
        try:
            records.append(evaluator.answer(method, sampling, question, seed + i))
        except Skip as reason:
            skipped.append({"question_id": question.question_id, "method": method.name, "reason": str(reason)})
    return records
