"""The real pair's main table as a measurement record: quality from one run, speed from another
(`scripts/quality_table_smollm2.sh`).

The quality phase answers every question of each set with every method drafting strict's tree (the paper's
comparison at one tree); the speed phase answers each set's first questions with the tree calibrated for each
method and `model.generate` beside them (the speed a user gets). Per temperature, benchmark and method the record
keeps: `n` (questions scored), `speed` (paired speedup over the fastest plain decoding, from the speed phase) and
`speed_n`, `tau` (quality phase), `score` and `metric` (the benchmark's headline; None where it only compares with
vanilla's answers, MT-bench), `recovery` with `low` and `high` (the paired 95% bootstrap interval of the score
against strict's on the same questions; `nonzero`: the questions it rests on), `loglik` (the target's mean
log-likelihood per token of the method's answers), `cost` (the relaxation's exact cost per token: log-prob
regret at T = 0, KL at T > 0) and `batch` where the quality phase answered that many questions at a time;
strict's rows also `exact` (the share of its checked turns equal to plain decoding at the tree's kernels) and
`exact_checked` (those turns). `budgets` (`--budget-runs`): per run whose θ a quality
budget chose, the budget, θ, each θ's cost and tau on the calibration prompts, and the run's own cost, tau and
speed (`budget_of`). `answered_on` (where answers came from several machines):
which machine answered which questions, as given; every method's answer to one question comes from one machine,
so the paired figures pair like with like.

The phases, and a phase's benchmarks, may run on different days (a temperature took 6-7 hours on 2 cores):
`--quality-from RECORD` starts from an earlier record of this kind; the benchmarks OUT_DIR/quality holds replace
its quality figures, those OUT_DIR/speed holds its speed figures, and the rest is kept: its budgets (a new budget
run of the same benchmark, metric and budget replaces one) and its `answered_on` lines (new ones are added).

    python -m eval.reporting.quality_table OUT_DIR --command "scripts/quality_table_smollm2.sh OUT_DIR" \\
        --what "..." [--cpu-hours H] [--quality-from RECORD]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from eval.reporting.measurements import Measurement, commit_of, this_machine, write
from eval.reporting.summaries import Entry, batch_of, find_summaries, merge_runs, read_summary

COST = {0.0: "logprob_regret", 1.0: "kl_per_token"}  # the relaxation's cost reported per temperature


def _entries(directory: Path) -> list[Entry]:
    return merge_runs([read_summary(f) for f in find_summaries(directory, depth=6)])


def _quality(e: Entry) -> dict:
    fig, ci = e.fig, e.fig.get("quality_recovery_ci") or {}
    headline = e.quality_metric if e.quality_metric and not e.quality_metric.endswith("_vs_vanilla") else None
    cost = COST.get(e.temperature, "kl_per_token")
    return {"n": fig.get("questions"), "tau": fig.get("tau"), "metric": headline,
            "score": (fig.get("quality") or {}).get(headline) if headline else None,
            "recovery": ci.get("recovery") if headline else None, "low": ci.get("low") if headline else None,
            "high": ci.get("high") if headline else None, "nonzero": ci.get("nonzero") if headline else None,
            "loglik": fig.get("loglik"), "cost_metric": cost, "cost": fig.get(cost),
            **({"exact": fig.get("exact_at_tree_kernels"), "exact_checked": fig.get("exact_checked_turns")}
               if fig.get("exact_checked_turns") else {})}


def _speed(fig: dict) -> dict:
    """A speed phase's figures of one method: paired speed over the fastest plain decoding, its tree, on or off."""
    return {"speed": fig.get("speedup_vs_fastest_paired"),
            "speed_n": fig.get("speedup_vs_fastest_paired_n") or fig.get("questions"),
            "speed_tree": fig.get("tree"), "speculation": fig.get("speculation")}


SPEED_KEYS = tuple(_speed({}))


def figures_of(out: Path, earlier: dict | None = None) -> dict:
    """{"temperatures": {T: {bench: {method: figures}}}} from OUT/quality and OUT/speed, on top of `earlier` (an
    earlier record's "temperatures"): a benchmark OUT/quality holds replaces its methods' quality figures, one
    OUT/speed holds its speed figures (model.generate's rows with them); the rest of the earlier record stays."""
    table: dict[str, dict[str, dict[str, dict]]] = json.loads(json.dumps(earlier or {}))
    quality = _entries(out / "quality") if (out / "quality").is_dir() else []
    speed = _entries(out / "speed") if (out / "speed").is_dir() else []
    answered: dict[tuple, list[str]] = {}  # (T, bench, method): the quality phase's runs of it
    for e in quality:
        method, size = batch_of(e.method)  # a batch is a throughput device here: its rows are the method's
        t = f"{e.temperature:g}"
        if (t, e.bench, method) in answered:
            raise ValueError(f"{out / 'quality'} holds {method} at T = {t} on {e.bench} twice (at two batch "
                             f"sizes?): {answered[t, e.bench, method] + e.run_dirs}; move one of them out")
        answered[t, e.bench, method] = e.run_dirs
        rows = table.setdefault(t, {}).setdefault(e.bench, {})
        kept = {k: v for k, v in rows.get(method, {}).items() if k in SPEED_KEYS}
        rows[method] = {**_quality(e), **({"batch": size} if size > 1 else {}), **kept}
    for t, bench in {(f"{e.temperature:g}", e.bench) for e in speed}:  # a speed phase since: its speed replaces
        rows = table.get(t, {}).get(bench, {})
        for method in list(rows):
            rows[method] = {k: v for k, v in rows[method].items() if k not in SPEED_KEYS}
            if "tau" not in rows[method]:  # a speed phase's own row (model.generate's)
                del rows[method]
    for e in speed:
        row = table.get(f"{e.temperature:g}", {}).get(e.bench, {})
        if e.method in row or e.method.startswith("generate"):
            row.setdefault(e.method, {"n": None}).update(_speed(e.fig))
    return {"temperatures": table}


def budget_of(summary_path: Path) -> dict:
    """What one run whose θ a quality budget chose (`method.quality_budget`, eval/runner/budgeted.py) shows: the
    budget, the θ chosen, each θ's cost and tau on the calibration prompts, and the run's own cost per token, tau
    and paired speed on its questions (the budget checked where it is used)."""
    summary = json.loads(summary_path.read_text())
    choice = summary["settings"]["quality_budget"]
    kind = summary["settings"]["method"]["kind"]
    name = f"{kind}@{choice['value']:g}"  # the method as the run named it
    fig, metric = summary["methods"][name], choice["metric"]
    return {"method": name, "metric": metric, "per_token": choice["per_token"], "margin": choice["margin"],
            "parameter": choice["parameter"], "value": choice["value"], "bench": summary["settings"]["bench"],
            "grid": {f"{p['value']:g}": {"cost": p["costs"][metric], "tau": p["tau"]} for p in choice["points"]},
            "n": fig.get("questions"), "cost": fig.get(metric), "tau": fig.get("tau"), **_speed(fig),
            # the same rule at other values answered in the same run (baselines): speeds paired with the chosen's
            "beside": {m: {"cost": f.get(metric), "tau": f.get("tau"), **_speed(f)}
                       for m, f in summary["methods"].items() if m != name and m.startswith(f"{kind}@")}}


def joined(earlier: dict, figures: dict, budgets: list[dict], answered_on: list[str]) -> dict:
    """`figures` (figures_of's, on top of `earlier`'s table) with what else the earlier record's figures hold: its
    budgets, less those a new one of the same benchmark, metric and budget replaces, and its provenance lines
    followed by the new ones."""
    kept = {(b["bench"], b["metric"], b["per_token"]): b for b in [*earlier.get("budgets", []), *budgets]}
    lines = list(dict.fromkeys([*earlier.get("answered_on", []), *answered_on]))
    return {**figures, **({"answered_on": lines} if lines else {}),
            **({"budgets": sorted(kept.values(), key=lambda b: (b["metric"], b["per_token"]))} if kept else {})}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the real pair's main-table record from a quality-table run.")
    parser.add_argument("out", type=Path, help="the OUT_DIR of scripts/quality_table_smollm2.sh")
    parser.add_argument("--command", required=True)
    parser.add_argument("--what", required=True)
    parser.add_argument("--cpu-hours", type=float, help="the CPU hours of every answer the record holds, "
                        "both phases (an earlier record's included)")
    parser.add_argument("--commit", help="default: this checkout's HEAD")
    parser.add_argument("--date", default=datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"),
                        help="when the figures were measured (default: now, to the minute)")
    parser.add_argument("--kind", default="smollm2-quality-table")
    parser.add_argument("--record", type=Path, help="where to write it (default: benchmarks/records/...)")
    parser.add_argument("--quality-from", type=Path, help="an earlier record of this kind to build on: OUT_DIR's "
                        "phases replace, per benchmark, the figures they hold, and the rest is kept")
    parser.add_argument("--budget-runs", type=Path, nargs="*", default=[], metavar="DIR",
                        help="runs whose θ a quality budget chose (their directories, or folders above them)")
    parser.add_argument("--answered-on", action="append", default=[], metavar="TEXT",
                        help="where the answers came from more than one machine: which answered what, with its CPU "
                        "and commit (repeat it); the record's own machine is this one")
    args = parser.parse_args(argv)
    machine, versions = this_machine()
    earlier = json.loads(args.quality_from.read_text())["figures"] if args.quality_from else {}
    budgets = [budget_of(p) for d in args.budget_runs for p in find_summaries(d, depth=6)]
    figures = joined(earlier, {**figures_of(args.out, earlier.get("temperatures")), "cpu_hours": args.cpu_hours},
                     budgets, args.answered_on)
    record = Measurement(kind=args.kind, what=args.what, command=args.command, commit=args.commit or commit_of(),
                         date=args.date, machine=machine, versions=versions, figures=json.loads(json.dumps(figures)))
    print(write(record, args.record))


if __name__ == "__main__":
    main()
