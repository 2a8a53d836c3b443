"""A job's decoding settings, resolved once (`mars.decoding.settings.DecodeSettings`).

Explicit settings win (`model.dtype`, `model.exact_attention`, `model.prepack`, a fixed `tree`). What
is left free is measured on this machine when there is a choice to make (`mars.tuning.search`: on a CPU
the precision and prepacking with `model.dtype=auto`, the tree with `tree=calibrated`), cached per
machine and model; on a GPU the precision follows the hardware (`eagle.precision.resolve_dtype`).
Exact attention follows the precision: on where it is needed for strict greedy output to equal plain
decoding (bf16/fp16), off in float32 and with static shapes. The draft head follows the temperature
(`head_setting`). Each value carries its reason.

Calibrated trees are judged against the fastest plain decoding timed beside them (our vanilla at every
kernel candidate, `model.generate` in every precision loaded and, on a CPU with more than AVX2, under the
AVX2 limits in a worker process): a method whose best tree is slower does not speculate (`speculation`).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable
from functools import partial

import torch

from eagle.files import write_atomic
from eagle.precision import needs_exact_attention, resolve_dtype
from eval.benchmarks import Question, load_questions
from eval.benchmarks.prompting import PromptFormat, encode
from eval.config.methods import STRICT, RuleMethod, method_spec
from eval.config.schema import RunConfig, TreeConfig, sampling_of
from eval.runner import locks
from eval.runner.models import load_head, load_target, load_tokenizer, target_source
from eval.runner.placement import parameter_count
from mars.adapter.sources import cache_root
from mars.decoding.reference import limited_references
from mars.decoding.settings import DecodeSettings, Kernels, Setting, TreeShape
from mars.tuning.candidates import kernel_candidates, tree_candidates
from mars.tuning.finals import FLOOR
from mars.tuning.measure import Request, measure
from mars.tuning.record import Calibration, cache_path
from mars.tuning.search import PROFILE_UNITS, UNITS


def on_cpu(run: RunConfig) -> bool:
    return not run.model.device_map and run.model.device == "cpu"


def run_device(run: RunConfig) -> str:
    m = run.model
    return "cuda" if (m.device_map or m.device.startswith("cuda")) else m.device


def timing_device(run: RunConfig, gpus: list[int] | None) -> str:
    """What a timed answer of this job contends for (its timing lock, eval.runner.locks): the CPU, or the
    GPUs it holds (jobs on other GPUs time in parallel; without a claim, every GPU)."""
    if on_cpu(run):
        return "cpu"
    return "cuda" + ("-" + "-".join(map(str, gpus)) if gpus else "")


def fixed_tree(tree: TreeConfig, sampled: bool) -> TreeShape:
    """The configured tree; drafted as `tree.drafting` says, "auto" resolving by rule (sampled children
    when sampling and the tree is not adaptive) where nothing is measured."""
    return TreeShape(tree.total_tokens, tree.depth, tree.branching, tree.adaptive, tree.drafting).resolved(sampled)


def drafting_reason(run: RunConfig, tree: TreeShape, sampled: bool, record: Calibration | None) -> str:
    if not sampled:
        return "greedy decoding drafts the head's top-k"
    if run.tree.drafting != "auto":
        return "set explicitly (tree.drafting)"
    if record is not None:
        mode = tree.drafting == "sample"
        other = [p for p in record.predictions if p.kernels == record.kernels and (p.tree.drafting == "sample") != mode]
        mine = next((p for p in record.predictions if p.kernels == record.kernels and p.tree == tree), None)
        if other and mine:
            return (f"measured: {tree.label} predicted at {mine.tokens_per_s:.1f} tok/s, the other mode's best "
                    f"{other[0].tree.label} at {other[0].tokens_per_s:.1f}")
        return "measured: no tree of the other mode was profiled"
    if run.tree.adaptive:
        return "auto: the adaptive tree drafts top-k"
    return "auto: sampled children when sampling (accepted with probability sum min(p, q), not p's mass on k tokens)"


def placement_of(run: RunConfig) -> Setting:
    m = run.model
    if m.device_map:
        return Setting(f"device_map={m.device_map}", "model.device_map: the target's layers spread over the job's GPUs"
                       + (" (fitted first, eval.runner.placement)" if m.device_map == "auto" else ""))
    return Setting(m.device, "model.device")


def candidates(run: RunConfig) -> list[Kernels]:
    """The kernels this run may use, after its explicit settings and its mode (static, compile)."""
    m = run.model
    exact = m.exact_attention if m.exact_attention is not None else (False if m.static else None)
    prepack = m.prepack if m.prepack is not None else (False if m.compile is not None else None)
    parameters = None
    if on_cpu(run):  # whether a packed copy of the weights fits in memory
        from transformers import AutoConfig

        parameters = parameter_count(AutoConfig.from_pretrained(target_source(run)))
    return kernel_candidates(run_device(run), m.dtype.value, exact, prepack, parameters)


def exact_reason(run: RunConfig, kernels: Kernels) -> str:
    m = run.model
    if m.exact_attention is not None:
        return "set explicitly"
    if m.static:
        return "auto: static shapes (exact attention gathers shapes that change from tree to tree)"
    if needs_exact_attention(kernels.torch_dtype):
        return f"auto: {kernels.dtype} tree verification differs from plain decoding without it"
    return f"auto: {kernels.dtype} tree verification already reproduces plain decoding"


def prepack_reason(run: RunConfig, kernels: Kernels, options: list[Kernels], record: Calibration | None) -> str:
    m = run.model
    if m.prepack is not None:
        return "set explicitly"
    if m.compile is not None:
        return "auto: torch.compile chooses the kernels of the compiled forwards"
    same = [k for k in options if k.dtype == kernels.dtype and k != kernels]
    if same and record is not None:
        return kernels_reason(record, kernels, same)
    if not on_cpu(run):
        return f"auto: oneDNN packs CPU weights only (here {run_device(run)})"
    if kernels.prepack:
        return f"auto: {kernels.dtype} on CPU, where oneDNN's prepacked products beat torch's (compute/kernels.py)"
    return f"auto: oneDNN does not pack {kernels.dtype} weights here, or a packed copy would not fit in memory"


def kernels_reason(record: Calibration, kernels: Kernels, others: list[Kernels]) -> str:
    """How the cost model ranked `kernels` against `others`: each one's best predicted tree, relative to the
    chosen kernels' best, or why it was no candidate."""
    best: dict[Kernels, float] = {}
    for p in record.predictions:  # fastest first
        best.setdefault(p.kernels, p.tokens_per_s)
    mine = best.get(kernels)
    parts = []
    for k in others:
        if k in best and mine:
            parts.append(f"{k.label} {best[k] / mine:.2f}x")
        elif record.identical.get(k.label) is False:
            parts.append(f"{k.label} no candidate (its strict output differed from its plain decoding)")
        else:
            parts.append(f"{k.label} not calibrated")
    return (f"measured: the cost model's fastest kernels for strict's trees ({kernels.label}); the others' best "
            f"predicted trees against them: {', '.join(parts) or 'none'}")


def plain_kernels_reason(record: Calibration, kernels: Kernels, plain: Kernels) -> str:
    """Why the run's plain decoding runs at other kernels than its trees: faster in calibration's plain race."""
    raced = {p.kernels: p.relative for p in record.plains if p.ours}
    ratio = f"{raced[plain] / raced[kernels]:.2f}x vanilla at the trees' kernels" if kernels in raced else \
        "the fastest vanilla"
    return (f"measured: vanilla {plain.label} ran at {ratio} in calibration's plain race (paired); strict "
            "reproduces plain decoding at the trees' kernels")


def dtype_reason(run: RunConfig, kernels: Kernels, options: list[Kernels], record: Calibration | None) -> str:
    """Why the run's precision."""
    if run.model.dtype.value != "auto":
        return "set explicitly"
    if not on_cpu(run):
        return resolve_dtype("auto", run_device(run)).reason
    if record is not None:
        verdict = "" if any(record.identical.values()) else \
            " (NO candidate reproduced plain greedy decoding on the calibration prompts)"
        return kernels_reason(record, kernels, [k for k in options if k.dtype != kernels.dtype]) + verdict
    return f"auto: the only candidate here ({kernels.label})"


# tree.calibration_prompts=bench: the benchmark's questions the run does not answer, until their turns timed
# (first and second) make this many: 8 MT-bench questions, 16 of a single-turn set; at batch B, B times as
# many, so that a batched run's calibration times as many batches (`mars.tuning.search.UNITS`)
BENCH_CALIBRATION_TURNS = 16


def bench_questions(run: RunConfig, limit: int | None = None) -> list[Question]:
    """The benchmark's questions as the run asks them (`bench.max_turns` of each), the first `limit` if given."""
    return load_questions(run.bench.questions, run.bench.data_dir, limit, run.bench.source, run.bench.max_turns)


def calibration_questions(run: RunConfig) -> list[Question]:
    """The questions calibration times: the file `tree.calibration_prompts`, or with "bench" the benchmark's
    questions after the run's first `num_prompts` (never one the run answers) in the run's mix: for each of the
    run's questions in turn, the next spare one of its category; then the other spares, those of a category the
    run answers first; until their turns make BENCH_CALIBRATION_TURNS * batch_size. Calibration's first units rank the
    candidates (`calibration_prompts` keeps the order), so the first ones are of the kinds the run answers most.
    Where the spare questions make too few turns (`too_few_spare`), the model's own prompts instead."""
    if run.tree.calibration_prompts == "model" or (run.tree.calibration_prompts == "bench" and too_few_spare(run)):
        return load_questions(run.model.calibration_prompts)
    if run.tree.calibration_prompts != "bench":
        return load_questions(run.tree.calibration_prompts)
    every = bench_questions(run)
    spare = every[run.num_prompts:] if run.num_prompts else []
    asked = [q.category for q in every[:run.num_prompts]]
    by_kind: dict[str, list[Question]] = {}
    for q in spare:
        by_kind.setdefault(q.category, []).append(q)
    mirrored = [by_kind[kind].pop(0) for kind in asked if by_kind.get(kind)]
    taken, kinds = {id(q) for q in mirrored}, set(asked)  # Questions hold lists: compared by identity here
    rest = sorted((q for q in spare if id(q) not in taken), key=lambda q: q.category not in kinds)  # stable
    questions, turns = [], 0
    for q in mirrored + rest:
        if turns >= BENCH_CALIBRATION_TURNS * run.batch_size:
            break
        questions.append(q)
        turns += min(len(q.turns), 2)
    return questions


def too_few_spare(run: RunConfig) -> bool:
    """Whether the benchmark's questions the run does not answer make too few turns for a calibration (its
    profiles' and its paired finals' least): the model's own calibration prompts are timed instead."""
    every = bench_questions(run)
    spare = every[run.num_prompts:] if run.num_prompts else []
    return sum(min(len(q.turns), 2) for q in spare) < (PROFILE_UNITS + FLOOR) * run.batch_size


def calibration_mix(run: RunConfig) -> str | None:
    """With tree.calibration_prompts=bench, one line of the run's first lines: the categories calibration times
    beside those the run answers, and which of the run's have no question to spare. A prediction holds for the
    kind of question it was timed on: on SmolLM2, MARS ran at 1.37x on the MT-bench roleplay questions of a run
    calibrated on roleplay and at 1.08x on its writing ones (docs/real-models.md). None for a prompt file."""
    if run.tree.calibration_prompts != "bench":
        return None
    every = bench_questions(run)
    if too_few_spare(run):
        return (f"calibration times the model's own prompts ({run.model.calibration_prompts}): {run.bench.name} has "
                f"{len(every)} questions and the run answers {run.num_prompts or 'all'}, too few to spare")
    asked = Counter(q.category for q in every[:run.num_prompts])
    timed = Counter(q.category for q in calibration_questions(run))
    line = (f"calibration times {sum(timed.values())} of {run.bench.name}'s questions the run does not answer "
            f"({', '.join(f'{k} {n}' for k, n in timed.items())}); the run answers "
            f"{', '.join(f'{k} {n}' for k, n in asked.items())}")
    missing = [k for k in asked if k not in timed]
    if missing:
        line += (f"; {', '.join(missing)} ha{'s' if len(missing) == 1 else 've'} none to spare: the predicted "
                 "speedups are the other categories'")
    return line


def calibration_prompts(run: RunConfig, fmt: PromptFormat, dtype: str = "float32",
                        log: Callable[[str], None] | None = None) -> list[torch.Tensor]:
    """The turns calibration times, like the run's: each calibration question's first turn and, where it has
    a second, that turn after the target's plain greedy answer to the first (`first_answers`, in `dtype`).
    Calibration times a prefix of them, so they come in two passes over the questions in their order,
    the first pass taking even-numbered questions' first turns and odd-numbered ones' second turns (a single-turn
    question's one turn), the second pass the others: any prefix is of as many questions (kinds) as turns, and of
    both turns; a file of single-turn prompts keeps its order (the one `mars.tuned` times). Only the first
    UNITS * batch_size turns, which calibration times (`mars.tuning.search.UNITS`), are made: no first answer
    is decoded for a turn it would not time. A second turn
    carries the first exchange as context (MT-bench's: about 4x a first turn's tokens), which changes both plain
    decoding's cost (its prompt forward) and a tree's: timed on first turns alone, strict's verdict on MT-bench
    followed the wrong one; timed on pairs of turns of one question each, SmolLM2's 8-prompt prefix held 4 of
    MT-bench's 8 categories and predicted MARS at 1.08x where, forced, it ran 1.33x (docs/real-models.md)."""
    if log is not None and (mix := calibration_mix(run)):
        log(mix)
    tokenizer = load_tokenizer(run)
    questions = calibration_questions(run)
    two = [len(q.turns) > 1 for q in questions]
    # (question, turn) in two passes: an odd-numbered question with a second turn gives it in the first pass and its
    # first in the second; a single-turn question comes in the first (a single-turn file keeps its order)
    order = [(i, i % 2 if two[i] else 0) for i in range(len(questions))]
    order += [(i, 1 - i % 2) for i in range(len(questions)) if two[i]]
    order = order[: UNITS * run.batch_size]  # what calibration times: no first answer decoded for more
    firsts = {i: encode(tokenizer, questions[i], [], fmt) for i in sorted({i for i, _ in order})}
    follow = sorted(i for i, turn in order if turn == 1)
    answers = first_answers(run, [firsts[i] for i in follow], tokenizer, dtype) if follow else []
    seconds = {i: encode(tokenizer, questions[i], [a], fmt) for i, a in zip(follow, answers, strict=True)}
    return [torch.tensor([firsts[i] if turn == 0 else seconds[i]]) for i, turn in order]


def first_answers(run: RunConfig, prompts: list[list[int]], tokenizer, dtype: str) -> list[str]:
    """The target's plain greedy answers (`run.max_new_tokens` tokens at most) to `prompts`, as text; kept in
    $MARS_CACHE_DIR/answers by target, prompts, length and precision, so that a cached calibration is found
    without decoding them again (the calibration's cache key hashes the turns they make)."""
    path = cache_path({"target": target_source(run), "prompts": prompts, "max_new_tokens": run.max_new_tokens,
                       "dtype": dtype}, cache_root() / "answers")
    if path.exists():
        return json.loads(path.read_text())["answers"]
    model = load_target(run, getattr(torch, dtype))
    answers = []
    with torch.inference_mode():
        for ids in prompts:
            row = torch.tensor([ids], device=model.device)
            out = model.generate(row, attention_mask=torch.ones_like(row), max_new_tokens=run.max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            answers.append(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))
    del model
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"target": target_source(run), "answers": answers}, indent=1))
    return answers


def head_setting(run: RunConfig, sampled: bool) -> Setting:
    """The draft head the run uses: `model.sampling_draft` when sampling and the model has one (a head
    distilled on the target's full temperature-1 distributions drafts samples the target accepts more
    often, but drafts the argmax worse: data/models/README.md), else `model.draft`."""
    m = run.model
    if sampled and m.sampling_draft:
        return Setting(m.sampling_draft, "model.sampling_draft: a head distilled for sampling, temperature > 0")
    if m.sampling_draft:
        return Setting(m.draft, "model.draft: greedy decoding (model.sampling_draft is for temperature > 0)")
    return Setting(m.draft, "model.draft")


def rule_methods(run: RunConfig) -> list[RuleMethod]:
    """The job's methods verified by a rule other than strict's (each gets a tree measured for it)."""
    found = {}
    for method in [*(method_spec(b) for b in run.baselines), run.method]:
        if isinstance(method, RuleMethod) and method.name != STRICT:
            found.setdefault(method.name, method)
    return list(found.values())


def load_pair(run: RunConfig, head: Setting, dtype: str) -> tuple:
    """The run's target and the draft head `head` in `dtype` (what `mars.tuning.search.calibrate` times)."""
    target = load_target(run, getattr(torch, dtype))
    return target, load_head(head, target)


def calibrated_reason(record: Calibration, offered: int) -> str:
    """How a calibrated tree was chosen: predicted among how many, which were timed end to end, and how fast
    against the fastest plain decoding, paired."""
    m, finals = record.measured, ", ".join(record.finals)
    tied = f"; the cheaper of those tied ({', '.join(record.tied)})" if record.tied else ""
    return (f"the cost model predicted {len(record.predictions)} kernels x trees of {offered} trees from parts and "
            f"{len(record.profiles)} profiles, and {finals} ran against {record.reference.label}: {m.ratio:.2f}x "
            f"[{m.low:.2f}, {m.high:.2f}] over {m.pairs} paired held-out prompts{tied} "
            f"({'cached: ' if record.cached else 'saved to '}{record.cache})")


def resolve_settings(run: RunConfig, fmt: PromptFormat, log: Callable[[str], None] = print) -> DecodeSettings:
    """The job's `DecodeSettings` (see the module docstring); may time candidates the first time on a machine.

    Calibrated (`tree=calibrated`), strict and each rule method speculate only where their chosen tree ran faster
    than the fastest plain decoding in calibration, paired prompt by prompt (`mars.tuning.verdict`); a method that
    does not decodes with that plain decoding. A tree set explicitly always speculates."""
    options = candidates(run)
    sampling = sampling_of(method_spec(STRICT), run.sampling)
    sampled = not sampling.greedy
    head = head_setting(run, sampled)
    trees = tree_candidates(sampled, run.tree.drafting) if run.tree.calibrate else None
    if not (run.tree.calibrate or (run.model.dtype.value == "auto" and on_cpu(run))):
        options = options[:1]  # the rule: packed where oneDNN packs (kernel_candidates lists it first)
    timed = len(options) > 1 or run.tree.calibrate
    # static: one tree size; per_method false: rules compared at strict's tree
    others = rule_methods(run) if run.tree.calibrate and run.tree.per_method and not run.model.static else []
    with contextlib.ExitStack() as stack:
        references = limited_references(target_source(run), run_device(run)) if timed else []
        for reference in references:  # a worker process, started at its first timing: ended here
            stack.callback(reference.close)
        # the one door `mars.tuned` goes through too; calibrations time with no other job of ours timing
        prompts = calibration_prompts(run, fmt, options[0].dtype, log) if timed else []
        request = Request(sampling, rules={m.name: sampling_of(m, run.sampling) for m in others}, trees=trees,
                          fixed_tree=fixed_tree(run.tree, sampled), drafting=run.tree.drafting, batch=run.batch_size,
                          budget=run.tree.calibration_budget, max_new_tokens=run.max_new_tokens, references=references,
                          shared=run.tree.calibrate and not run.tree.per_method, run_prompts=run_units(run), log=log,
                          exclusive=partial(locks.exclusive, timing_device(run, None), run.exclusive_timing))
        found = measure(partial(load_pair, run, head), options, prompts, request)
    kernels, tree, record = found.kernels, found.tree, found.records.get(STRICT)
    method_trees = {name: Setting(shape, f"measured for {name} with {kernels.label}: "
                                         f"{calibrated_reason(found.records[name], len(trees))}",
                                         found.records[name])
                    for name, shape in found.method_trees.items()}
    if run.tree.calibrate:
        shared = "" if run.tree.per_method else \
            "; every method drafts it (tree.per_method=false: rules compared at one tree)"
        tree_setting = Setting(tree, f"measured: {calibrated_reason(record, len(trees))}{shared}")
    else:
        tree_setting = Setting(tree, "set in the config (tree=...)")
    plain_kernels = None
    if run.model.plain_kernels is not None:
        chosen = Kernels.from_label(run.model.plain_kernels)
        if chosen != kernels:
            plain_kernels = Setting(chosen, "set explicitly (model.plain_kernels)")
    elif found.plain_kernels is not None and found.plain_kernels != kernels:
        plain_kernels = Setting(found.plain_kernels, plain_kernels_reason(record, kernels, found.plain_kernels))
    return DecodeSettings(
        dtype=Setting(kernels.dtype, dtype_reason(run, kernels, options, record)),
        exact_attention=Setting(kernels.exact_attention, exact_reason(run, kernels)),
        prepack=Setting(kernels.prepack, prepack_reason(run, kernels, options, record)),
        tree=tree_setting, drafting_reason=drafting_reason(run, tree, sampled, record),
        placement=placement_of(run), head=head, calibration=record, method_trees=method_trees,
        speculation=found.speculation,
        onednn=Setting(kernels.onednn, "measured: with the kernels above" if record else "default"),
        plain_kernels=plain_kernels)


def run_units(run: RunConfig) -> int | None:
    """How many units (prompts, or batches of them) the run times: what widens its predicted intervals."""
    if run.num_prompts is None:
        return None
    return max(1, run.num_prompts // run.batch_size)
