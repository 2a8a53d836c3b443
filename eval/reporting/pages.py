"""Tables in the pages, rendered from the newest measurement record of their kind (`eval.reporting.measurements`).

A page marks where a table goes, and what it shows:

    <!-- rendered: speed-table embedded-benchmark xeon-amx -->
    (what this module writes; never edited by hand)
    <!-- /rendered -->

"rendered: RENDERER KIND [CPU CLASS]": the newest record of KIND (on that CPU class) through RENDERER (one of
RENDERERS). `python -m eval.reporting.pages` rewrites every marked block of README.md and docs/*.md; with
`--check` it changes nothing and fails on a block that differs from what its record renders
(`tests/test_pages.py` runs the check, so a new record or a changed figure shows up as a failing test until the
pages are rendered again).

Add a renderer: a function (record, link) -> Markdown lines, decorated with `@renderer("name")`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from eval.config.paths import REPO_ROOT
from eval.reporting.measurements import RECORDS, Measurement, load_all, newest

BLOCK = re.compile(r"(<!-- rendered: ([^>]*?) -->\n)(.*?)(<!-- /rendered -->)", re.S)
Renderer = Callable[[Measurement, str], list[str]]
RENDERERS: dict[str, Renderer] = {}


def renderer(name: str) -> Callable[[Renderer], Renderer]:
    def add(fn: Renderer) -> Renderer:
        RENDERERS[name] = fn
        return fn
    return add


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def provenance(record: Measurement, link: str) -> str:
    m = record.machine
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    return (f"{record.date}, {m['cpu']} (`{m['capability']}`{cores}), commit `{record.commit}`, "
            f"torch {record.versions.get('torch', '?')}: `{record.command}` ([record]({link}))")


@renderer("speed-table")
def speed_table(record: Measurement, link: str) -> list[str]:
    """Per method of an `eval.run` record: tok/s, the paired and total speedups over the fastest plain decoding,
    the speedup over our vanilla, tau, the tree and the verdict (a method that is off decodes plainly)."""
    fig = record.figures
    lines = [provenance(record, link), "",
             "| method | tok/s | vs fastest plain, paired | vs fastest plain, totals | vs our vanilla | τ | tree | "
             "speculation |", "|---|---|---|---|---|---|---|---|"]
    for name, m in fig["methods"].items():
        lines.append(f"| {name} | {m['tokens_per_s']:.1f} | {_x(m.get('speedup_vs_fastest_paired'))} | "
                     f"{_x(m.get('speedup_vs_fastest'))} | {_x(m.get('speedup'))} | {m.get('tau', 1.0):.2f} | "
                     f"{m.get('tree', '-')} | {m.get('speculation') or '-'} |")
    lines += ["", f"The fastest plain decoding: `{fig.get('fastest_plain')}`."]
    return lines


@renderer("speed-line")
def speed_line(record: Measurement, link: str) -> list[str]:
    """One sentence: strict's and MARS θ = 0.9's paired speedups over the fastest plain decoding."""
    fig = record.figures["methods"]
    parts = [f"{label} {_x(fig[name].get('speedup_vs_fastest_paired'))}"
             for name, label in (("strict", "strict"), ("mars@0.9", "MARS θ = 0.9")) if name in fig]
    questions = next((m["questions"] for m in fig.values() if m.get("questions")), None)
    return [f"{' and '.join(parts)} the fastest plain decoding (`{record.figures.get('fastest_plain')}`), paired per "
            f"question over {questions} questions; {record.machine['cpu']} (`{record.machine['capability']}`), "
            f"{record.date}, commit `{record.commit}` ([record]({link}))."]


@renderer("calibration-check")
def calibration_check(record: Measurement, link: str) -> list[str]:
    """Per run of a calibration check (idle and beside a bursty load): each method's verdict, its measured
    paired speedup, the calibration's prediction with its 90% interval, and the calibration's seconds."""
    lines = [provenance(record, link), "",
             "| run | calibration | strict: verdict | measured | predicted [90%] | MARS θ = 0.9: measured | "
             "predicted [90%] |", "|---|---|---|---|---|---|---|"]
    for name, run in record.figures["runs"].items():
        cells = []
        for method in ("strict", "mars@0.9"):
            m = run[method]
            low, high = m["interval"]
            inside = "" if m["inside"] else " (outside)"
            cells.append((m["speculation"], f"{m['measured_paired']:.2f}×{inside}",
                          f"{m['predicted']:.2f}× [{low:.2f}, {high:.2f}]"))
        lines.append(f"| {name} | {run['calibration_s']:.0f} s | {cells[0][0]} | {cells[0][1]} | {cells[0][2]} | "
                     f"{cells[1][1]} | {cells[1][2]} |")
    return lines


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@renderer("quality-table")
def quality_table(record: Measurement, link: str) -> list[str]:
    """The real pair's main table (`eval.reporting.quality_table`), one table per temperature: per benchmark and
    method its questions, paired speed over the fastest plain decoding (with the tree it was calibrated to, or
    "off" where none beat plain decoding), tau, score, recovery against strict with
    its paired 95% interval, the target's log-likelihood per token and the relaxation's cost per token; "(B=b)"
    after n where the quality phase answered b questions at a time."""
    hours = record.figures.get("cpu_hours")
    lines = [provenance(record, link) + (f"; {hours:.1f} CPU hours" if hours else "")]
    for t, benches in record.figures["temperatures"].items():
        cost = next((m["cost_metric"] for b in benches.values() for m in b.values() if m.get("cost_metric")), "cost")
        cost = cost.removesuffix("_per_token")  # kl_per_token: the column says "/ token" already
        lines += ["", f"**T = {t}**", "",
                  f"| bench | method | n | speed vs fastest plain, paired (n) | τ | score | recovery vs strict [95%] "
                  f"(nonzero) | log-lik / token | {cost} / token |", "|---|---|---|---|---|---|---|---|---|"]
        for bench, methods in benches.items():
            for name, m in methods.items():
                speed = "-" if m.get("speed") is None else f"{m['speed']:.2f}× ({m.get('speed_n')}{_how(m)})"
                score = "-" if m.get("score") is None else f"{m['score']:.2f} {m['metric']}"
                recovery = "-" if m.get("recovery") is None else (
                    f"{m['recovery']:.3f} [{_num(m.get('low'), 3)}, {_num(m.get('high'), 3)}] ({m.get('nonzero')})")
                n = f"{m.get('n') or '-'}" + (f" (B={m['batch']})" if m.get("batch") else "")
                lines.append(f"| {bench} | {name} | {n} | {speed} | {_num(m.get('tau'))} | {score} | "
                             f"{recovery} | {_num(m.get('loglik'), 3)} | {_num(m.get('cost'), 4)} |")
        checked = [f"{bench} {round(s['exact'] * s['exact_checked'])}/{s['exact_checked']}"
                   for bench, methods in benches.items() if (s := methods.get("strict", {})).get("exact_checked")]
        if checked:
            lines += ["", "Strict's turns equal to plain decoding at the tree's kernels, of those checked: "
                      + ", ".join(checked) + "."]
    if record.figures.get("answered_on"):
        lines += ["", "Answered on more than one machine: " + "; ".join(record.figures["answered_on"]) + "."]
    return lines


def _how(row: dict) -> str:
    """How a method decoded in the speed phase: its calibrated tree, or off (the fastest plain decoding instead)."""
    if row.get("speculation") == "off":
        return "; off: plain decoding"
    return f"; {row['speed_tree']}" if row.get("speed_tree") else ""


def _where(record: Measurement) -> str:
    """The machine a record's figures come from, or where its answers came from several (the record says which
    answered what, and its table shows it)."""
    if record.figures.get("answered_on"):
        return (f"answers from {len(record.figures['answered_on'])} machines or commits, which the record names "
                f"(its own: {record.machine['cpu']}, `{record.machine['capability']}`)")
    return f"{record.machine['cpu']} (`{record.machine['capability']}`)"


@renderer("quality-budgets")
def quality_budgets(record: Measurement, link: str) -> list[str]:
    """The runs whose θ a quality budget chose (`eval.reporting.quality_table --budget-runs`): per budget the θ
    taken, what it and the grid cost on the calibration prompts, and what it cost on the run's own questions."""
    lines = [provenance(record, link), "",
             "| budget / token | θ chosen | its cost on the calibration prompts (within margin × budget) | "
             "every θ's cost there | run: n | run's cost / token | within budget | τ | speed vs fastest plain, "
             "paired |", "|---|---|---|---|---|---|---|---|---|"]
    for b in record.figures.get("budgets", []):
        grid = ", ".join(f"{v}: {p['cost']:.3f}" for v, p in b["grid"].items())
        chosen = b["grid"][f"{b['value']:g}"]["cost"]
        speed = "-" if b.get("speed") is None else f"{b['speed']:.2f}× ({b.get('speed_n')}{_how(b)})"
        allowed = b["margin"] * b["per_token"]
        lines.append(f"| {b['metric']} {b['per_token']:g} | {b['value']:g} | {chosen:.3f} (≤ {allowed:.3f}) "
                     f"| {grid} | {b['n']} | {_num(b.get('cost'), 3)} | "
                     f"{'yes' if b.get('cost') is not None and b['cost'] <= b['per_token'] else 'no'} | "
                     f"{_num(b.get('tau'))} | {speed} |")
    for b in record.figures.get("budgets", []):
        for name, m in b.get("beside", {}).items():
            lines += ["", f"In the run of budget {b['per_token']:g}, {name} answered beside {b['method']}, question by "
                      f"question: {_num(m.get('speed'))}× against {_num(b.get('speed'))}× the fastest plain decoding "
                      f"(paired), τ {_num(m.get('tau'))} against {_num(b.get('tau'))} ({m.get('speed_tree')} against "
                      f"{b.get('speed_tree')}), {b['metric']} {_num(m.get('cost'), 3)} against "
                      f"{_num(b.get('cost'), 3)} per token."]
    return lines


@renderer("quality-line")
def quality_line(record: Measurement, link: str) -> list[str]:
    """One sentence from the real pair's main table: MARS θ = 0.9's recovery of strict's score with its paired 95%
    interval, per temperature and benchmark with a score, and whether the interval tells a loss or a gain from
    none."""
    parts = []
    for t, benches in record.figures["temperatures"].items():
        for bench, methods in benches.items():
            m, s = methods.get("mars@0.9") or {}, methods.get("strict") or {}
            if m.get("recovery") is None or m.get("low") is None:
                continue
            told = "a loss" if m["high"] < 1 else "a gain" if m["low"] > 1 else "its interval holds 1"
            parts.append(f"{bench} at T = {t} {m['recovery']:.3f} [{m['low']:.3f}, {m['high']:.3f}] of strict's "
                         f"{m['metric']} over {m['n']} questions ({told}; τ {_num(m.get('tau'))} against strict's "
                         f"{_num(s.get('tau'))} at one tree)")
    return [f"MARS θ = 0.9's quality recovery, paired 95% interval: {'; '.join(parts) or 'none scored yet'}; "
            f"{_where(record)}; recorded {record.date}, commit `{record.commit}` ([record]({link}))."]


@renderer("head-heldout")
def head_heldout(record: Measurement, link: str) -> list[str]:
    """Per draft head: its held-out agreement by draft step (top-1 on greedy answers, sum min(p, q) on T = 1
    answers) and strict greedy's tau at one fixed tree, offline and decoded."""
    lines = [provenance(record, link), "",
             "| head | top-1 by draft step, greedy answers | Σ min(p, q) by step, T = 1 answers | "
             "τ offline / decoded (tree) |", "|---|---|---|---|"]
    for name, h in record.figures["heads"].items():
        steps = " / ".join(f"{x:.3f}" for x in h["t0_top1"])
        mass = " / ".join(f"{x:.3f}" for x in h["t1_sum_min_pq"])
        lines.append(f"| {name} | {steps} | {mass} | {h['offline_tau']:.2f} / "
                     f"{h['online_tau']:.2f} ({h['tree']}) |")
    return lines


@renderer("batch-table")
def batch_table(record: Measurement, link: str) -> list[str]:
    """Per batch size of `experiments/batch_check.py --record`: the fastest plain decoding's throughput, strict's
    and MARS's speedups over it and over our batched vanilla, tau, the tree, strict's rows equal to decoding alone,
    and strict's p90 latency beside the fastest plain decoding's."""
    batches = record.figures["batches"]
    mars = next((m for row in batches.values() for m in row["speedup_vs_fastest_plain"] if m != "strict"), None)
    lines = [provenance(record, link), "", f"{record.figures['prompts']} prompts × {record.figures['max_new_tokens']} "
             "tokens, every method interleaved batch by batch; throughput of whole batches.", "",
             "| B | fastest plain (tok/s) | strict vs it / vs vanilla | "
             f"{mars or 'MARS'} vs it / vs vanilla | τ | tree | strict = alone | p90 latency: strict / plain |",
             "|---|---|---|---|---|---|---|---|"]
    for size, row in batches.items():
        plain, fast, ours = row["fastest_plain"], row["speedup_vs_fastest_plain"], row["speedup_vs_vanilla"]
        p90 = row["latency_p90"]
        lines.append(f"| {size} | {plain['method']} ({plain['tokens_per_s']:.1f}) | {_x(fast.get('strict'))} / "
                     f"{_x(ours.get('strict'))} | {_x(fast.get(mars))} / {_x(ours.get(mars))} | "
                     f"{_num(row.get('tau'))} | {row.get('tree', '-')} | {row.get('identical_to_alone') or '-'} | "
                     f"{p90['strict']:.2f} s / {p90[plain['method']]:.2f} s |")
    return lines


def render(text: str, page: Path, records: list[Measurement]) -> str:
    """`text` (the page at `page`) with every marked block rendered from `records`."""
    def block(match: re.Match) -> str:
        name, kind, *cpu = match.group(2).split()
        if name not in RENDERERS:
            raise ValueError(f"{page}: unknown renderer {name!r} (known: {', '.join(sorted(RENDERERS))})")
        try:
            record = newest(records, kind, cpu[0] if cpu else None)
        except LookupError as error:
            raise LookupError(f"{page}: {error}; make one (python -m eval.reporting.measurements) or remove the "
                              "block") from None
        link = os.path.relpath(record.path, page.parent)
        return match.group(1) + "\n".join(RENDERERS[name](record, link)) + "\n" + match.group(4)
    return BLOCK.sub(block, text)


def pages(root: Path = REPO_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def stale(root: Path = REPO_ROOT, records_root: Path = RECORDS, write: bool = False) -> list[Path]:
    """The pages whose rendered blocks differ from what their records render (rewritten where `write`)."""
    records = load_all(records_root)
    changed = []
    for page in pages(root):
        text = page.read_text()
        rendered = render(text, page, records)
        if rendered != text:
            changed.append(page)
            if write:
                page.write_text(rendered)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail if a page is not rendered")
    args = parser.parse_args(argv)
    changed = stale(write=not args.check)
    for page in changed:
        print(f"{'stale' if args.check else 'rendered'}: {page.relative_to(REPO_ROOT)}")
    if args.check and changed:
        sys.exit("pages differ from their records: run python -m eval.reporting.pages")


if __name__ == "__main__":
    main()
