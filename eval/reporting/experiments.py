"""The MARS paper's experiments as data (`EXPERIMENTS`), and where their models and benchmark files
are found (see `eval.paper` for the rules).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from eval.benchmarks import BENCHMARKS
from eval.config.methods import GENERATE, STRICT, VANILLA, RuleMethod, method_spec
from eval.config.paths import REPO_ROOT, bench_path, resolve
from eval.config.schema import HUB_ID
from eval.reporting import zoo_sweep
from mars.rules import rule_class
from mars.rules.margin import Mars

CONFIGS = REPO_ROOT / "configs"

MAIN_MODELS = ("vicuna13b", "llama31_8b", "llama33_70b", "dsr1_llama8b")
MAIN_BENCHES = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum")
THETAS = (0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)


@dataclass(frozen=True)
class Experiment:
    """One table or ablation of the paper. Every job runs `method` (MARS unless said otherwise) with
    `baselines` answered alongside it; the sweeps are over the method's main parameter (θ for MARS),
    sampling temperature and tree depth. Baselines without a greedy form (ears) are left out at T=0:
    temperatures whose baselines differ get a multirun each."""

    name: str
    reproduces: str  # which table / figure of the paper
    models: tuple[str, ...]
    benches: tuple[str, ...]
    thetas: tuple[float, ...] = (0.9,)  # values of the method's main parameter (its rule's label); () = none swept
    method: str = Mars.name  # the method under test, as method_spec reads it (a display name: mars, strict, ...)
    baselines: tuple[str, ...] = (GENERATE, VANILLA, STRICT)  # display names, answered alongside every job
    report: str = "eval.report"  # the module that reports on the experiment's output directory
    sampling: str = "t1"  # preset of configs: t0 | t1 | t02
    temperatures: tuple[float, ...] = ()  # a sampling.temperature sweep on top of the preset
    tree: str = "paper"  # 49 nodes, depth 7, 10 children (the MARS scripts' 50 / 6 / 10)
    depths: tuple[int, ...] = ()  # a tree.depth sweep (total_tokens and branching as the preset)
    batches: tuple[int, ...] = ()  # a batch_size sweep (requests decoded together, every baseline batched too)
    max_new_tokens: int = 1024
    gpus: str = ""  # what the default models need

    def __post_init__(self):
        method = method_spec(self.method)  # raises on an unknown method or bad parameters
        for b in self.baselines:
            method_spec(b)
        if self.thetas and not (isinstance(method, RuleMethod) and rule_class(method.kind).label):
            raise ValueError(f"experiment {self.name}: {self.method} has no main parameter to sweep (thetas)")

    def jobs_per_model(self) -> int:
        return (len(self.benches) * max(1, len(self.thetas)) * max(1, len(self.temperatures))
                * max(1, len(self.depths)) * max(1, len(self.batches)))

    def num_jobs(self, models: Sequence[str] | None = None) -> int:
        return len(models or self.models) * self.jobs_per_model()


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment(
        "main", "main table: speedup and τ of EAGLE-3 (strict) and MARS θ=0.9 at T=1",
        MAIN_MODELS, MAIN_BENCHES, sampling="t1",
        gpus="one 80 GB GPU per job for the 8B/13B models; LLaMA-3.3-70B (fp16, ~140 GB) 2 x 80 GB"),
    Experiment(
        "main_t0", "the main table at T=0 (greedy): EAGLE-3 (strict) and MARS θ=0.9",
        MAIN_MODELS, MAIN_BENCHES, sampling="t0",
        gpus="as main"),
    Experiment(
        "quality", "quality table: task quality of strict and MARS θ=0.9 and MARS's recovery (MARS / strict), T=1",
        MAIN_MODELS, ("humaneval", "gsm8k", "wmt19", "sum", "mt_bench"), sampling="t1",
        gpus="as main"),
    Experiment(
        "theta", "θ ablation: speedup, τ and quality of MARS for θ = 0.84 ... 0.98 (Qwen3-8B, T=0.2)",
        ("qwen3_8b",), ("humaneval", "wmt19"), thetas=THETAS, sampling="t02",
        gpus="one 40-80 GB GPU per job (Qwen3-8B, bf16)"),
    Experiment(
        "depth", "draft-depth ablation: strict and MARS θ=0.9 at K = 6, 9, 12, 15 draft levels (Qwen3-32B, GSM8K)",
        ("qwen3_32b",), ("gsm8k",), sampling="t02", depths=(6, 9, 12, 15),
        gpus="~64 GB of bf16 weights per job: one 80 GB GPU, or 2 x 40-48 GB"),
    Experiment(
        "temperature", "temperature sweep: strict and MARS θ=0.9 at T = 0, 0.2, 0.5, 0.8, 1.0 (Qwen3-8B)",
        ("qwen3_8b",), ("humaneval", "wmt19"), sampling="t0", temperatures=(0.0, 0.2, 0.5, 0.8, 1.0),
        gpus="one 40-80 GB GPU per job (Qwen3-8B, bf16)"),
    Experiment(
        "batch", "batching (not in the paper): throughput, latency and speedup over batched plain decoding of strict "
        "and MARS θ = 0.8, 0.9 at batch sizes 1, 8, 32, 64, greedy (batched drafting is top-k: T=0 keeps batch 1 "
        "comparable)",
        ("llama31_8b", "qwen3_8b"), ("mt_bench", "gsm8k"), thetas=(0.8, 0.9), sampling="t0", batches=(1, 8, 32, 64),
        gpus="one 40-80 GB GPU per job (8B in bf16: ~10 GB of KV cache at batch 64 x 1024 new tokens)"),
    Experiment(
        "zoo", "rule zoo: every verification rule over its parameter range (reporting.zoo_sweep.SWEEP) as baselines "
        "of one strict job per model × bench × temperature (T = 0, 1): speedup against KL per token / argmax "
        "mismatch and quality",
        MAIN_MODELS, ("mt_bench", "humaneval"), thetas=(), method=STRICT, baselines=tuple(zoo_sweep.baselines(1.0)),
        sampling="t0", temperatures=(0.0, 1.0), report="eval.zoo",
        gpus="as main (each job answers every rule point: ~20 methods per question)"),
)}


# --- configs ------------------------------------------------------------------------------------

def model_names() -> list[str]:
    return sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))


def _yaml(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def model_config(name: str) -> dict:
    return _yaml(CONFIGS / "model" / f"{name}.yaml")


def bench_questions(name: str) -> str:
    """The question set a bench config reads: a set's name in the bench directory, or a .jsonl path."""
    return str(_yaml(CONFIGS / "bench" / f"{name}.yaml").get("questions", name))


# --- model paths --------------------------------------------------------------------------------

def env_key(model: str, role: str) -> str:
    return f"MARS_{role.upper()}_{re.sub(r'[^A-Za-z0-9]', '_', model).upper()}"


def model_path(model: str, role: str, given: str | None = None) -> str:
    """Where `model`'s target or draft (`role`) is taken from (see the module docstring)."""
    configured = str(model_config(model)[role])
    for candidate in (given, os.environ.get(env_key(model, role))):
        if candidate:
            path = Path(candidate).expanduser()
            return str(path.resolve()) if path.exists() or not HUB_ID.match(candidate) else candidate
    models_dir = os.environ.get("MARS_MODELS_DIR")
    if models_dir and HUB_ID.match(configured) and (Path(models_dir).expanduser() / configured).is_dir():
        return str((Path(models_dir).expanduser() / configured).resolve())
    return configured


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import snapshot_download, try_to_load_from_cache
    except ImportError:
        return False
    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return True
        snapshot_download(repo_id, local_files_only=True)
        return True
    except Exception:  # not cached, an invalid id, a broken cache: not resolvable offline
        return False


def model_path_problem(path: str) -> str | None:
    """None when `path` is an existing directory or a hub id found in the local Hugging Face cache,
    else what is wrong with it (naming the path)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return None
    if local.exists():
        return f"{path} is a file, not a model directory"
    if not HUB_ID.match(path):
        return f"{path} does not exist"
    if _in_hf_cache(path):
        return None
    hint = f"; $MARS_MODELS_DIR/{path} does not exist either" if os.environ.get("MARS_MODELS_DIR") else ""
    return (f"{path} is not a directory and not in the local Hugging Face cache (download it first: "
            f"huggingface-cli download {path}){hint}")


# --- benchmark files ----------------------------------------------------------------------------

def bench_files(bench: str, data_dir: str | None = None) -> list[Path]:
    """The files a benchmark needs: its questions and the side files its plugin declares
    (`Benchmark.side_files`: HumanEval's unit tests, to score pass@1)."""
    questions = bench_questions(bench)
    if questions.endswith(".jsonl"):
        return [resolve(questions)]
    directory = bench_path(data_dir)
    side = BENCHMARKS[questions].side_files if questions in BENCHMARKS else ()
    return [directory / f"{questions}.jsonl", *(directory / name for name in side)]
