"""Evaluate decoding methods on a target + draft pair: speed, acceptance, relaxation and quality.

    python -m eval.run                                    # quickstart: embedded pair, held-out stdlib prompts
    python -m eval.run num_prompts=64 max_new_tokens=128  # the full embedded benchmark
    python -m eval.run 'methods=[vanilla,strict,mars@0.95]' sampling.temperature=1.0
    python -m eval.run model=llama31_8b bench=mt_bench max_new_tokens=1024 num_prompts=null   # on a GPU

Configs live in configs/ (Hydra). Methods are "vanilla", "strict" or "mars@<theta>". For every
question every method runs before the next question starts (in an order rotated per question), so
slow drift of the machine's speed affects all methods alike. Each method's answers are appended to
<out_dir>/answers/<method>.jsonl as questions finish; `resume=true` skips questions already there.
The summary (<out_dir>/summary.json, or `summary_path`) has the layout of scripts/bench_embedded.sh.
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eagle.config import eos_token_ids
from eval import quality
from eval.answers import AnswerFile, answer_record
from eval.bench import Question, encode, load_questions, resolve
from eval.metrics import format_table, merged_stats, summarize
from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig

METHOD_FORMS = "'vanilla', 'strict' or 'mars@<theta>' (e.g. mars@0.9)"
WANDB_MODES = ("disabled", "offline", "online")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Method:
    name: str
    rule: str | None  # None: vanilla decoding
    theta: float = 0.9


def parse_method(spec: str) -> Method:
    spec = str(spec).strip()
    if spec in ("vanilla", "strict"):
        return Method(spec, None if spec == "vanilla" else "strict")
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


def load_target(m: DictConfig):
    """(model, tokenizer) for the target, with `AutoModelForCausalLM.from_pretrained`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = model_source(m.target, "target model")
    dtype = m.dtype if m.dtype == "auto" else getattr(torch, m.dtype)
    kwargs = {"device_map": m.device_map} if m.device_map else {}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).eval()
    if not m.device_map:
        model.to(m.device)
    tokenizer = AutoTokenizer.from_pretrained(model_source(m.tokenizer or m.target, "tokenizer"))
    if m.chat_template:
        tokenizer.chat_template = m.chat_template
    return model, tokenizer


def load_head(m: DictConfig, target):
    """The draft head: a local EAGLE checkpoint directory, or a hub repository downloaded first."""
    from eagle.checkpoint import load_draft

    source = model_source(m.draft, "draft model")
    if not Path(source).exists():
        from huggingface_hub import snapshot_download

        source = snapshot_download(repo_id=source)
    return load_draft(source, target)


# --- generation -------------------------------------------------------------------------------

def generate(gen: SpeculativeGenerator, method: Method, sampling: SamplingConfig, ids: list[int],
             max_new_tokens: int, eos: list[int], seed: int | None) -> GenerationOutput:
    input_ids = torch.tensor([ids], dtype=torch.long)
    rng = None
    if not sampling.greedy:
        rng = torch.Generator(device=gen.target.devices.logits).manual_seed(seed or 0)
    decode = gen.vanilla if method.rule is None else gen.generate
    return decode(input_ids, sampling, max_new_tokens=max_new_tokens, eos_token_id=eos, generator=rng)


class Evaluator:
    """Runs one method on one question (all its turns) and builds its answer record."""

    def __init__(self, cfg: DictConfig, gen: SpeculativeGenerator, tokenizer, model_id: str):
        self.cfg, self.gen, self.tokenizer, self.model_id = cfg, gen, tokenizer, model_id
        self.eos = sorted(eos_token_ids(gen.target.model, tokenizer))
        self.figures = set(cfg.bench.quality)
        self._loglik: dict[tuple, tuple[float, int]] = {}  # for the current question only

    def encode(self, question: Question, answers: list[str]) -> list[int]:
        m = self.cfg.model
        return encode(self.tokenizer, question.turns, answers, self.cfg.bench.chat, m.system_prompt,
                      OmegaConf.to_container(m.chat_template_kwargs) if m.chat_template_kwargs else None)

    def loglik(self, ids: list[int], tokens: list[int]) -> tuple[float, int]:
        key = (tuple(ids), tuple(tokens))  # strict greedy repeats vanilla's tokens: score them once
        if key not in self._loglik:
            self._loglik[key] = quality.completion_loglik(self.gen.target.model, ids, tokens)
        return self._loglik[key]

    def start(self, question: Question) -> None:
        self._loglik.clear()

    def answer(self, method: Method, sampling: SamplingConfig, question: Question, seed: int) -> dict:
        texts, outs, extra = [], [], {"method": method.name, "token_ids": [], "parses": [], "loglik": [],
                                      "loglik_tokens": []}
        for turn, prompt in enumerate(question.turns):
            ids = self.encode(question, texts)
            out = generate(self.gen, method, sampling, ids, self.cfg.max_new_tokens, self.eos, seed + turn)
            text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
            texts.append(text)
            outs.append(out)
            extra["token_ids"].append(out.tokens)
            extra["parses"].append(quality.parses(prompt, text, out.stopped_by == "eos")
                                   if "parses" in self.figures else None)
            ll, n = self.loglik(ids, out.tokens) if "loglik" in self.figures else (None, 0)
            extra["loglik"].append(ll)
            extra["loglik_tokens"].append(n)
        stats = outs[0].stats
        for out in outs[1:]:
            stats.merge(out.stats)
        extra.update(accepted=[sum(o.accept_lengths) for o in outs], relaxed=[o.relaxed_tokens for o in outs],
                     stopped_by=[o.stopped_by for o in outs], verify=stats.to_json())
        return answer_record(question.question_id, f"{self.model_id}-{method.name}", texts,
                             [o.num_cycles for o in outs], [len(o.tokens) for o in outs],
                             [round(o.seconds, 6) for o in outs], extra)


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
    text = f"{cpu}, {cores()} cores, torch {torch.__version__}"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def settings(cfg: DictConfig, questions: int) -> dict:
    import transformers

    return {
        "model": cfg.model.name, "target": cfg.model.target, "draft": cfg.model.draft, "dtype": cfg.model.dtype,
        "device": cfg.model.device_map or cfg.model.device, "bench": cfg.bench.name, "questions": questions,
        "max_new_tokens": cfg.max_new_tokens, **OmegaConf.to_container(cfg.sampling),
        "tree": OmegaConf.to_container(cfg.model.tree),
        "exact_attention": bool(cfg.model.get("exact_attention", False)),
        "margin": cfg.mars.margin, "mars_fallback": cfg.mars.fallback,
        "seed": cfg.seed, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "order": "per question every method, order rotated by question; warm-up run first" if cfg.warmup
        else "per question every method, order rotated by question",
        "speedup": "ratio of total tokens/s; speedup_per_question: ratio of mean per-question tokens/s (EAGLE tools)",
    }


GENERATION_KEYS = ("target", "draft", "dtype", "bench", "max_new_tokens", "temperature", "top_p", "top_k", "tree",
                   "exact_attention", "margin", "mars_fallback", "seed")


def check_resume(path: Path, current: dict, resume: bool) -> None:
    """Refuse to resume answers produced with other generation settings."""
    if resume and path.exists():
        before = json.loads(path.read_text())
        changed = [k for k in GENERATION_KEYS if before.get(k) != current.get(k)]
        if changed:
            raise ValueError(f"resume=true but {', '.join(changed)} changed since {path} was written: "
                             "use another out_dir, or resume=false to start over")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2))


def log_wandb(cfg: DictConfig, summary: dict, records: dict[str, list[dict]], out_dir: Path) -> None:
    import wandb

    run = wandb.init(project=cfg.wandb.project, entity=cfg.wandb.entity, name=cfg.wandb.name, mode=cfg.wandb.mode,
                     dir=str(out_dir), config=summary["settings"])
    logged = {}
    for method, fig in summary["methods"].items():
        logged.update({f"{method}/{k}": v for k, v in fig.items() if isinstance(v, (int, float))})
        logged.update({f"{method}/acceptance_depth_{d}": a for d, a in fig["acceptance_rate_by_depth"].items()})
        margins = merged_stats(records[method]).margins
        if margins:
            logged[f"{method}/margin_hist"] = wandb.Histogram(margins)
    run.log(logged)
    run.finish()


# --- the run ----------------------------------------------------------------------------------

def run(cfg: DictConfig) -> dict:
    methods = [parse_method(m) for m in cfg.methods]
    if len({m.name for m in methods}) != len(methods) or not methods:
        raise ValueError(f"methods must be a non-empty list without repeats, got {list(cfg.methods)}")
    sampling = {m.name: sampling_config(m, cfg) for m in methods}  # bad settings fail before models load
    if cfg.wandb.mode not in WANDB_MODES:
        raise ValueError(f"wandb.mode must be one of {WANDB_MODES}, got {cfg.wandb.mode!r}")
    unknown = set(cfg.bench.quality) - set(quality.FIGURES)
    if unknown:
        raise ValueError(f"unknown quality figures {sorted(unknown)}; known: {quality.FIGURES}")
    torch.set_num_threads(cfg.threads or cores())
    torch.manual_seed(cfg.seed)
    questions = load_questions(cfg.bench.questions, cfg.bench.data_dir, cfg.num_prompts)

    target, tokenizer = load_target(cfg.model)
    head = load_head(cfg.model, target)
    gen = SpeculativeGenerator(target, head, **OmegaConf.to_container(cfg.model.tree),
                               exact_attention=bool(cfg.model.get("exact_attention", False)))
    with gen:  # hands the target back with its own attention implementation
        return _run(cfg, methods, sampling, questions, gen, tokenizer)


def _run(cfg: DictConfig, methods: list[Method], sampling: dict[str, SamplingConfig], questions: list[Question],
         gen: SpeculativeGenerator, tokenizer) -> dict:
    evaluator = Evaluator(cfg, gen, tokenizer, cfg.model.name)

    out_dir = resolve(cfg.out_dir)
    run_settings = settings(cfg, len(questions))
    check_resume(out_dir / "settings.json", run_settings, cfg.resume)
    files = {m.name: AnswerFile(out_dir / "answers" / f"{m.name}.jsonl", cfg.resume) for m in methods}
    OmegaConf.save(cfg, out_dir / "config.yaml")

    if cfg.warmup:  # first calls pay for allocation and kernel selection
        for m in methods:
            ids = evaluator.encode(questions[0], [])
            generate(gen, m, sampling[m.name], ids, min(16, cfg.max_new_tokens), evaluator.eos, cfg.seed)

    speed = {m.name: [0, 0.0] for m in methods}
    bar = tqdm(questions, desc=f"{cfg.bench.name} x {len(methods)} methods", unit="q", dynamic_ncols=True)
    for i, question in enumerate(bar):
        evaluator.start(question)
        for m in methods[i % len(methods):] + methods[: i % len(methods)]:
            if files[m.name].done(question.question_id):
                continue
            record = evaluator.answer(m, sampling[m.name], question, cfg.seed * 1_000_003 + i)
            files[m.name].append(record)
            choice = record["choices"][0]
            speed[m.name][0] += sum(choice["new_tokens"])
            speed[m.name][1] += sum(choice["wall_time"])
        bar.set_postfix({name: f"{t / s:.0f}t/s" for name, (t, s) in speed.items() if s})

    wanted = {q.question_id for q in questions}
    records = {name: [r for r in f.records.values() if r["question_id"] in wanted] for name, f in files.items()}
    summary = {"machine": machine(), "settings": run_settings, "methods": summarize(records)}
    summary_path = resolve(cfg.summary_path) if cfg.summary_path else out_dir / "summary.json"
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(format_table(summary["methods"]))
    print(f"answers: {out_dir / 'answers'}  summary: {summary_path}")
    if cfg.wandb.mode != "disabled":
        log_wandb(cfg, summary, records, out_dir)
    return summary


@hydra.main(version_base=None, config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
