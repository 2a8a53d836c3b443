"""The rule zoo's report from the summaries of its runs: report.md, pareto.png, zoo.json.

    python -m eval.zoo /tmp/zoo/summary_t0.json /tmp/zoo/summary_t1.json --out /tmp/zoo
    python -m eval.zoo results/zoo/ --out results/zoo/report      # directories: searched as eval.report does
    python -m eval.zoo /tmp/zoo/summary_t1.json /tmp/zoo/summary_t1_sampled.json --out /tmp/zoo   # drafting modes

Runs of one temperature that differ in drafting mode (tree.drafting=topk, tree.drafting=sample) each get
their table, and share one panel of the plot with a Pareto front each (scripts/rule_zoo_embedded.sh with
DRAFTING=both runs both at T=1).

What the zoo sweeps and why: `eval.reporting.zoo_sweep`; the report's layout: `eval.reporting.zoo_tables`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from eval.reporting.summaries import ReportError
from eval.reporting.zoo_sweep import baselines, groups, hydra_list, load
from eval.reporting.zoo_tables import plot, report_markdown, slug, zoo_json


def write_report(paths: Sequence[str | Path], out: str | Path) -> list[Path]:
    """report.md, zoo.json and the Pareto plot(s) for the summaries under `paths` into `out`."""
    runs = load(paths)
    groups_ = groups(runs)
    if not groups_:
        raise ReportError(f"no methods in any summary under {', '.join(map(str, paths))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = list(dict.fromkeys((g.model, g.bench) for g in groups_))
    plots = {pair: "pareto.png" if len(pairs) == 1 else f"pareto_{slug(pair[0])}_{slug(pair[1])}.png"
             for pair in pairs}
    for pair, name in plots.items():
        plot([g for g in groups_ if (g.model, g.bench) == pair], out / name)
    (out / "report.md").write_text(report_markdown(runs, groups_, plots))
    (out / "zoo.json").write_text(json.dumps(zoo_json(groups_, plots), indent=2) + "\n")
    return [out / "report.md", out / "zoo.json", *(out / p for p in plots.values())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.zoo", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", metavar="SUMMARY",
                        help="summary.json files (e.g. eval.run's summary_path copies), run directories or parents")
    parser.add_argument("--out", metavar="DIR", help="directory for report.md, zoo.json and pareto.png")
    parser.add_argument("--baselines", nargs="+", type=float, metavar="T",
                        help="print the zoo's eval.run baselines=[...] value at each temperature T, one a line")
    args = parser.parse_args(argv)
    if args.baselines:
        for t in args.baselines:
            print(hydra_list(baselines(t)))
        return 0
    if not args.paths or not args.out:
        parser.error("give SUMMARY paths and --out DIR (or --baselines T ...)")
    try:
        written = write_report(args.paths, args.out)
    except ReportError as e:
        print(f"eval.zoo: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
