"""Evaluate decoding methods on a target + draft pair: speed, acceptance, relaxation and task quality.

    python -m eval.run                                    # quickstart: embedded pair, held-out stdlib prompts
    python -m eval.run num_prompts=64 max_new_tokens=128  # the full embedded benchmark
    python -m eval.run bench=humaneval num_prompts=null   # HumanEval pass@1 (completion prompts on the code model)
    python -m eval.run 'methods=[vanilla,strict,mars@0.95]' sampling.temperature=1.0
    python -m eval.run model=llama31_8b bench=mt_bench max_new_tokens=1024 num_prompts=null   # on a GPU

Methods: "generate" (transformers' `model.generate`, the fastest plain decoding a user has),
"vanilla" (our plain decoding, same adapter and cache as speculation), "strict" (lossless
verification) and "mars@<theta>". For every question every method runs before the next question
starts, in an order rotated per question, so slow drift of the machine's speed affects all alike.

Run directory: <out_dir>/T<temperature>-<id>, where <id> hashes every setting that affects the
answers (model, draft, dtype, prompt format, tree, exact attention, benchmark, sampling, methods,
max_new_tokens, seed; not num_prompts, so a longer rerun extends a shorter one). Rerunning the same
settings resumes there; different settings never touch it. Answers are appended to
answers/<method>.jsonl as each question finishes; questions that cannot fit the context are listed
with the reason in skipped/<method>.jsonl. summary.json holds the speed figures and, for the
public benchmarks, the task quality scored by `eval.score` (and quality recovery against strict).
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eagle.config import eos_token_ids
from eval import quality
from eval.answers import AnswerFile, answer_record, read_answers, run_id, write_atomic
from eval.bench import PUBLIC_SETS, PromptFormat, Question, encode, load_questions, prompt_format, resolve
from eval.metrics import format_table, margin_histogram, merged_stats, summarize
from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig
from mars.target import context_length

METHOD_FORMS = "'generate', 'vanilla', 'strict' or 'mars@<theta>' (e.g. mars@0.9)"
WANDB_MODES = ("disabled", "offline", "online")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Method:
    name: str
    rule: str | None  # None: plain decoding ("generate": transformers', "vanilla": ours)
    theta: float = 0.9


def parse_method(spec: str) -> Method:
    spec = str(spec).strip()
    if spec in ("generate", "vanilla"):
        return Method(spec, None)
    if spec == "strict":
        return Method(spec, "strict")
    if spec.startswith("mars@"):
        try:
            return Method(spec, "mars", float(spec[5:]))
        except ValueError:
            pass
    raise ValueError(f"unknown method {spec!r}: use {METHOD_FORMS}")


def sampling_config(method: Method, cfg: DictConfig) -> SamplingConfig:
    """The method's sampling settings; SamplingConfig raises on a bad temperature, theta, margin, ..."""
    s = cfg.sampling
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, rule=method.rule or "strict",
                          theta=method.theta, margin=cfg.mars.margin, mars_fallback=cfg.mars.fallback)


# --- the run's identity -------------------------------------------------------------------------

def run_identity(cfg: DictConfig) -> dict:
    """Every setting that affects the answers of a run (and nothing that only affects its timing)."""
    m = cfg.model
    return {
        "target": m.target, "draft": m.draft, "tokenizer": m.tokenizer, "dtype": m.dtype,
        "prompt": OmegaConf.to_container(m.prompt), "tree": OmegaConf.to_container(m.tree),
        "exact_attention": bool(m.exact_attention), "bench": cfg.bench.name, "questions": cfg.bench.questions,
        "sampling": OmegaConf.to_container(cfg.sampling), "mars": OmegaConf.to_container(cfg.mars),
        "methods": sorted(cfg.methods), "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed,
    }


def run_directory(cfg: DictConfig) -> Path:
    return resolve(cfg.out_dir) / f"T{cfg.sampling.temperature:g}-{run_id(run_identity(cfg))}"


def claim_run_directory(cfg: DictConfig, directory: Path) -> None:
    """Create the run directory, or check that an existing one holds answers to the same settings."""
    identity = run_identity(cfg)
    path = directory / "identity.json"
    if path.exists():
        before = json.loads(path.read_text())
        if before != json.loads(json.dumps(identity)):
            changed = sorted(k for k in set(before) | set(identity) if before.get(k) != identity.get(k))
            raise ValueError(f"{directory} holds a run with other settings ({', '.join(changed)} differ): "
                             "move it away or choose another out_dir")
        if not cfg.resume and any(read_answers(p) for p in (directory / "answers").glob("*.jsonl")):
            raise ValueError(f"{directory} already holds answers for these settings and resume=false: rerun with "
                             "resume=true (the default) to continue it, or move it away to start over")
        return
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(identity, indent=2) + "\n")


# --- models -----------------------------------------------------------------------------------

def model_source(spec: str, what: str) -> str:
    """A local directory (absolute or relative to the repository root) or a Hugging Face hub id."""
    local = resolve(spec)
    if local.exists():
        return str(local)
    if HUB_ID.match(spec):
        return spec
    raise FileNotFoundError(
        f"{what} not found at {local} (and {spec!r} is not a hub id 'owner/name'). The embedded pair lives in "
        "data/models/{target,draft} once built (data/models/README.md); otherwise set model.target / model.draft to a "
        "directory or hub id."
    )


def load_tokenizer(m: DictConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_source(m.tokenizer or m.target, "tokenizer"))


def load_target(m: DictConfig):
    """The target with `AutoModelForCausalLM.from_pretrained`, on `device` or sharded by `device_map`."""
    from transformers import AutoModelForCausalLM

    source = model_source(m.target, "target model")
    dtype = m.dtype if m.dtype == "auto" else getattr(torch, m.dtype)
    kwargs = {"device_map": m.device_map} if m.device_map else {}
    if m.get("max_memory"):
        kwargs["max_memory"] = OmegaConf.to_container(m.max_memory)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).eval()
    if not m.device_map:
        model.to(m.device)
    return model


def load_head(m: DictConfig, target):
    """The draft head: a local EAGLE checkpoint directory, or a hub repository downloaded first."""
    from eagle.checkpoint import load_draft

    source = model_source(m.draft, "draft model")
    if not Path(source).exists():
        from huggingface_hub import snapshot_download

        source = snapshot_download(repo_id=source)
    return load_draft(source, target)


# --- generation -------------------------------------------------------------------------------

def hf_generate(model, ids: list[int], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
                seed: int) -> GenerationOutput:
    """Plain decoding with transformers' own `model.generate` and the same logits processing."""
    from transformers import GenerationConfig

    greedy = sampling.greedy
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=not greedy, eos_token_id=eos or None,
        pad_token_id=model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None
        else (eos[0] if eos else 0),
        temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
        top_k=None if greedy else sampling.top_k,
    )
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([ids], device=device)
    torch.manual_seed(seed)  # generate samples from torch's global generator
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    seconds = time.perf_counter() - start
    tokens = out[0, len(ids):].tolist()
    stopped = next((i for i, t in enumerate(tokens) if t in eos), None)
    if stopped is not None:
        tokens = tokens[: stopped + 1]
    return GenerationOutput(tokens=tokens, accept_lengths=[0] * max(len(tokens) - 1, 0),
                            num_cycles=max(len(tokens) - 1, 0), seconds=seconds,
                            stopped_by="eos" if stopped is not None else "length")


def generate(gen: SpeculativeGenerator, method: Method, sampling: SamplingConfig, ids: list[int],
             max_new_tokens: int, eos: list[int], seed: int) -> GenerationOutput:
    if method.name == "generate":
        return hf_generate(gen.target.model, ids, sampling, max_new_tokens, eos, seed)
    input_ids = torch.tensor([ids], dtype=torch.long)
    rng = None
    if not sampling.greedy:
        rng = torch.Generator(device=gen.target.devices.logits).manual_seed(seed)
    decode = gen.vanilla if method.rule is None else gen.generate
    return decode(input_ids, sampling, max_new_tokens=max_new_tokens, eos_token_id=eos, generator=rng)


class Skip(Exception):
    """A question that cannot be answered under these settings (the reason is recorded)."""


class Evaluator:
    """Runs one method on one question (all its turns) and builds its answer record."""

    def __init__(self, cfg: DictConfig, gen: SpeculativeGenerator, tokenizer, fmt: PromptFormat):
        self.cfg, self.gen, self.tokenizer, self.fmt = cfg, gen, tokenizer, fmt
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

    def answer(self, method: Method, sampling: SamplingConfig, question: Question, seed: int) -> dict:
        texts, outs, extra = [], [], {"method": method.name, "token_ids": [], "max_new_tokens": [], "parses": [],
                                      "loglik": [], "loglik_tokens": []}
        for turn, prompt in enumerate(question.turns):
            ids = encode(self.tokenizer, question, texts, self.fmt)
            budget = self.budget(ids)
            out = generate(self.gen, method, sampling, ids, budget, self.eos, seed + turn)
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


# --- quality --------------------------------------------------------------------------------------

def score_quality(cfg: DictConfig, records: dict[str, list[dict]], figures: dict[str, dict]) -> str | None:
    """Add each method's task quality (`quality`, `quality_recovery` vs strict and vs vanilla) to `figures`.

    Public benchmarks are scored by `eval.score`; the embedded stdlib prompts by their parse rate
    and token probability. Returns the headline metric's name (None when nothing is scored).
    """
    bench, metric = cfg.bench.name, None
    if bench in PUBLIC_SETS:
        from eval.score import score

        # Reference-free sets compare against the same model's plain greedy output (strict greedy == vanilla).
        plain = records.get("vanilla") or records.get("generate")
        if plain is None and cfg.sampling.temperature == 0:
            plain = records.get("strict")
        for method, recs in records.items():
            try:
                result = score(bench, recs, cfg.bench.data_dir, baseline=plain)
            except (ValueError, FileNotFoundError, RuntimeError) as e:  # RuntimeError: an unreachable judge
                # The answers are on disk; a scoring failure must not lose the run's summary.
                figures[method]["quality_error"] = str(e)
                continue
            metric = result["metric"]
            figures[method]["quality"] = {k: v for k, v in result.items() if k not in ("bench", "n", "metric")}
    elif "parse_rate" in figures.get("strict", figures.get("vanilla", {})):
        metric = "parse_rate"
        for fig in figures.values():
            fig["quality"] = {k: fig[k] for k in ("parse_rate", "token_prob") if k in fig}
    if metric is None:
        return None
    for method, fig in figures.items():
        value = fig.get("quality", {}).get(metric)
        for key, reference in (("quality_recovery", "strict"), ("quality_recovery_vs_vanilla", "vanilla")):
            base = figures.get(reference, {}).get("quality", {}).get(metric)
            if method != reference and value is not None and base:
                fig[key] = value / base
    return metric


# --- reporting --------------------------------------------------------------------------------

def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    text = f"{cpu}, {cores()} cores, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def settings(cfg: DictConfig, questions: int, directory: Path) -> dict:
    import transformers

    return {
        "model": cfg.model.name, "target": cfg.model.target, "draft": cfg.model.draft, "dtype": cfg.model.dtype,
        "device": cfg.model.device_map or cfg.model.device, "bench": cfg.bench.name, "questions": questions,
        "max_new_tokens": cfg.max_new_tokens, **OmegaConf.to_container(cfg.sampling),
        "tree": OmegaConf.to_container(cfg.model.tree), "exact_attention": bool(cfg.model.exact_attention),
        "prompt": OmegaConf.to_container(cfg.model.prompt),
        "margin": cfg.mars.margin, "mars_fallback": cfg.mars.fallback, "methods": list(cfg.methods),
        "seed": cfg.seed, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "run_id": directory.name, "run_dir": str(directory),
        "shard": None,
        "order": "per question every method, order rotated by question" + ("; warm-up run first" if cfg.warmup else ""),
        "speedup": "ratio of total tokens/s to vanilla's (speedup) and to model.generate's (speedup_vs_generate); "
                   "speedup_per_question: ratio of mean per-question tokens/s (EAGLE tools)",
    }


def log_wandb(cfg: DictConfig, summary: dict, records: dict[str, list[dict]], out_dir: Path) -> None:
    import wandb

    run = wandb.init(project=cfg.wandb.project, entity=cfg.wandb.entity, name=cfg.wandb.name, mode=cfg.wandb.mode,
                     dir=str(out_dir), config=summary["settings"])
    logged = {}
    for method, fig in summary["methods"].items():
        logged.update({f"{method}/{k}": v for k, v in fig.items() if isinstance(v, (int, float))})
        logged.update({f"{method}/quality/{k}": v for k, v in fig.get("quality", {}).items()})
        logged.update({f"{method}/acceptance_depth_{d}": a for d, a in fig["acceptance_rate_by_depth"].items()})
        margins = merged_stats(records[method]).margins
        if margins:
            logged[f"{method}/margin_hist"] = wandb.Histogram(margins)
    run.log(logged)
    run.finish()


# --- the run ----------------------------------------------------------------------------------

def check_settings(cfg: DictConfig) -> tuple[list[Method], dict[str, SamplingConfig], PromptFormat, list[Question]]:
    """Everything that can be checked before a model loads: methods, sampling, prompt format, questions."""
    methods = [parse_method(m) for m in cfg.methods]
    if len({m.name for m in methods}) != len(methods) or not methods:
        raise ValueError(f"methods must be a non-empty list without repeats, got {list(cfg.methods)}")
    sampling = {m.name: sampling_config(m, cfg) for m in methods}
    if cfg.wandb.mode not in WANDB_MODES:
        raise ValueError(f"wandb.mode must be one of {WANDB_MODES}, got {cfg.wandb.mode!r}")
    unknown = set(cfg.bench.quality) - set(quality.FIGURES)
    if unknown:
        raise ValueError(f"unknown quality figures {sorted(unknown)}; known: {quality.FIGURES}")
    if not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {cfg.max_new_tokens!r}")
    fmt = prompt_format(cfg.model)
    questions = load_questions(cfg.bench.questions, cfg.bench.data_dir, cfg.num_prompts)
    model_source(cfg.model.target, "target model")  # a missing local path or malformed hub id, before any load
    model_source(cfg.model.draft, "draft model")
    return methods, sampling, fmt, questions


def run(cfg: DictConfig) -> dict:
    methods, sampling, fmt, questions = check_settings(cfg)  # bad settings fail before any model loads
    directory = run_directory(cfg)
    claim_run_directory(cfg, directory)
    torch.set_num_threads(cfg.threads or cores())
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model)
    target = load_target(cfg.model)
    head = load_head(cfg.model, target)
    with SpeculativeGenerator(target, head, **OmegaConf.to_container(cfg.model.tree),
                              exact_attention=bool(cfg.model.exact_attention)) as gen:
        evaluator = Evaluator(cfg, gen, tokenizer, fmt)
        records = answer_questions(cfg, evaluator, methods, sampling, questions, directory)
    summary = {"machine": machine(), "settings": settings(cfg, len(questions), directory),
               "methods": summarize(records)}
    summary["quality_metric"] = score_quality(cfg, records, summary["methods"])
    for method, fig in summary["methods"].items():
        fig["margin_histogram"] = margin_histogram(merged_stats(records[method]).margins, cfg.mars.margin,
                                                   sampling[method].theta if sampling[method].rule == "mars" else None)
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(directory / "summary.json", text)
    OmegaConf.save(cfg, directory / "config.yaml")
    if cfg.summary_path:
        path = resolve(cfg.summary_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    print(format_table(summary["methods"], summary["quality_metric"]))
    print(f"run: {directory}")
    if cfg.wandb.mode != "disabled":
        log_wandb(cfg, summary, records, directory)
    return summary


def answer_questions(cfg: DictConfig, evaluator: Evaluator, methods: list[Method], sampling: dict[str, SamplingConfig],
                     questions: list[Question], directory: Path) -> dict[str, list[dict]]:
    """Every method on every question not answered yet; returns the records of the requested questions."""
    files = {m.name: AnswerFile(directory / "answers" / f"{m.name}.jsonl") for m in methods}
    skipped = {m.name: AnswerFile(directory / "skipped" / f"{m.name}.jsonl") for m in methods}
    todo = [q for q in questions if any(not (files[m.name].done(q.question_id) or skipped[m.name].done(q.question_id))
                                        for m in methods)]
    if cfg.warmup and todo:  # first calls pay for allocation and kernel selection
        for m in methods:
            try:
                ids = encode(evaluator.tokenizer, todo[0], [], evaluator.fmt)
                generate(evaluator.gen, m, sampling[m.name], ids, min(16, evaluator.budget(ids)), evaluator.eos,
                         cfg.seed)
            except Skip:
                break
    speed = {m.name: [0, 0.0] for m in methods}
    bar = tqdm(questions, desc=f"{cfg.bench.name} x {len(methods)} methods", unit="q", dynamic_ncols=True)
    for i, question in enumerate(bar):
        evaluator.start(question)
        for m in methods[i % len(methods):] + methods[: i % len(methods)]:
            qid = question.question_id
            if files[m.name].done(qid) or skipped[m.name].done(qid):
                continue
            try:
                record = evaluator.answer(m, sampling[m.name], question, cfg.seed * 1_000_003 + i)
            except Skip as reason:
                skipped[m.name].append({"question_id": qid, "method": m.name, "reason": str(reason)})
                continue
            files[m.name].append(record)
            choice = record["choices"][0]
            speed[m.name][0] += sum(choice["new_tokens"])
            speed[m.name][1] += sum(choice["wall_time"])
        bar.set_postfix({name: f"{t / s:.0f}t/s" for name, (t, s) in speed.items() if s})
    wanted = {q.question_id for q in questions}
    return {name: [r for r in f.records.values() if r["question_id"] in wanted] for name, f in files.items()}


@hydra.main(version_base=None, config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
