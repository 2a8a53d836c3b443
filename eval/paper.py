"""The MARS paper's tables and ablations as data, and the command that reruns one of them on GPUs.

    python -m eval.paper main --dry-run                     # print the Hydra sweep(s), the jobs, the report command
    python -m eval.paper theta                              # run the θ ablation on this node's GPU(s), then report
    python -m eval.paper depth --launcher slurm -- hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=2
    python -m eval.paper main --models llama31_8b --target /models/Llama-3.1-8B-Instruct --draft /models/EAGLE3-8B
    python -m eval.paper zoo --dry-run                      # the rule zoo: every rule's sweep (eval.zoo), T=0 and 1

Song et al., "MARS: Unleashing the Power of Speculative Decoding via Margin-Aware Verification",
Findings of ACL 2026, arXiv 2601.15498. Every experiment is one small declarative `Experiment`:
models, benchmarks, the method under test (a display name, `eval.config.method_spec`) and the values
of its main parameter (θ for MARS), its baselines, sampling preset (and temperature sweep), tree
preset (and depth sweep) and max_new_tokens. It becomes one `python -m eval.run -m ...` multirun per
model (the model paths differ per model; and per temperature when a baseline has no greedy form and
drops out at T=0), one Hydra job per combination of the other settings, then one report (eval.report,
or eval.zoo for the rule zoo) over the experiment's output directory.

Each job's method is MARS but in the rule zoo, whose method is strict with every rule point of
`eval.zoo.SWEEP` as a baseline. `eval.run` answers a job's `baselines` (generate, vanilla, strict by
default) alongside it question by question, in run directories shared across jobs, so "strict vs
MARS" needs no strict jobs of its own and a θ sweep times vanilla (and strict, at one tree) once per
model × bench × temperature. A rerun skips finished jobs and resumes unfinished ones.

Where the settings come from. The MARS release (github.com/5SSjw/MARS, mars/evaluation/*.sh) runs
EAGLE-3 drafts with `--total-token 50 --depth 6 --top-k 10` (= this engine's `tree=paper`, 49 nodes
over 7 levels, 10 children), `--relaxation-threshold` 0.9 by default and swept over 0.84-0.98 in
steps of 0.02, at temperature 1.0 on MT-bench, HumanEval, GSM8K, Alpaca and CNN/DM (sum), and its
Qwen3 scripts also at 0.2 (configs/model/qwen3_*.yaml: the paper's Qwen3 temperature). The paper's
table layout (which models each table has) could not be read here; `main`, `main_t0` and `quality`
default to the EAGLE-3 targets the release has T=1 scripts for (Vicuna-13B, LLaMA-3.1-8B,
DeepSeek-R1-Distill-LLaMA-8B) plus LLaMA-3.3-70B, where the paper reports its best speedup (4.76x);
`--models` picks others (the Qwen3 configs, Qwen3-235B-A22B). The depth ablation sets `tree.depth=K`
(this engine's draft levels; the reference's `--depth d` drafts d + 1 levels) and keeps the paper
preset's 49 nodes and 10 children, the paper's own settings for it not being known here.
Differences from the release's code that remain: MARS here uses `method.fallback=strict` (add
`-- method.fallback=reference` for what the release does when the margin test passes but no child is
the target's top-2), its strict rule is EAGLE's lossless one, and at T=0 (`main_t0`) MARS is this
engine's greedy form, where the release applies exact match (see README, verification rules).

Model paths, per model config NAME (configs/model/NAME.yaml): `--target/--draft` (one model only),
else $MARS_TARGET_<NAME> / $MARS_DRAFT_<NAME> (NAME upper-cased, e.g. MARS_TARGET_QWEN3_8B), else
$MARS_MODELS_DIR/<hub id> when that directory exists, else the hub id of the config. Before
launching (not with --dry-run) the command checks, and exits 2 with one message when it fails: a
CUDA GPU is visible (not with --launcher slurm, whose jobs run elsewhere), every model path is a
directory or a hub id in the local Hugging Face cache (compute nodes are often offline), and the
benchmark directory ($MARS_BENCH_DIR, default ../shared/data/bench next to the repository) holds the
experiment's question files.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from eval import zoo
from eval.bench import BENCH_DIR_ENV, REPO_ROOT, bench_path, resolve
from eval.config import GENERATE, HUB_ID, SAMPLINGS, STRICT, TREES, VANILLA, RuleMethod, method_spec
from mars.rules import RULES, rule_class
from mars.rules.margin import Mars

CONFIGS = REPO_ROOT / "configs"
HUMANEVAL_TESTS = "HumanEval.jsonl.gz"  # HumanEval's unit tests, needed to score pass@1
EXIT_NOT_RUNNABLE = 2

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
                * max(1, len(self.depths)))

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
        "zoo", "rule zoo: every verification rule over its parameter range (eval.zoo.SWEEP) as baselines of one "
        "strict job per model × bench × temperature (T = 0, 1): speedup against KL per token / argmax mismatch "
        "and quality",
        MAIN_MODELS, ("mt_bench", "humaneval"), thetas=(), method=STRICT, baselines=tuple(zoo.baselines(1.0)),
        sampling="t0", temperatures=(0.0, 1.0), report="eval.zoo",
        gpus="as main (each job answers every rule point: ~20 methods per question)"),
)}

LAUNCHERS = ("basic", "gpus", "slurm")
# Keys the experiment owns: set by --models and the experiment's data, not by extra overrides.
FIXED_KEYS = {"model": "--models", "bench": "the experiment (eval.paper runs the paper's benchmarks)"}


class NotRunnable(Exception):
    """The experiment cannot run here: no GPU, a model path or a benchmark file missing."""


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
    """The files a benchmark needs: its questions (and HumanEval's unit tests, to score pass@1)."""
    questions = bench_questions(bench)
    if questions.endswith(".jsonl"):
        return [resolve(questions)]
    directory = bench_path(data_dir)
    files = [directory / f"{questions}.jsonl"]
    if questions == "humaneval":
        files.append(directory / HUMANEVAL_TESTS)
    return files


# --- commands -----------------------------------------------------------------------------------

def hydra_quote(value: str) -> str:
    """`value` as a Hydra override value in double quotes: spaces, commas and '=' stay literal (a
    bare comma would make a sweep), ${...} interpolations are still resolved."""
    escaped = re.sub(r'(\\+)(?="|$)', lambda m: m.group(1) * 2, value).replace('"', '\\"')
    return f'"{escaped}"'


def hydra_unquote(value: str) -> str:
    """An override value as Hydra reads it (quotes and escapes removed; interpolations kept)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return str(OverridesParser.create().parse_override(f"key={value}").value())


@dataclass
class Command:
    model: str
    overrides: list[str]
    baselines: tuple[str, ...] = ()
    temperatures: tuple[float, ...] = ()  # those it sweeps, when the experiment's are split between commands

    def argv(self, python: str = "python") -> list[str]:
        return [python, "-m", "eval.run", "-m", *self.overrides]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge(overrides: list[str], extra: Sequence[str]) -> list[str]:
    """`overrides` with every key that `extra` sets replaced by the extra one, then the other extras."""
    keys = {_key(o) for o in extra}
    return [o for o in overrides if _key(o) not in keys] + list(extra)


def runnable_baselines(baselines: Sequence[str], temperature: float) -> tuple[str, ...]:
    """The baselines that can run at `temperature`: at T=0, those of rules with a greedy form."""
    def runs(name: str) -> bool:
        spec = method_spec(name)
        return temperature > 0 or not isinstance(spec, RuleMethod) or rule_class(spec.kind).greedy_form
    return tuple(b for b in baselines if runs(b))


def method_overrides(exp: Experiment) -> list[str]:
    """`method=<kind>`, the parameters its display name sets, and the sweep of its main parameter."""
    spec = method_spec(exp.method)
    overrides = [f"method={spec.kind}"]
    if isinstance(spec, RuleMethod):
        rule = spec.rule()
        defaults = type(rule)().params()
        label = rule.label
        overrides += [f"method.{k}={v:g}" if isinstance(v, float) else f"method.{k}={v}"
                      for k, v in rule.params().items() if v != defaults[k] and not (exp.thetas and k == label)]
        if exp.thetas:
            overrides.append(f"method.{label}={','.join(f'{t:g}' for t in exp.thetas)}")
    return overrides


def commands(exp: Experiment, models: Sequence[str], out: Path, launcher: str = "basic",
             num_prompts: int | None = None, target: str | None = None, draft: str | None = None,
             extra: Sequence[str] = ()) -> list[Command]:
    """One multirun per model (and per group of the experiment's temperatures that share their baselines):
    its paths, then every other setting of the experiment (swept values comma-separated), then `extra`
    (which replaces an experiment setting with the same key)."""
    temperatures = exp.temperatures or (SAMPLINGS[exp.sampling].temperature,)
    by_baselines: dict[tuple[str, ...], list[float]] = {}
    for t in temperatures:
        by_baselines.setdefault(runnable_baselines(exp.baselines, t), []).append(t)
    split = len(by_baselines) > 1
    result = []
    for model in models:
        for baselines, temps in by_baselines.items():
            sweep_dir = f"{out}/sweeps/{model}" + (f"/T{'-'.join(f'{t:g}' for t in temps)}" if split else "")
            overrides = [
                f"model={model}",
                f"bench={','.join(exp.benches)}",
                *method_overrides(exp),
                f"baselines={zoo.hydra_list(baselines)}",
                f"tree={exp.tree}",
                *([f"tree.depth={','.join(map(str, exp.depths))}"] if exp.depths else []),
                f"sampling={exp.sampling}",
                *([f"sampling.temperature={','.join(f'{t:g}' for t in temps)}"] if exp.temperatures else []),
                f"max_new_tokens={exp.max_new_tokens}",
                f"num_prompts={'null' if num_prompts is None else num_prompts}",
                "out_dir=" + hydra_quote(f"{out}/${{model.name}}/${{bench.name}}"),
                f"logging.group={exp.name}",
                "hydra.sweep.dir=" + hydra_quote(sweep_dir),
            ]
            if launcher != "basic":
                overrides.append(f"hydra/launcher={launcher}")
            config = model_config(model)
            for role, given in (("target", target), ("draft", draft)):
                path = model_path(model, role, given)
                if path != str(config[role]):
                    overrides.append(f"model.{role}={hydra_quote(path)}")
            result.append(Command(model, merge(overrides, extra), baselines, tuple(temps) if split else ()))
    return result


def report_argv(out: Path, models: Sequence[str], python: str = "python", module: str = "eval.report") -> list[str]:
    """The experiment's report module (eval.report, eval.zoo) over its output: the run directories sit
    at <out>/<model>/<bench>/<run>/, so each <out>/<model> is a parent of run directories two levels up."""
    return [python, "-m", module, *(str(out / m) for m in models), "--out", str(out / "report")]


@dataclass
class Job:
    model: str
    bench: str
    method: str  # its display name (mars@0.88, strict)
    value: str  # its main parameter's value (θ for MARS), "-" for none
    depth: str
    sampling: str
    overrides: list[str]


def job_method(values: dict[str, str]) -> tuple[str, str]:
    """(display name, main parameter's value or "-") of the method a job's overrides set."""
    kind = values["method"]
    if kind not in RULES:
        return method_spec(kind).name, "-"
    params = {k.partition(".")[2]: v for k, v in values.items() if k.startswith("method.")}
    label = rule_class(kind).label
    value = params.pop(label, None) if label else None
    text = kind + (f"@{value}" if value is not None else "")
    text += f"[{','.join(f'{k}={v}' for k, v in params.items())}]" if params else ""
    spec = method_spec(text)
    return spec.name, f"{getattr(spec, label):g}" if label else "-"


def expand(command: Command) -> list[Job]:
    """The jobs Hydra's basic sweeper makes of a multirun command (every combination of the
    comma-separated values), with the settings that tell them apart."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(command.overrides)
    jobs = []
    for overrides in BasicSweeper.split_arguments(parsed, None)[0]:
        values = {}
        for override in overrides:
            key, _, value = override.partition("=")
            values[key.lstrip("+~")] = value
        method, value = job_method(values)
        tree = values.get("tree", "paper")
        depth = values.get("tree.depth", str(TREES[tree].depth) if tree in TREES else "?")
        preset = values.get("sampling", "t0")
        if "sampling.temperature" in values:
            sampling = f"T={float(values['sampling.temperature']):g}"
        else:
            sampling = f"{preset} (T={SAMPLINGS[preset].temperature:g})" if preset in SAMPLINGS else preset
        jobs.append(Job(values.get("model", command.model), values.get("bench", "?"), method, value, depth,
                        sampling, list(overrides)))
    return jobs


# --- checks -------------------------------------------------------------------------------------

def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_runnable(exp: Experiment, cmds: Sequence[Command], launcher: str, data_dir: str | None) -> None:
    """Raise NotRunnable with one message when the experiment cannot run here."""
    if launcher != "slurm" and not cuda_available():
        raise NotRunnable(
            f"no CUDA GPU is visible (torch.cuda.is_available() is False): eval.paper {exp.name} runs the paper's "
            "experiments on GPU clusters; on a CPU use the embedded pair's scripts "
            f"({'scripts/rule_zoo_embedded.sh' if exp.report == 'eval.zoo' else 'scripts/reproduce_embedded.sh'}; "
            "--dry-run prints the jobs without running them)")
    problems = []
    for cmd in {cmd.model: cmd for cmd in cmds}.values():  # a model's commands share its paths
        config = model_config(cmd.model)
        paths = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in cmd.overrides if o.startswith("model.")}
        for role in ("target", "draft"):
            path = hydra_unquote(paths.get(f"model.{role}", str(config[role])))
            problem = model_path_problem(path)
            if problem:
                problems.append(f"{cmd.model} {role}: {problem} (--{role} PATH, ${env_key(cmd.model, role)} "
                                "or $MARS_MODELS_DIR/<hub id>)")
    missing = sorted({str(f) for b in exp.benches for f in bench_files(b, data_dir) if not f.exists()})
    if missing:
        problems.append(f"benchmark files missing (set ${BENCH_DIR_ENV} or bench.data_dir): {', '.join(missing)}")
    if problems:
        raise NotRunnable("cannot run eval.paper " + exp.name + ": " + "; ".join(problems))


# --- CLI ----------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    epilog = "experiments:\n" + "\n".join(
        f"  {e.name:<12} {e.num_jobs():>3} jobs  {e.reproduces}" for e in EXPERIMENTS.values())
    parser = argparse.ArgumentParser(
        prog="python -m eval.paper", description=__doc__.split("\n")[0], epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s EXPERIMENT [options] [-- extra eval.run / hydra overrides ...]")
    parser.add_argument("experiment", choices=list(EXPERIMENTS), metavar="EXPERIMENT",
                        help=f"one of: {', '.join(EXPERIMENTS)}")
    parser.add_argument("--models", help="comma-separated model configs (configs/model/*.yaml) instead of the "
                                         "experiment's")
    parser.add_argument("--target", help="the target model's directory or hub id (with one model only)")
    parser.add_argument("--draft", help="the draft model's directory or hub id (with one model only)")
    parser.add_argument("--out", help="output directory (default results/paper/<experiment>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and jobs; run and check nothing")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="basic",
                        help="basic: one job after another; gpus: parallel jobs on this node's GPUs (MARS_GPUS "
                             "at a time); slurm: one SLURM job each (hydra.launcher.* after --)")
    parser.add_argument("--num-prompts", type=int, metavar="N", help="the first N questions of each benchmark "
                                                                     "(default all)")
    args = parser.parse_args(argv)
    exp = EXPERIMENTS[args.experiment]
    models = args.models.split(",") if args.models else list(exp.models)
    unknown = sorted(set(models) - set(model_names()))
    if unknown:
        parser.error(f"unknown model config(s) {', '.join(unknown)}; known: {', '.join(model_names())}")
    if (args.target or args.draft) and len(models) != 1:
        parser.error(f"--target/--draft name one model's paths; {exp.name} runs {len(models)} models "
                     f"({', '.join(models)}): add --models NAME, or use $MARS_TARGET_<MODEL> / $MARS_DRAFT_<MODEL>")
    if args.num_prompts is not None and args.num_prompts < 1:
        parser.error("--num-prompts must be >= 1")
    for override in extra:
        if "=" not in override and not override.startswith("~"):
            parser.error(f"extra overrides after -- are key=value, got {override!r}")
        if _key(override) in FIXED_KEYS:
            parser.error(f"{_key(override)} is set by {FIXED_KEYS[_key(override)]}, not by an override")
    args.models = models
    return args, extra


def _print_plan(exp: Experiment, cmds: Sequence[Command], jobs: Sequence[Job], report: list[str]) -> None:
    print(f"# eval.paper {exp.name}: {exp.reproduces}")
    print(f"# GPUs: {exp.gpus}")
    for n, cmd in enumerate(cmds, 1):
        where = cmd.model + "".join(f", T={t:g}" for t in cmd.temperatures)
        print(f"# command {n}/{len(cmds)} ({where}; baselines {', '.join(cmd.baselines)}):")
        print(shlex.join(cmd.argv()))
    print(f"# {len(jobs)} jobs (each also answers its command's baselines, shared between jobs):")
    print(f"#   {'job':>4}  {'model':<13} {'bench':<10} {'method':<10} {'param':<6} {'depth':<6} sampling")
    for n, job in enumerate(jobs, 1):
        print(f"#   {n:>4}  {job.model:<13} {job.bench:<10} {job.method:<10} {job.value:<6} {job.depth:<6} "
              f"{job.sampling}")
    print("# report:")
    print(shlex.join(report))


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    exp = EXPERIMENTS[args.experiment]
    out = Path(args.out or REPO_ROOT / "results" / "paper" / exp.name).expanduser().resolve()
    if "$" in str(out):
        print(f"eval.paper: error: the output directory must not contain '$' (Hydra interpolation): {out}",
              file=sys.stderr)
        return EXIT_NOT_RUNNABLE
    cmds = commands(exp, args.models, out, args.launcher, args.num_prompts, args.target, args.draft, extra)
    jobs = [job for cmd in cmds for job in expand(cmd)]
    if not args.dry_run:
        data_dir = next((hydra_unquote(o.split("=", 1)[1]) for o in extra if _key(o) == "bench.data_dir"), None)
        try:
            check_runnable(exp, cmds, args.launcher, data_dir)
        except NotRunnable as e:
            print(f"eval.paper: error: {e}", file=sys.stderr)
            return EXIT_NOT_RUNNABLE
    _print_plan(exp, cmds, jobs, report_argv(out, args.models, module=exp.report))
    if args.dry_run:
        return 0
    for n, cmd in enumerate(cmds, 1):
        print(f"eval.paper: running command {n}/{len(cmds)} ({cmd.model})", flush=True)
        code = subprocess.run(cmd.argv(sys.executable), cwd=REPO_ROOT).returncode
        if code:
            print(f"eval.paper: error: the {cmd.model} sweep exited with {code}; rerunning resumes it (finished jobs "
                  "are skipped)", file=sys.stderr)
            return code
    done = [m for m in args.models if (out / m).is_dir()]
    if not done:
        print(f"eval.paper: error: no results under {out} to report", file=sys.stderr)
        return EXIT_NOT_RUNNABLE
    code = subprocess.run(report_argv(out, done, sys.executable, exp.report), cwd=REPO_ROOT).returncode
    if code:
        print(f"eval.paper: error: the report failed (exit {code})", file=sys.stderr)
        return code
    print(f"eval.paper: the {exp.name} report is in {out / 'report' / 'report.md'} (its data and plots alongside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
