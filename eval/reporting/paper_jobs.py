"""An experiment as commands: one `eval.run` multirun per model (Hydra overrides), the jobs each
expands to, the report command, and the checks before anything launches.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eval.config.methods import RuleMethod, method_spec
from eval.config.paths import BENCH_DIR_ENV
from eval.config.schema import SAMPLINGS, TREES
from eval.reporting import zoo_sweep
from eval.reporting.experiments import Experiment, bench_files, env_key, model_config, model_path, model_path_problem
from mars.rules import RULES, rule_class

LAUNCHERS = ("basic", "gpus", "slurm")
# Keys the experiment owns: set by --models and the experiment's data, not by extra overrides.
FIXED_KEYS = {"model": "--models", "bench": "the experiment (eval.paper runs the paper's benchmarks)"}


class NotRunnable(Exception):
    """The experiment cannot run here: no GPU, a model path or a benchmark file missing."""


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


def override_key(override: str) -> str:
    """The key a Hydra override sets: "+model.x=1" -> "model.x"."""
    return override.split("=", 1)[0].lstrip("+~")


def merge(overrides: list[str], extra: Sequence[str]) -> list[str]:
    """`overrides` with every key that `extra` sets replaced by the extra one, then the other extras."""
    keys = {override_key(o) for o in extra}
    return [o for o in overrides if override_key(o) not in keys] + list(extra)


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
                f"baselines={zoo_sweep.hydra_list(baselines)}",
                f"tree={exp.tree}",
                *([f"tree.depth={','.join(map(str, exp.depths))}"] if exp.depths else []),
                *([f"batch_size={','.join(map(str, exp.batches))}"] if exp.batches else []),
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
    batch: str = "1"


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
                        sampling, list(overrides), values.get("batch_size", "1")))
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
