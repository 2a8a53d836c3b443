"""Collect evaluation runs into one report: report.md (the paper's table layout), report.csv and plots.

    python -m eval.report results/ --out results/report
    python -m eval.report results/T0-1a2b results/sweep/ --out /tmp/report

Each RUN_DIR is a run directory written by `eval.run` (it holds summary.json) or a parent of run
directories (searched up to three levels down). Runs merge into entries keyed by (model, bench,
temperature, method):

- methods of one model × bench × temperature from several run dirs (a θ sweep runs one method per
  job) sit side by side. A ratio a run could not compute for lack of its baseline (speedup against
  vanilla, recovery against strict) is computed against the baseline of the other run dir and marked
  `*`: timings of separate jobs are not interleaved question by question, so machine drift is not
  controlled.
- the same key in run dirs with distinct `settings.shard` labels ("0/2", "1/2") are shards of one run
  and are combined: questions, tokens, seconds and margin-histogram counts are summed; tokens_per_s is
  tokens / seconds; tau is weighted by cycles (by questions when a shard lacks `cycles`), relaxed_frac
  by tokens, and the per-question means (quality metrics, per-depth acceptance rates) by questions;
  per-category figures (Spec-Bench) pool the same way, category by category.
  That is exact for per-question means, an approximation for corpus-level scores (BLEU, chrF) and for
  acceptance rates when shards verified different numbers of positions per question. Ratios are then
  recomputed from the combined figures.
- the same key twice without distinct shard labels is an error, except for the same answers directory
  (a baseline shared by the jobs of a sweep), which counts once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from eval.reporting.plots import write_plots
from eval.reporting.summaries import ReportError, load_runs, merge_runs
from eval.reporting.tables import report_markdown, write_csv


def write_report(run_dirs: Sequence[str | Path], out: str | Path) -> list[Path]:
    """report.md, report.csv and the plots for `run_dirs` into `out`; returns the paths written."""
    runs = load_runs(run_dirs)
    entries = merge_runs(runs)
    if not entries:
        raise ReportError(f"no methods in any summary under {', '.join(map(str, run_dirs))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)  # only ever adds or overwrites our own files
    plots = write_plots(entries, out)
    write_csv(entries, out / "report.csv")
    (out / "report.md").write_text(report_markdown(runs, entries, plots))
    return [out / "report.md", out / "report.csv", *(out / p for p in plots)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory, or a parent of run dirs")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for report.md, report.csv, plots")
    args = parser.parse_args(argv)
    try:
        written = write_report(args.run_dirs, args.out)
    except ReportError as e:
        print(f"eval.report: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {written[0]}, {written[1]} and {len(written) - 2} plots into {Path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
