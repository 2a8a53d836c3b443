"""A job's methods and their run directories: the identity that names each (every setting that
affects its answers), claiming and locking a directory, and what it already holds.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from eagle.files import write_atomic
from eval.benchmarks import BENCHMARKS, resolved_source
from eval.config.methods import GENERATE, VANILLA, Dtype, GenerateConfig, MethodConfig, RuleMethod, method_spec, plain
from eval.config.paths import resolve
from eval.config.schema import RunConfig
from eval.rundirs.layout import ANSWERS, IDENTITY, SKIPPED, answers_file, directory_name, read_answers
from eval.runner.job_settings import on_cpu, run_device
from mars.decoding.settings import DecodeSettings

# On a CPU `model.generate` is timed in both precisions: which decodes one token at a time faster
# depends on the CPU (bf16 on AVX2-only EPYCs; on AVX-512 BF16 ones too, but by less), and speedups
# are quoted against the fastest plain decoding timed (`speedup_vs_fastest`).
CPU_PRECISIONS = (Dtype.float32, Dtype.bfloat16)


def job_methods(run: RunConfig, settings: DecodeSettings) -> list[MethodConfig]:
    """The baselines, then the method under test (each once); on a CPU, `model.generate` among them
    brings `model.generate` in the other precision too (see CPU_PRECISIONS), and on a CPU with more
    than AVX2 `model.generate` in bf16 under the AVX2 limits (`generate@bfloat16+avx2`,
    eval.runner.plain: faster than native bf16 decoding on AVX-512 BF16 CPUs)."""
    methods: dict[str, MethodConfig] = {}
    for method in [*(method_spec(b) for b in run.baselines), run.method]:
        methods.setdefault(method.name, method)
    ordered = list(methods.values())
    if on_cpu(run) and GENERATE in methods:
        extra = [GenerateConfig(dtype=dtype) for dtype in CPU_PRECISIONS if dtype.value != settings.dtype.value]
        if torch.backends.cpu.get_cpu_capability() != "AVX2":  # the limits would change something
            extra.append(GenerateConfig(dtype=Dtype.bfloat16, isa="avx2"))
        at = list(methods).index(GENERATE) + 1
        ordered[at:at] = [m for m in extra if m.name not in methods]
    return ordered


def method_dtype(method: MethodConfig, settings: DecodeSettings) -> str:
    """The precision a method decodes in: the run's, or a `generate@<dtype>` baseline's own."""
    return method.dtype.value if isinstance(method, GenerateConfig) and method.dtype else settings.dtype.value


def method_identity(run: RunConfig, method: MethodConfig, settings: DecodeSettings) -> dict:
    """Every setting that affects one method's answers (and nothing that only affects its timing)."""
    m = run.model
    identity = {
        "method": method.name, "target": m.target, "tokenizer": m.tokenizer,
        "dtype": method_dtype(method, settings),  # as resolved: auto decodes differently per machine
        "device": run_device(run),  # not the GPU's index
        "prompt": plain(m.prompt), "bench": run.bench.name, "questions": run.bench.questions,
        "sampling": plain(run.sampling), "max_new_tokens": run.max_new_tokens, "seed": run.seed, "shard": run.shard,
    }
    if run.bench.max_turns is not None:  # named only when set: earlier run directories keep their names
        identity["max_turns"] = run.bench.max_turns
    if run.batch_size > 1:  # named only when batched: earlier run directories keep their names
        identity["batch_size"] = run.batch_size
    if method.kind != GENERATE and m.static:  # named only when on: earlier run directories keep their names
        identity.update(static=True, compile=m.compile, max_cache_len=m.max_cache_len)
    if resolved_source(run.bench.questions, run.bench.data_dir, run.bench.source) == "hub":  # other text, maybe
        identity["questions_from"] = BENCHMARKS[run.bench.questions].hub.describe()
    if method.kind == VANILLA and settings.plain != settings.kernels:
        # vanilla decodes at plain decoding's own kernels (named only where they are not the trees': earlier run
        # directories keep their names)
        identity.update(dtype=settings.plain.dtype, plain_kernels=settings.plain.label)
    if method.kind != GENERATE:  # our decoding loop: exact attention changes its reduction order
        identity["exact_attention"] = settings.exact_attention.value
        if settings.prepack.value and settings.dtype.value != "float32":
            # bf16 products on packed weights round differently from torch's: other greedy tokens. (float32's
            # differ in the last bits only; its directories never named the kernels and keep their names.)
            identity["prepack"] = True
    if isinstance(method, RuleMethod):
        tree = asdict(settings.tree_for(method.name))  # the tree used, however it was chosen
        if tree["drafting"] == "topk":  # what every tree was before sampled drafting: earlier runs keep their names
            del tree["drafting"]
        identity.update(draft=settings.head.value, tree=tree)  # the head used
        if not settings.speculates(method.name):  # plain decoding's answers: never resumed as the tree's
            identity["speculation"] = "off"  # named only when off: earlier run directories keep their names
        rule = method.rule()  # its main parameter is in the name; the others here, as values
        identity.update({k: v for k, v in rule.params().items() if k != rule.label})
    return identity


def answer_path(directory: Path, method: MethodConfig, kind: str = ANSWERS) -> Path:
    """A method's answers file in its run directory (kind SKIPPED: the questions it could not answer)."""
    return answers_file(directory, method.name, kind)


def run_directory(run: RunConfig, method: MethodConfig, settings: DecodeSettings,
                  identity: dict | None = None) -> Path:
    """Where a method's answers live: named by its settings (`identity`, computed when not given)."""
    identity = identity if identity is not None else method_identity(run, method, settings)
    name = directory_name(method.name, run.sampling.temperature, identity)
    return resolve(run.out_dir) / name


def claim_run_directory(run: RunConfig, method: MethodConfig, settings: DecodeSettings) -> Path:
    """A method's run directory, created, or checked to hold answers to the same settings when it exists."""
    named = method_identity(run, method, settings)
    directory = run_directory(run, method, settings, named)
    identity = json.loads(json.dumps(named))  # as the file holds it (lists, not tuples)
    path = directory / IDENTITY
    if path.exists():
        before = json.loads(path.read_text())
        if before != identity:
            changed = sorted(k for k in set(before) | set(identity) if before.get(k) != identity.get(k))
            raise ValueError(f"{directory} holds a run with other settings ({', '.join(changed)} differ): "
                             "move it away or choose another out_dir")
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(identity, indent=2) + "\n")
    return directory


def answered(directory: Path, method: MethodConfig, ids: set) -> bool:
    done = {r["question_id"] for sub in (ANSWERS, SKIPPED)
            for r in read_answers(answer_path(directory, method, sub))}
    return ids <= done


def job_records(methods: list[MethodConfig], directories: dict[str, Path], ids: set) -> dict[str, list[dict]]:
    return {m.name: [r for r in read_answers(answer_path(directories[m.name], m))
                     if r["question_id"] in ids] for m in methods}
