"""The real pair's main table as a measurement record: quality from one run, speed from another
(`scripts/quality_table_smollm2.sh`).

The quality phase answers every question of each set with every method drafting strict's tree (the paper's
comparison at one tree); the speed phase answers each set's first questions with the tree calibrated for each
method and `model.generate` beside them (the speed a user gets). Per temperature, benchmark and method the record
keeps: `n` (questions scored), `speed` (paired speedup over the fastest plain decoding, from the speed phase) and
`speed_n`, `tau` (quality phase), `score` and `metric` (the benchmark's headline; None where it only compares with
vanilla's answers, MT-bench), `recovery` with `low` and `high` (the paired 95% bootstrap interval of the score
against strict's on the same questions; `nonzero`: the questions it rests on), `loglik` (the target's mean
log-likelihood per token of the method's answers) and `cost` (the relaxation's exact cost per token: log-prob
regret at T = 0, KL at T > 0); strict's rows also `exact` (the share of its checked turns equal to plain decoding at
the tree's kernels) and `exact_checked` (those turns). `answered_on` (where answers came from several machines):
which machine answered which questions, as given; every method's answer to one question comes from one machine,
so the paired figures pair like with like.

The phases, and a phase's benchmarks, may run on different days (a temperature takes 2-3 CPU hours on 2 cores):
`--quality-from RECORD` starts from the quality figures of an earlier record of this kind, adds (or replaces)
those of the benchmarks OUT_DIR/quality holds, and takes the speed from OUT_DIR/speed.

    python -m eval.reporting.quality_table OUT_DIR --command "scripts/quality_table_smollm2.sh OUT_DIR" \\
        --what "..." [--cpu-hours H] [--quality-from RECORD]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from eval.reporting.measurements import Measurement, commit_of, this_machine, write
from eval.reporting.summaries import Entry, find_summaries, merge_runs, read_summary

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


SPEED_KEYS = ("speed", "speed_n", "speed_tree", "speculation")


def figures_of(out: Path, quality: dict | None = None) -> dict:
    """{"temperatures": {T: {bench: {method: figures}}}} from OUT/quality, or from `quality` (an earlier record's
    "temperatures"), and OUT/speed (see the docstring)."""
    table: dict[str, dict[str, dict[str, dict]]] = {}
    if quality is not None:  # its quality rows (a speed phase's own rows, model.generate's, have no tau)
        table = {t: {b: {m: {k: v for k, v in row.items() if k not in SPEED_KEYS} for m, row in rows.items()
                         if "tau" in row} for b, rows in benches.items()} for t, benches in quality.items()}
    if (out / "quality").is_dir():  # a benchmark answered since joins them, or replaces its rows
        for e in _entries(out / "quality"):
            table.setdefault(f"{e.temperature:g}", {}).setdefault(e.bench, {})[e.method] = _quality(e)
    if (out / "speed").is_dir():
        for e in _entries(out / "speed"):
            row = table.get(f"{e.temperature:g}", {}).get(e.bench, {})
            if e.method in row or e.method.startswith("generate"):
                target = row.setdefault(e.method, {"n": None})
                target["speed"] = e.fig.get("speedup_vs_fastest_paired")
                target["speed_n"] = e.fig.get("speedup_vs_fastest_paired_n") or e.fig.get("questions")
                target["speed_tree"] = e.fig.get("tree")
                target["speculation"] = e.fig.get("speculation")
    return {"temperatures": table}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the real pair's main-table record from a quality-table run.")
    parser.add_argument("out", type=Path, help="the OUT_DIR of scripts/quality_table_smollm2.sh")
    parser.add_argument("--command", required=True)
    parser.add_argument("--what", required=True)
    parser.add_argument("--cpu-hours", type=float, help="the run's CPU hours, both phases")
    parser.add_argument("--commit", help="default: this checkout's HEAD")
    parser.add_argument("--date", default=datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"),
                        help="when the figures were measured (default: now, to the minute)")
    parser.add_argument("--kind", default="smollm2-quality-table")
    parser.add_argument("--record", type=Path, help="where to write it (default: benchmarks/records/...)")
    parser.add_argument("--quality-from", type=Path, help="an earlier record of this kind whose quality figures "
                        "to keep (OUT_DIR then needs only its speed phase)")
    parser.add_argument("--answered-on", action="append", default=[], metavar="TEXT",
                        help="where the answers came from more than one machine: which answered what, with its CPU "
                        "and commit (repeat it); the record's own machine is this one")
    args = parser.parse_args(argv)
    machine, versions = this_machine()
    quality = json.loads(args.quality_from.read_text())["figures"]["temperatures"] if args.quality_from else None
    figures = {**figures_of(args.out, quality), "cpu_hours": args.cpu_hours,
               **({"answered_on": args.answered_on} if args.answered_on else {})}
    record = Measurement(kind=args.kind, what=args.what, command=args.command, commit=args.commit or commit_of(),
                         date=args.date, machine=machine, versions=versions, figures=json.loads(json.dumps(figures)))
    print(write(record, args.record))


if __name__ == "__main__":
    main()
