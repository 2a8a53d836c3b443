"""The MARS paper's tables and ablations as data, and the command that reruns one of them on GPUs.

    python -m eval.paper main --dry-run                     # print the Hydra sweep(s), the jobs, the report command
    python -m eval.paper theta                              # run the θ ablation on this node's GPU(s), then report
    python -m eval.paper depth --launcher slurm -- hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=2
    python -m eval.paper main --models llama31_8b --target /models/Llama-3.1-8B-Instruct --draft /models/EAGLE3-8B
    python -m eval.paper zoo --dry-run                      # the rule zoo: every rule's sweep (eval.zoo), T=0 and 1

Song et al., "MARS: Unleashing the Power of Speculative Decoding via Margin-Aware Verification",
Findings of ACL 2026, arXiv 2601.15498. Every experiment is one small declarative `Experiment`:
models, benchmarks, the method under test (a display name, `eval.config.methods.method_spec`) and the values
of its main parameter (θ for MARS), its baselines, sampling preset (and temperature sweep), tree
preset (and depth sweep) and max_new_tokens. It becomes one `python -m eval.run -m ...` multirun per
model (the model paths differ per model; and per temperature when a baseline has no greedy form and
drops out at T=0), one Hydra job per combination of the other settings, then one report (eval.report,
or eval.zoo for the rule zoo) over the experiment's output directory.

Each job's method is MARS but in the rule zoo, whose method is strict with every rule point of
`eval.reporting.zoo_sweep.SWEEP` as a baseline. `eval.run` answers a job's `baselines` (generate, vanilla, strict by
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
engine's greedy form, where the release applies exact match (see docs/rules.md).

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
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from eval.config.paths import REPO_ROOT
from eval.reporting.experiments import EXPERIMENTS, Experiment, model_names
from eval.reporting.paper_jobs import (
    FIXED_KEYS,
    LAUNCHERS,
    Command,
    Job,
    NotRunnable,
    check_runnable,
    commands,
    expand,
    hydra_unquote,
    override_key,
    report_argv,
)

EXIT_NOT_RUNNABLE = 2


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
        if override_key(override) in FIXED_KEYS:
            parser.error(f"{override_key(override)} is set by {FIXED_KEYS[override_key(override)]}, not by an override")
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
    print(f"#   {'job':>4}  {'model':<13} {'bench':<10} {'method':<10} {'param':<6} {'depth':<6} {'batch':<6} "
          "sampling")
    for n, job in enumerate(jobs, 1):
        print(f"#   {n:>4}  {job.model:<13} {job.bench:<10} {job.method:<10} {job.value:<6} {job.depth:<6} "
              f"{job.batch:<6} {job.sampling}")
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
        data_dir = next((hydra_unquote(o.split("=", 1)[1]) for o in extra if override_key(o) == "bench.data_dir"), None)
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
