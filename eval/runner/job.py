"""One evaluation job (`python -m eval.run`, or one job of a Hydra multirun): answer, score, summarize.

A job answers its `method` (generate: transformers' `model.generate`; vanilla: our plain decoding;
strict: lossless verification; mars: margin-aware verification) and its `baselines` (default
generate, vanilla, strict). For every question every method still to answer runs before the next
question starts, in an order rotated per question, so slow drift of the machine's speed affects all
alike.

Each method's answers live in a run directory of their own, <out_dir>/<method>-T<temperature>-<id>
(+ -shard<i>of<n>), where <id> hashes every setting that affects that method's answers: vanilla's
directory does not depend on the tree or θ, so every job of a θ sweep shares one vanilla baseline
and the first job to need it answers it (a lock file keeps two parallel jobs from answering the same
directory). Rerunning resumes; other settings never touch it. Answers are appended to
answers/<method>.jsonl as each question finishes; questions that cannot fit the context are listed
with the reason in skipped/<method>.jsonl. The job's run directory (its method's) gets summary.json
(speed figures of every method, task quality scored by `eval.score`, recovery against strict) and
config.yaml (the resolved config). A job whose answers and summary are complete is skipped without
loading a model.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from eagle.files import write_atomic
from eagle.precision import DTYPES, cores, cpu_name
from eval.benchmarks import BENCHMARKS
from eval.benchmarks.prompting import PromptFormat
from eval.benchmarks.questions import Question
from eval.benchmarks.score_files import answer_turns, score
from eval.config.methods import GENERATE, PLAIN, STRICT, VANILLA, GenerateConfig, MethodConfig, RuleMethod, plain
from eval.config.paths import resolve
from eval.config.schema import RunConfig, parse_shard, validate
from eval.reporting.metrics import format_table, margin_histogram, merged_stats, ratio, summarize
from eval.reporting.tracking import start_tracking
from eval.rundirs.layout import CONFIG, SUMMARY, read_answers
from eval.runner import locks
from eval.runner.answer_loop import Evaluator, answer_questions
from eval.runner.budgeted import budgeted
from eval.runner.directories import (
    answer_path,
    answered,
    claim_run_directory,
    job_methods,
    job_records,
    method_dtype,
)
from eval.runner.job_settings import bench_questions, resolve_settings, timing_device
from eval.runner.models import (
    claim_gpus,
    load_head,
    load_target,
    load_tokenizer,
    make_generator,
    model_source,
    target_source,
)
from eval.runner.plain import GenerateWorker
from eval.scoring import quality, sandbox
from eval.scoring.recovery import agreement, paired_recovery
from mars.adapter.sources import provenance
from mars.decoding.settings import DecodeSettings

# --- quality ------------------------------------------------------------------------------------

def question_categories(run: RunConfig, questions: list[tuple[int, Question]]) -> dict | None:
    """{question_id: category} for a benchmark reported per category (Spec-Bench), else None."""
    spec = BENCHMARKS.get(run.bench.questions)
    return {q.question_id: q.category for _, q in questions} if spec is not None and spec.by_category else None


def score_quality(run: RunConfig, records: dict[str, list[dict]], figures: dict[str, dict]) -> str | None:
    """Add each method's task quality (`quality`, `quality_recovery` vs strict and vs vanilla) to `figures`,
    and against strict what the recovery rests on (`eval.scoring.recovery`): `quality_recovery_ci` (n,
    the questions it rests on, a paired bootstrap interval, why it is undefined where strict scores 0)
    and `agreement_vs_strict` (ROUGE-L and exact match of each method's answers against strict's).

    Public benchmarks are scored by `eval.score`; the embedded stdlib prompts by their parse rate
    and token probability. Returns the headline metric's name (None when nothing is scored).
    """
    bench, metric = run.bench.name, None
    each: dict[str, dict] = {}  # method -> {question id: per-question figures}
    yardstick = None  # the method whose answers a reference-free set is scored against
    if bench in BENCHMARKS:
        # Reference-free sets compare against the same model's plain greedy output (strict greedy == vanilla).
        yardstick = next((m for m in (VANILLA, GENERATE) if m in records), None)
        if yardstick is None and run.sampling.temperature == 0:
            yardstick = STRICT if STRICT in records else None
        plain_answers = records[yardstick] if yardstick else None
        for method, recs in records.items():
            try:
                result = score(bench, recs, run.bench.data_dir, baseline=plain_answers, source=run.bench.source,
                               per_question=True)
            except (ValueError, FileNotFoundError, RuntimeError) as e:  # RuntimeError: an unreachable judge
                # The answers are on disk; a scoring failure must not lose the run's summary.
                figures[method]["quality_error"] = str(e)
                continue
            metric = result["metric"]
            each[method] = result.pop("per_question")
            figures[method]["quality"] = {k: v for k, v in result.items() if k not in ("bench", "n", "metric")}
    elif any("parse_rate" in fig for fig in figures.values()):
        metric = "parse_rate"
        for fig in figures.values():
            fig["quality"] = {k: fig[k] for k in ("parse_rate", "token_prob") if k in fig}
    if metric is None:
        return None
    # On a set scored against plain answers, the method that wrote them scores 100 by construction: a
    # "recovery" of it (at T = 1 against strict's independent sample) would say nothing.
    scored_against = yardstick if yardstick and BENCHMARKS[bench].vs_vanilla and metric != "judge_score" else None
    for method, fig in figures.items():
        value = fig.get("quality", {}).get(metric)
        for key, reference in (("quality_recovery", STRICT), ("quality_recovery_vs_vanilla", VANILLA)):
            base = figures.get(reference, {}).get("quality", {}).get(metric)
            if method not in (reference, scored_against) and value is not None and base:
                fig[key] = ratio(value, base)
    if STRICT in each:
        # A judge's ratings are lists per turn, not one figure per question: no interval for them.
        against_strict(None if metric == "judge_score" else BENCHMARKS[bench].figure_of_question(),
                       records, each, figures, scored_against)
    return metric


def against_strict(key: str | None, records: dict[str, list[dict]], each: dict[str, dict],
                   figures: dict[str, dict], scored_against: str | None = None) -> None:
    """Every other method's `quality_recovery_ci` (per-question figure `key`, paired by question) and
    `agreement_vs_strict` (its answers against strict's), from the methods' per-question figures `each`.
    `scored_against`: the method whose answers the benchmark scores every method against (its interval
    says so instead of a ratio)."""
    strict_turns = {str(r["question_id"]): answer_turns(r) for r in records[STRICT]}
    for method, per in each.items():
        if method == STRICT:
            continue
        if method == scored_against:
            figures[method]["quality_recovery_ci"] = {
                "n": len(per), "undefined": f"every method is scored against {method}'s answers"}
        elif key is not None:
            common = [q for q in each[STRICT] if q in per and key in per[q] and key in each[STRICT][q]]
            ci = paired_recovery([float(per[q][key]) for q in common], [float(each[STRICT][q][key]) for q in common])
            # Its "recovery" is the ratio of the per-question means it resamples: the headline's ratio, except
            # where the headline is a corpus figure (BLEU; `figure` names what it is).
            figures[method]["quality_recovery_ci"] = {**ci, "figure": key}
            if ci["recovery"] is None:  # strict's score is 0 or about 0 (`undefined` says which): none in the tables
                figures[method].pop("quality_recovery", None)
        mine = {str(r["question_id"]): answer_turns(r) for r in records[method]}
        paired = [q for q in strict_turns if q in mine]
        if paired:
            figures[method]["agreement_vs_strict"] = agreement([mine[q] for q in paired],
                                                               [strict_turns[q] for q in paired])


# --- the machine and the settings --------------------------------------------------------------

def threads(run: RunConfig) -> int:
    """The job's torch threads: `threads`, else $OMP_NUM_THREADS where the user set it (e.g. one per job of a
    parallel sweep), else every core."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return run.threads or (int(omp) if omp.isdigit() and int(omp) > 0 else cores())


def machine() -> str:
    text = f"{cpu_name()}, {cores()} cores, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def sandbox_level(run: RunConfig) -> str | None:
    """The sandbox isolation level a sandboxed benchmark's programs (HumanEval's) will run under (None for
    benchmarks without programs); raises SandboxUnavailable now, before any model loads, where it would refuse."""
    spec = BENCHMARKS.get(run.bench.name)  # bench.name may name an unregistered set (a .jsonl of questions)
    if spec is None or not spec.sandboxed:
        return None
    sandbox.allow_unisolated(run.sandbox.allow_unisolated)
    return sandbox.isolation()


def target_origin(run: RunConfig) -> dict:
    """Where the target's weights came from: a converted GGUF's provenance (file, sha256, package, tensor
    types), else the directory or hub id loaded."""
    source = target_source(run)
    return provenance(source) or {"format": "transformers", "spec": run.model.target, "loaded_from": source}


def settings_record(run: RunConfig, resolved: DecodeSettings, questions: int, directories: dict[str, Path]) -> dict:
    """The summary's settings: the run's configuration with every resolved choice and its reason."""
    import transformers

    m = run.model
    return {
        "model": m.name, "target": m.target, "target_source": target_origin(run), **resolved.record(),
        "dtype_requested": m.dtype.value,
        "tree_requested": plain(run.tree), "device": m.device_map or m.device, "bench": run.bench.name,
        "questions": questions, "max_new_tokens": run.max_new_tokens, "batch_size": run.batch_size,
        **plain(run.sampling),
        "static": m.static, "compile": m.compile, "max_cache_len": m.max_cache_len,
        "prompt": plain(m.prompt), "method": plain(run.method),
        "methods": list(directories), "run_dirs": {name: str(d) for name, d in directories.items()},
        "seed": run.seed, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "shard": run.shard,
        "order": ("per question every method still to answer, order rotated by question" if run.batch_size == 1 else
                  f"per group of {run.batch_size} questions every method still to answer, answering the group at "
                  "once (wall_time: each answer's share of its batch's), order rotated by group")
                 + ("; warm-up run first" if run.warmup else ""),
        "speedup": "ratio of total tokens/s to vanilla's (speedup), to model.generate's in the run's precision "
                   "(speedup_vs_generate) and to the fastest plain decoding timed in the run, model.generate in "
                   "any precision or vanilla (speedup_vs_fastest); speedup_vs_fastest_paired: per question, "
                   "tokens/s over the fastest plain decoding's on it, 20% trimmed geometric mean over the "
                   "speedup_vs_fastest_paired_n questions; speedup_per_question: ratio of mean "
                   "per-question tokens/s (EAGLE tools); predicted_speedup_vs_fastest: calibration's prediction of "
                   "speedup_vs_fastest (speculation off: decoded plainly). Baselines answered by an earlier job of a "
                   "sweep were timed then, not interleaved with this method",
    }


def speculation_figures(resolved: DecodeSettings, method: str) -> dict:
    """A rule method's summary entry on speculation: "speculation" ("on", "off": decoded plainly, "forced": a
    tree set explicitly) and, where calibration predicted it, "predicted_speedup_vs_fastest" (the calibration's
    paired ratio over the fastest plain decoding) and its 90% "predicted_interval" for this run's prompts, beside
    the measured `speedup_vs_fastest_paired`. A method with no verdict
    of its own drafts a tree it did not choose (set explicitly with nothing timed, or strict's when rules are
    compared at one tree, `tree.per_method=false`), which always speculates: "forced"."""
    spec = resolved.speculation.get(method)
    if spec is None:
        return {"speculation": "forced",
                "speculation_reason": f"speculation forced for {method}: it drafts {resolved.tree_for(method).label}, "
                                      "set explicitly or strict's (rules compared at one tree), not timed for it"}
    return {"speculation": spec.state, "predicted_speedup_vs_fastest": spec.predicted,
            "predicted_interval": list(spec.interval) if spec.interval else None, "verdict_certain": spec.certain,
            "speculation_reason": spec.reason}


def sweep_name() -> str | None:
    """The multirun's sweep directory name (the W&B group of its jobs), None outside a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None


# --- the job ------------------------------------------------------------------------------------

def check_settings(run: RunConfig) -> tuple[PromptFormat, list[tuple[int, Question]], str | None]:
    """What can be checked before a model loads: the sandbox, quality figures, prompt format, questions,
    model paths.

    Returns the prompt format, the questions this job answers with their index in the whole set (seeds and
    the method order follow it, so a shard answers exactly what the unsharded run does), and the sandbox
    level its programs run under (`sandbox_level`: a sandbox that would refuse fails now, not after hours
    of answering).
    """
    level = sandbox_level(run)
    unknown = set(run.bench.quality) - set(quality.FIGURES)
    if unknown:
        raise ValueError(f"unknown quality figures {sorted(unknown)}; known: {quality.FIGURES}")
    fmt = PromptFormat.of(run.model.prompt)
    questions = list(enumerate(bench_questions(run, run.num_prompts)))
    shard = parse_shard(run.shard)
    if shard:
        questions = questions[shard[0]::shard[1]]
    target_source(run)  # a missing local path, malformed hub id or wrong GGUF checksum, before any load
    model_source(run.model.draft, "draft model")
    if run.model.sampling_draft:
        model_source(run.model.sampling_draft, "sampling draft model (model.sampling_draft)")
    return fmt, questions, level


def run(composed: DictConfig | RunConfig) -> dict:
    """One job: answer what is missing, then write the job's summary (see the module docstring). `composed`:
    the config Hydra composed (or a `RunConfig`), validated into `config` first."""
    config = validate(composed)  # value ranges, before anything else
    fmt, questions, level = check_settings(config)  # bad settings fail before any model loads
    if level == sandbox.UNISOLATED:
        print("sandbox: unisolated (sandbox.allow_unisolated=true): HumanEval's programs run with your permissions")
    config, choice = budgeted(config, fmt)  # a method.quality_budget chooses the method's parameter first
    # Resolved once, before the run directories (their names include the precision and the tree); every
    # later step reads this object.
    resolved = resolve_settings(config, fmt)
    print("\n".join(resolved.describe()))
    methods = job_methods(config, resolved)
    directories = {m.name: claim_run_directory(config, m, resolved) for m in methods}
    job_dir = directories[config.method.name]
    if not config.resume and any(read_answers(answer_path(directories[m.name], m)) for m in methods):
        raise ValueError(f"{job_dir.parent} already holds answers for these settings and resume=false: rerun with "
                         "resume=true (the default) to continue them, or move the run directories away")
    ids = {q.question_id for _, q in questions}
    pending = [m for m in methods if not answered(directories[m.name], m, ids)]
    if not pending and (summary := _finished_summary(job_dir, directories, ids)) is not None:
        print(f"done already: {job_dir} (every answer and the summary are there; nothing to run)")
        return summary
    started = time.time()
    tracker = _start_job(composed if choice is None else config, config, resolved, level, job_dir)  # θ as chosen
    answered_now = answer_pending(config, resolved, fmt, questions, pending, directories, tracker) if pending else []
    records = job_records(methods, directories, ids)
    categories = question_categories(config, questions)
    settings = settings_record(config, resolved, len(ids), directories)
    if level is not None:
        settings["sandbox"] = level  # the report's settings show it (unisolated: the code ran unconfined)
    if choice is not None:
        settings["quality_budget"] = choice.to_dict()  # the value chosen and every value measured
    summary = {"machine": machine(), "settings": settings,
               "job": {"host": platform.node(), "pid": os.getpid(), "started": started, "finished": time.time(),
                       "answered": answered_now},  # the methods this job added answers to
               "methods": summarize(records, plain=[m.name for m in methods if m.kind in PLAIN],
                                    categories=categories)}
    with locks.busy("cpu", config.exclusive_timing):  # scoring computes (HumanEval's programs): not while others time
        summary["quality_metric"] = score_quality(config, records, summary["methods"])
    margins = {name: merged_stats(recs).gates for name, recs in records.items()}
    for m in methods:
        fig = summary["methods"][m.name]
        fig["run_dir"] = str(directories[m.name])
        if isinstance(m, RuleMethod):
            _rule_figures(fig, m, resolved, records[m.name], margins[m.name])
    text = json.dumps(summary, indent=2) + "\n"
    for path in [job_dir / SUMMARY, *([resolve(config.summary_path)] if config.summary_path else [])]:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    print(format_table(summary["methods"], summary["quality_metric"]))
    print(f"run: {job_dir}")
    tracker.finish(summary, {m.name: answer_path(directories[m.name], m) for m in methods}, margins)
    return summary


def _finished_summary(job_dir: Path, directories: dict[str, Path], ids: set) -> dict | None:
    """The job's summary where it is there for these methods and questions (nothing left to run), else None."""
    if not (job_dir / SUMMARY).exists():
        return None
    summary = json.loads((job_dir / SUMMARY).read_text())
    if summary["settings"].get("methods") == list(directories) and summary["settings"]["questions"] == len(ids):
        return summary
    return None


def _start_job(composed: DictConfig | RunConfig, config: RunConfig, resolved: DecodeSettings, level: str | None,
               job_dir: Path):
    """Save the job's config in its directory and start its tracker (W&B or none), the sandbox's isolation noted
    (and tagged where the code runs unconfined); returns the tracker."""
    OmegaConf.save(OmegaConf.structured(config) if not isinstance(composed, DictConfig) else composed, job_dir / CONFIG,
                   resolve=True)
    wandb_config = {**plain(config), "resolved": resolved.record()}
    if level is not None:
        wandb_config["sandbox"] = {**wandb_config.get("sandbox", {}), "isolation": level}
        if level == sandbox.UNISOLATED:
            config.logging.tags = [*config.logging.tags, "sandbox:unisolated"]
    return start_tracking(config.logging, job_dir, wandb_config,
                          model=config.model.name, bench=config.bench.name,
                          method=config.method.name, temperature=config.sampling.temperature, sweep=sweep_name())


def _rule_figures(fig: dict, m: RuleMethod, resolved: DecodeSettings, records: list[dict],
                  margins: list[float]) -> None:
    """A rule method's figures in its summary: its rule, tree and speculation verdict, whose answers it took
    (speculation off), and the histogram of its margins."""
    fig["rule"] = {"name": m.kind, **m.rule().params()}
    fig["tree"] = resolved.tree_for(m.name).label  # the tree it drafted (its own, where measured)
    fig.update(speculation_figures(resolved, m.name))
    sources = {r.get("answers_of") for r in records}
    if sources and None not in sources:  # speculation off: the plain method's answers (answer_loop.plain_answers)
        fig["answers_of"] = ", ".join(sorted(sources))
        fig["speculation_reason"] += (f"; its answers are {fig['answers_of']}'s in this run (the same "
                                      "decoding: timing it again would measure only the machine's noise)")
    fig["margin_histogram"] = margin_histogram(margins, *m.rule().gate_scale())


def answer_pending(config: RunConfig, resolved: DecodeSettings, fmt: PromptFormat,
                   questions: list[tuple[int, Question]], pending: list[MethodConfig], directories: dict[str, Path],
                   tracker) -> list[str]:
    """Load the models and answer the pending methods, each under its run directory's lock, taken in
    turn so that parallel jobs never wait for each other (`eval.runner.locks.answer_in_turn`): those no
    other job is answering together (interleaved), the others once their job has let go. Loading
    waits while another job times (`locks.busy`); each timed answer holds the timing lock.
    Returns the methods that got new answers."""
    torch.set_num_threads(threads(config))
    torch.manual_seed(config.seed)
    answered: set[str] = set()
    with contextlib.ExitStack() as stack:
        gpus = None
        if config.gpus_per_job or chosen_launcher() == "gpus":
            gpus, handles = claim_gpus(config.gpus_per_job or 1, torch.cuda.device_count())
            for handle in handles:
                stack.callback(handle.close)
            print(f"job GPUs: {gpus}")
        device = timing_device(config, gpus)
        register = stack.enter_context(locks.registered(device))
        with locks.busy(device, config.exclusive_timing):
            tokenizer = load_tokenizer(config)
            trees = {m.name: resolved.tree_for(m.name) for m in pending if isinstance(m, RuleMethod)}
            rows = max(t.total_tokens for t in [resolved.tree.value, *trees.values()]) + 1
            target = load_target(config, resolved.torch_dtype, gpus, rows)
            head = load_head(resolved.head, target)
            copies = {resolved.dtype.value: target}  # the target in each precision loaded, once
            if resolved.plain.dtype not in copies:  # plain decoding measured fastest in another precision
                copies[resolved.plain.dtype] = load_target(config, resolved.plain.torch_dtype, gpus, rows)
            gen = stack.enter_context(make_generator(target, head, resolved, config, profile=config.profile,
                                                     plain_model=copies.get(resolved.plain.dtype) if
                                                     resolved.plain.dtype != resolved.dtype.value else None))
            plain_models = {}
            for m in pending:  # generate@<dtype>: the target again in that precision, or in a worker process
                if isinstance(m, GenerateConfig) and m.isa:
                    worker = stack.enter_context(GenerateWorker(config, method_dtype(m, resolved), m.isa))
                    register(worker.process.pid)  # its CPU time is this job's
                    plain_models[m.name] = worker
                elif method_dtype(m, resolved) != resolved.dtype.value:
                    dtype = method_dtype(m, resolved)
                    if dtype not in copies:
                        copies[dtype] = load_target(config, DTYPES[dtype], gpus, rows)
                    plain_models[m.name] = copies[dtype]
        off = {m.name: plain_method(resolved.speculation[m.name].plain, pending, resolved)
               for m in pending if isinstance(m, RuleMethod) and not resolved.speculates(m.name)}
        evaluator = Evaluator(config, gen, tokenizer, fmt, plain_models=plain_models, timing_device=device,
                              trees=trees, plain_methods=off)
        by_name = {m.name: m for m in pending}

        def answer(names: list[str]) -> None:
            answered.update(answer_questions(config, evaluator, [by_name[n] for n in names], questions,
                                             directories, tracker))

        locks.answer_in_turn({m.name: directories[m.name] for m in pending}, answer)
    return [m.name for m in pending if m.name in answered]


def plain_method(label: str | None, methods: list[MethodConfig], resolved: DecodeSettings) -> str | None:
    """The run's method that decodes as the plain decoding `label` names ("vanilla <kernels>",
    "generate@<dtype>[+<isa>]"), else the run's vanilla, else None (the method then decodes with our vanilla)."""
    for m in methods:
        isa = f"+{m.isa}" if isinstance(m, GenerateConfig) and m.isa else ""
        if isinstance(m, GenerateConfig) and label == f"generate@{method_dtype(m, resolved)}{isa}":
            return m.name
    return next((m.name for m in methods if m.kind == VANILLA), None)


def chosen_launcher() -> str | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("hydra/launcher") if HydraConfig.initialized() else None
