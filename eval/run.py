"""Evaluate a decoding method on a target + draft pair: speed, acceptance, relaxation and task quality.

    python -m eval.run                                     # quickstart: embedded pair, held-out stdlib prompts
    python -m eval.run num_prompts=64 max_new_tokens=128   # the full embedded benchmark
    python -m eval.run bench=humaneval num_prompts=null    # HumanEval pass@1 (completion prompts on the code model)
    python -m eval.run method=strict sampling=t1           # strict verification at temperature 1
    python -m eval.run -m method.theta=0.84,0.88,0.92,0.96 bench=embedded,humaneval   # a sweep: one job each
    python -m eval.run model=llama31_8b bench=mt_bench max_new_tokens=1024 num_prompts=null   # on a GPU

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
import fcntl
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eagle.config import eos_token_ids
from eagle.precision import DTYPES, Precision, cpu_name, needs_exact_attention, resolve_dtype
from eval import quality
from eval.answers import (
    ANSWERS,
    CONFIG,
    IDENTITY,
    LOCK,
    SKIPPED,
    SUMMARY,
    AnswerFile,
    answer_record,
    answers_file,
    directory_name,
    read_answers,
    write_atomic,
)
from eval.bench import REPO_ROOT, PromptFormat, Question, encode, prompt_format, resolve
from eval.benchmarks import BENCHMARKS, load_questions, resolved_source
from eval.config import (
    GENERATE,
    HUB_ID,
    PLAIN,
    STRICT,
    VANILLA,
    Dtype,
    GenerateConfig,
    MethodConfig,
    RuleMethod,
    RunConfig,
    TreeConfig,
    method_spec,
    parse_shard,
    plain,
    sampling_of,
    validate,
)
from eval.metrics import format_table, margin_histogram, merged_stats, ratio, summarize
from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig
from mars.target import context_length

GPU_LOCK_DIR = Path(os.environ.get("MARS_GPU_LOCK_DIR", "/tmp/mars-gpu-locks"))


def run_precision(run: RunConfig) -> Precision:
    """The precision the target runs in: model.dtype, "auto" resolved for the run's device (eagle.precision)."""
    m = run.model
    return resolve_dtype(m.dtype.value, "cuda" if (m.device_map or m.device.startswith("cuda")) else m.device)


def exact_attention_choice(run: RunConfig, precision: Precision) -> tuple[bool, str]:
    """Whether verification uses exact attention, and why (model.exact_attention null = auto)."""
    if run.model.exact_attention is not None:
        return run.model.exact_attention, "set explicitly"
    if run.model.static:
        return False, "auto: static shapes (exact attention gathers shapes that change from tree to tree)"
    if needs_exact_attention(precision.dtype):
        return True, f"auto: {precision.name} tree verification differs from plain decoding without it"
    return False, f"auto: {precision.name} tree verification already reproduces plain decoding"


def prepack_choice(run: RunConfig, precision: Precision) -> tuple[bool, str]:
    """Whether our loop multiplies float32 CPU linears by prepacked weights, and why (model.prepack null = auto)."""
    if run.model.prepack is not None:
        return run.model.prepack, "set explicitly"
    if run.model.compile is not None:
        return False, "auto: torch.compile chooses the kernels of the compiled forwards"
    on_cpu = not run.model.device_map and run.model.device == "cpu"
    if on_cpu and precision.dtype == torch.float32 and torch.backends.mkldnn.is_available():
        return True, "auto: float32 on CPU, where oneDNN's prepacked products beat MKL's over a few rows"
    where = run.model.device_map or run.model.device
    return False, f"auto: only for float32 on CPU with oneDNN (here {precision.name} on {where})"


def job_methods(run: RunConfig, precision: Precision | None = None) -> list[MethodConfig]:
    """The baselines, then the method under test (each once).

    With `model.generate` among them on a CPU running float32 (no native bf16 matrix instructions),
    `model.generate` in bf16 joins them: such CPUs still decode one token at a time fastest in bf16,
    and speedups are quoted against the fastest plain decoding timed (`speedup_vs_fastest`)."""
    methods: dict[str, MethodConfig] = {}
    for method in [*(method_spec(b) for b in run.baselines), run.method]:
        methods.setdefault(method.name, method)
    precision = precision or run_precision(run)
    on_cpu = not run.model.device_map and run.model.device == "cpu"
    ordered = list(methods.values())
    bf16 = GenerateConfig(dtype=Dtype.bfloat16)
    if on_cpu and precision.dtype == torch.float32 and GENERATE in methods and bf16.name not in methods:
        ordered.insert(list(methods).index(GENERATE) + 1, bf16)
    return ordered


def method_dtype(method: MethodConfig, precision: Precision) -> str:
    """The precision a method decodes in: the run's, or a `generate@<dtype>` baseline's own."""
    return method.dtype.value if isinstance(method, GenerateConfig) and method.dtype else precision.name


# --- run directories ----------------------------------------------------------------------------

def method_identity(run: RunConfig, method: MethodConfig) -> dict:
    """Every setting that affects one method's answers (and nothing that only affects its timing)."""
    m = run.model
    identity = {
        "method": method.name, "target": m.target, "tokenizer": m.tokenizer,
        "dtype": method_dtype(method, run_precision(run)),  # as resolved: auto decodes differently per machine
        "device": "cuda" if (m.device_map or m.device.startswith("cuda")) else m.device,  # not the GPU's index
        "prompt": plain(m.prompt), "bench": run.bench.name, "questions": run.bench.questions,
        "sampling": plain(run.sampling), "max_new_tokens": run.max_new_tokens, "seed": run.seed, "shard": run.shard,
    }
    if method.kind != GENERATE and m.static:  # named only when on: earlier run directories keep their names
        identity.update(static=True, compile=m.compile, max_cache_len=m.max_cache_len)
    if resolved_source(run.bench.questions, run.bench.data_dir, run.bench.source) == "hub":  # other text, maybe
        identity["questions_from"] = BENCHMARKS[run.bench.questions].hub.describe()
    if method.kind != GENERATE:  # our decoding loop: exact attention changes its reduction order
        identity["exact_attention"] = exact_attention_choice(run, run_precision(run))[0]
    if isinstance(method, RuleMethod):
        identity.update(draft=m.draft, tree=tree_shape(run.tree))  # the tree used, however it was chosen
        rule = method.rule()  # its main parameter is in the name; the others here, as values
        identity.update({k: v for k, v in rule.params().items() if k != rule.label})
    return identity


def answer_path(directory: Path, method: MethodConfig, kind: str = ANSWERS) -> Path:
    """A method's answers file in its run directory (kind SKIPPED: the questions it could not answer)."""
    return answers_file(directory, method.name, kind)


def run_directory(run: RunConfig, method: MethodConfig) -> Path:
    name = directory_name(method.name, run.sampling.temperature, method_identity(run, method), parse_shard(run.shard))
    return resolve(run.out_dir) / name


def claim_run_directory(run: RunConfig, method: MethodConfig, directory: Path) -> None:
    """Create a method's run directory, or check that an existing one holds answers to the same settings."""
    identity = json.loads(json.dumps(method_identity(run, method)))
    path = directory / IDENTITY
    if path.exists():
        before = json.loads(path.read_text())
        if before != identity:
            changed = sorted(k for k in set(before) | set(identity) if before.get(k) != identity.get(k))
            raise ValueError(f"{directory} holds a run with other settings ({', '.join(changed)} differ): "
                             "move it away or choose another out_dir")
        return
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(identity, indent=2) + "\n")


@contextlib.contextmanager
def directory_lock(directory: Path, wait: bool):
    """An exclusive lock on a run directory (held until exit); yields False if not waiting and it is taken."""
    with open(directory / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- models -------------------------------------------------------------------------------------

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


def claim_gpus(count: int, total: int, lock_dir: Path = GPU_LOCK_DIR) -> tuple[list[int], list]:
    """`count` of this node's `total` GPUs that no other job holds, locked until the returned handles close.

    Jobs of a sweep on one node (hydra/launcher=gpus) start in worker processes that know nothing of
    each other; a lock file per GPU gives each its own. Raises when fewer than `count` are free.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    gpus, handles = [], []
    for index in range(total):
        handle = open(lock_dir / f"gpu{index}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        gpus.append(index)
        handles.append(handle)
        if len(gpus) == count:
            return gpus, handles
    for handle in handles:
        handle.close()
    raise RuntimeError(f"gpus_per_job={count} but only {len(gpus)} of this node's {total} GPUs are free (locks in "
                       f"{lock_dir}): run fewer parallel jobs (hydra.launcher.n_jobs) or fewer GPUs per job")


def gpu_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).total_memory


def placement(run: RunConfig, gpus: list[int] | None, dtype: torch.dtype | None = None) -> dict:
    """from_pretrained's device arguments: the configured device, one GPU or several (eval.placement)."""
    m = run.model
    if m.device_map:
        if not torch.cuda.is_available() and not m.allow_offload:
            raise RuntimeError(f"model.device_map={m.device_map} shards the target over GPUs but none is visible: "
                               "run on a GPU node, or set model.device_map=null model.device=cpu")
        memory = {int(k) if str(k).isdigit() else k: v for k, v in (m.max_memory or {}).items()}
        if m.device_map == "auto" and torch.cuda.is_available():  # fit first, spread only what does not fit
            from transformers import AutoConfig

            from eval.placement import fit_first, parse_bytes

            config = AutoConfig.from_pretrained(model_source(m.target, "target model"))
            job = gpus if gpus is not None else list(range(torch.cuda.device_count()))
            sizes = {g: parse_bytes(memory[g]) if g in memory else gpu_bytes(g) for g in job}
            return fit_first(config, dtype or run_precision(run).dtype, sizes, run.max_new_tokens,
                             run.tree.total_tokens + 1, m.headroom_gib)
        kwargs: dict = {"device_map": m.device_map}
        if gpus is not None:  # only the job's own GPUs (with their configured limits, if any)
            memory = {g: memory.get(g, f"{gpu_bytes(g) // 2**30}GiB") for g in gpus}
        if memory:
            kwargs["max_memory"] = memory
        return kwargs
    if gpus is not None:
        return {"device_map": {"": gpus[0]}}
    return {"device_map": {"": m.device}}


def check_offload(model, allow: bool) -> None:
    """Refuse a target that `device_map` spilled onto the CPU or disk, unless asked for (it is very slow)."""
    spilled = sorted({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if spilled and not allow:
        raise RuntimeError(f"the target does not fit the job's GPUs: device_map placed layers on {', '.join(spilled)}. "
                           "Give it more GPUs (gpus_per_job, model.max_memory), or set model.allow_offload=true "
                           "to accept offloading")


def load_tokenizer(run: RunConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_source(run.model.tokenizer or run.model.target, "tokenizer"))


def load_target(run: RunConfig, dtype: torch.dtype, gpus: list[int] | None = None):
    """The target with `AutoModelForCausalLM.from_pretrained` in `dtype`, on `device` or sharded by `device_map`."""
    from transformers import AutoModelForCausalLM

    m = run.model
    model = AutoModelForCausalLM.from_pretrained(model_source(m.target, "target model"), dtype=dtype,
                                                 **placement(run, gpus, dtype)).eval()
    check_offload(model, m.allow_offload)
    return model


def tree_shape(tree: TreeConfig) -> dict:
    """SpeculativeGenerator's tree arguments."""
    return {"total_tokens": tree.total_tokens, "depth": tree.depth, "branching": tree.branching,
            "adaptive": tree.adaptive}


def calibrated_tree(run: RunConfig, fmt: PromptFormat) -> tuple[TreeConfig, dict]:
    """`tree=calibrated`: the candidate tree that decodes fastest here (mars.calibrate; timed once per
    machine, model and greedy/sampled decoding, then read from the cache), and the calibration's record."""
    from mars.calibrate import calibrate_tree

    precision = run_precision(run)
    tokenizer = load_tokenizer(run)
    target = load_target(run, precision.dtype)
    prompts = [torch.tensor([encode(tokenizer, q, [], fmt)])
               for q in load_questions(run.tree.calibration_prompts)]
    with make_generator(run, target, load_head(run, target), precision) as gen:
        record = calibrate_tree(gen, prompts, sampling_of(method_spec(STRICT), run.sampling))
    shape = record["tree"]
    print(f"tree: {shape['total_tokens']}/{shape['depth']}/{shape['branching']}"
          f"{' adaptive' if shape['adaptive'] else ''}, the fastest here "
          f"({record['speedup_over_plain']:.2f}x plain decoding in calibration; "
          f"{'cached: ' if record['cached'] else 'saved to '}{record['cache']})")
    return replace(run.tree, **shape, calibrate=False), record


def make_generator(run: RunConfig, target, head, precision: Precision, profile: bool = False) -> SpeculativeGenerator:
    """Our decoding loop as the run configures it: its tree, exact attention and kernels."""
    m = run.model
    return SpeculativeGenerator(target, head, **tree_shape(run.tree),
                                exact_attention=exact_attention_choice(run, precision)[0],
                                prepack=prepack_choice(run, precision)[0], profile=profile,
                                static=m.static, compile=m.compile, max_cache_len=m.max_cache_len)


def load_head(run: RunConfig, target):
    """The draft head: a local EAGLE checkpoint directory, or a hub repository downloaded first."""
    from eagle.checkpoint import load_draft

    source = model_source(run.model.draft, "draft model")
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


def generate(gen: SpeculativeGenerator, method: MethodConfig, sampling: SamplingConfig, ids: list[int],
             max_new_tokens: int, eos: list[int], seed: int, plain_model=None) -> GenerationOutput:
    """One answer of `method`; `model.generate` runs on `plain_model` (default: the generator's target)."""
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
        self.plain_models = plain_models or {}  # generate@<dtype> baselines: the target loaded in that dtype
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


# --- quality ------------------------------------------------------------------------------------

def question_categories(run: RunConfig, questions: list[tuple[int, Question]]) -> dict | None:
    """{question_id: category} for a benchmark reported per category (Spec-Bench), else None."""
    spec = BENCHMARKS.get(run.bench.questions)
    return {q.question_id: q.category for _, q in questions} if spec is not None and spec.by_category else None


def score_quality(run: RunConfig, records: dict[str, list[dict]], figures: dict[str, dict]) -> str | None:
    """Add each method's task quality (`quality`, `quality_recovery` vs strict and vs vanilla) to `figures`.

    Public benchmarks are scored by `eval.score`; the embedded stdlib prompts by their parse rate
    and token probability. Returns the headline metric's name (None when nothing is scored).
    """
    bench, metric = run.bench.name, None
    if bench in BENCHMARKS:
        from eval.score import score

        # Reference-free sets compare against the same model's plain greedy output (strict greedy == vanilla).
        plain_answers = records.get(VANILLA) or records.get(GENERATE)
        if plain_answers is None and run.sampling.temperature == 0:
            plain_answers = records.get(STRICT)
        for method, recs in records.items():
            try:
                result = score(bench, recs, run.bench.data_dir, baseline=plain_answers, source=run.bench.source)
            except (ValueError, FileNotFoundError, RuntimeError) as e:  # RuntimeError: an unreachable judge
                # The answers are on disk; a scoring failure must not lose the run's summary.
                figures[method]["quality_error"] = str(e)
                continue
            metric = result["metric"]
            figures[method]["quality"] = {k: v for k, v in result.items() if k not in ("bench", "n", "metric")}
    elif any("parse_rate" in fig for fig in figures.values()):
        metric = "parse_rate"
        for fig in figures.values():
            fig["quality"] = {k: fig[k] for k in ("parse_rate", "token_prob") if k in fig}
    if metric is None:
        return None
    for method, fig in figures.items():
        value = fig.get("quality", {}).get(metric)
        for key, reference in (("quality_recovery", STRICT), ("quality_recovery_vs_vanilla", VANILLA)):
            base = figures.get(reference, {}).get("quality", {}).get(metric)
            if method != reference and value is not None and base:
                fig[key] = ratio(value, base)
    return metric


# --- reporting --------------------------------------------------------------------------------

def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine() -> str:
    text = f"{cpu_name()}, {cores()} cores, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def settings(run: RunConfig, questions: int, directories: dict[str, Path]) -> dict:
    import transformers

    m = run.model
    precision = run_precision(run)
    exact, exact_reason = exact_attention_choice(run, precision)
    prepack, prepack_reason = prepack_choice(run, precision)
    return {
        "model": m.name, "target": m.target, "draft": m.draft, "dtype": precision.name,
        "dtype_requested": m.dtype.value, "dtype_reason": precision.reason,
        "device": m.device_map or m.device, "bench": run.bench.name, "questions": questions,
        "max_new_tokens": run.max_new_tokens, **plain(run.sampling), "tree": plain(run.tree),
        "exact_attention": exact, "exact_attention_reason": exact_reason,
        "prepack": prepack, "prepack_reason": prepack_reason,
        "static": m.static, "compile": m.compile, "max_cache_len": m.max_cache_len,
        "prompt": plain(m.prompt), "method": plain(run.method),
        "methods": list(directories), "run_dirs": {name: str(d) for name, d in directories.items()},
        "seed": run.seed, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "shard": run.shard,
        "order": "per question every method still to answer, order rotated by question"
                 + ("; warm-up run first" if run.warmup else ""),
        "speedup": "ratio of total tokens/s to vanilla's (speedup), to model.generate's in the run's precision "
                   "(speedup_vs_generate) and to the fastest plain decoding timed in the run, model.generate in "
                   "any precision or vanilla (speedup_vs_fastest); speedup_per_question: ratio of mean "
                   "per-question tokens/s (EAGLE tools). Baselines answered by an earlier job of a sweep were "
                   "timed then, not interleaved with this method",
    }


def sweep_name() -> str | None:
    """The multirun's sweep directory name (the W&B group of its jobs), None outside a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None


# --- the job ------------------------------------------------------------------------------------

def check_settings(run: RunConfig) -> tuple[PromptFormat, list[tuple[int, Question]]]:
    """What can be checked before a model loads: prompt format, quality figures, questions, model paths.

    Returns the questions this job answers with their index in the whole set (seeds and the method
    order follow it, so a shard answers exactly what the unsharded run does).
    """
    unknown = set(run.bench.quality) - set(quality.FIGURES)
    if unknown:
        raise ValueError(f"unknown quality figures {sorted(unknown)}; known: {quality.FIGURES}")
    fmt = prompt_format({"prompt": plain(run.model.prompt)})
    questions = list(enumerate(load_questions(run.bench.questions, run.bench.data_dir, run.num_prompts,
                                              run.bench.source)))
    shard = parse_shard(run.shard)
    if shard:
        questions = questions[shard[0]::shard[1]]
    model_source(run.model.target, "target model")  # a missing local path or malformed hub id, before any load
    model_source(run.model.draft, "draft model")
    return fmt, questions


def answered(directory: Path, method: MethodConfig, ids: set) -> bool:
    done = {r["question_id"] for sub in (ANSWERS, SKIPPED)
            for r in read_answers(answer_path(directory, method, sub))}
    return ids <= done


def job_records(methods: list[MethodConfig], directories: dict[str, Path], ids: set) -> dict[str, list[dict]]:
    return {m.name: [r for r in read_answers(answer_path(directories[m.name], m))
                     if r["question_id"] in ids] for m in methods}


def run(cfg: DictConfig | RunConfig) -> dict:
    """One job: answer what is missing, then write the job's summary (see the module docstring)."""
    config = validate(cfg)  # value ranges, before anything else
    fmt, questions = check_settings(config)  # bad settings fail before any model loads
    precision = run_precision(config)
    exact, exact_reason = exact_attention_choice(config, precision)
    prepack, prepack_reason = prepack_choice(config, precision)
    print(f"precision: {precision.name} ({precision.reason}); exact attention {'on' if exact else 'off'} "
          f"({exact_reason}); prepacked linears {'on' if prepack else 'off'} ({prepack_reason})")
    calibration = None
    if config.tree.calibrate:  # before the run directories: their names include the tree
        config = replace(config, tree=(tree := calibrated_tree(config, fmt))[0])
        calibration = tree[1]
    methods = job_methods(config, precision)
    directories = {m.name: run_directory(config, m) for m in methods}
    for m in methods:
        claim_run_directory(config, m, directories[m.name])
    job_dir = directories[config.method.name]
    if not config.resume and any(read_answers(answer_path(directories[m.name], m)) for m in methods):
        raise ValueError(f"{job_dir.parent} already holds answers for these settings and resume=false: rerun with "
                         "resume=true (the default) to continue them, or move the run directories away")
    ids = {q.question_id for _, q in questions}
    pending = [m for m in methods if not answered(directories[m.name], m, ids)]
    if not pending and (job_dir / SUMMARY).exists():
        summary = json.loads((job_dir / SUMMARY).read_text())
        if summary["settings"].get("methods") == list(directories) and summary["settings"]["questions"] == len(ids):
            print(f"done already: {job_dir} (every answer and the summary are there; nothing to run)")
            return summary
    started = time.time()
    OmegaConf.save(OmegaConf.structured(config) if not isinstance(cfg, DictConfig) else cfg, job_dir / CONFIG,
                   resolve=True)
    from eval.tracking import start_tracking

    tracker = start_tracking(config.logging, job_dir, plain(config), model=config.model.name, bench=config.bench.name,
                             method=config.method.name, temperature=config.sampling.temperature, sweep=sweep_name())
    answered_now = answer_pending(config, fmt, questions, pending, directories, tracker) if pending else []
    records = job_records(methods, directories, ids)
    summary = {"machine": machine(), "settings": {**settings(config, len(ids), directories),
                                                  "tree_calibration": calibration},
               "job": {"host": platform.node(), "pid": os.getpid(), "started": started, "finished": time.time(),
                       "answered": answered_now},  # the methods this job added answers to
               "methods": summarize(records, plain=[m.name for m in methods if m.kind in PLAIN],
                                    categories=question_categories(config, questions))}
    summary["quality_metric"] = score_quality(config, records, summary["methods"])
    margins = {name: merged_stats(recs).gates for name, recs in records.items()}
    for m in methods:
        fig = summary["methods"][m.name]
        fig["run_dir"] = str(directories[m.name])
        if isinstance(m, RuleMethod):
            fig["rule"] = {"name": m.kind, **m.rule().params()}
            fig["margin_histogram"] = margin_histogram(margins[m.name], *m.rule().gate_scale())
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(job_dir / SUMMARY, text)
    if config.summary_path:
        path = resolve(config.summary_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    print(format_table(summary["methods"], summary["quality_metric"]))
    print(f"run: {job_dir}")
    tracker.finish(summary, {m.name: answer_path(directories[m.name], m) for m in methods}, margins)
    return summary


def answer_pending(config: RunConfig, fmt: PromptFormat, questions: list[tuple[int, Question]],
                   pending: list[MethodConfig], directories: dict[str, Path], tracker) -> list[str]:
    """Load the models and answer the pending methods: first those no other job is answering, together
    (interleaved), then each of the others once the job answering it has let go of its directory.
    Returns the methods that got new answers."""
    torch.set_num_threads(config.threads or cores())
    torch.manual_seed(config.seed)
    with contextlib.ExitStack() as stack:
        gpus = None
        if config.gpus_per_job or chosen_launcher() == "gpus":
            gpus, handles = claim_gpus(config.gpus_per_job or 1, torch.cuda.device_count())
            for handle in handles:
                stack.callback(handle.close)
            print(f"job GPUs: {gpus}")
        tokenizer = load_tokenizer(config)
        precision = run_precision(config)
        target = load_target(config, precision.dtype, gpus)
        head = load_head(config, target)
        gen = stack.enter_context(make_generator(config, target, head, precision, profile=config.profile))
        plain_models = {m.name: load_target(config, DTYPES[method_dtype(m, precision)], gpus) for m in pending
                        if method_dtype(m, precision) != precision.name}
        evaluator = Evaluator(config, gen, tokenizer, fmt, plain_models)
        held, waiting = [], []
        for m in pending:
            (held if stack.enter_context(directory_lock(directories[m.name], wait=False)) else waiting).append(m)
        answered = answer_questions(config, evaluator, held, questions, directories, tracker) if held else set()
        for m in waiting:
            print(f"waiting for {directories[m.name]}: another job is answering {m.name}")
            with directory_lock(directories[m.name], wait=True):
                answered |= answer_questions(config, evaluator, [m], questions, directories, tracker)
    return [m.name for m in pending if m.name in answered]


def chosen_launcher() -> str | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("hydra/launcher") if HydraConfig.initialized() else None


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


@hydra.main(version_base=None, config_path=str(REPO_ROOT / "configs"), config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    # Through the module's importable name, so that launchers running jobs in other processes
    # (joblib, submitit) pickle the task by reference rather than this __main__ module by value.
    from eval.run import main as entry_point

    entry_point()
