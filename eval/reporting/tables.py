"""The report's tables: the paper's layout per temperature, exact costs, per-category figures
(Spec-Bench), report.md and report.csv.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from eval.reporting.summaries import COSTS, SETTING_KEYS, Entry, method_order

DASH = "–"
BOUND = "≤"  # before a cost the run reported as an upper bound (sampled drafts: mars.accounting.cost.sampling_cost)
PERCENT_METRICS = {"accuracy", "exact_match", "em", "parse_rate", "parses"}  # fractions, shown in percent (+ pass@k)
CSV_COLUMNS = ["model", "bench", "temperature", "method", "theta", "questions", "tokens_per_s", "speedup",
               "speedup_vs_generate", "speedup_vs_fastest", "speedup_vs_fastest_paired", "speedup_vs_fastest_paired_n",
               "predicted_speedup_vs_fastest", "speculation", "tau",
               "relaxed_frac", "quality_metric", "quality", "quality_recovery", "quality_recovery_vs_vanilla", *COSTS,
               "rule", "run_dirs", "derived"]
NUMERIC_COLUMNS = ("tokens_per_s", "speedup", "speedup_vs_generate", "speedup_vs_fastest",
                   "speedup_vs_fastest_paired", "predicted_speedup_vs_fastest", "tau", "relaxed_frac", "quality",
                   "quality_recovery", "quality_recovery_vs_vanilla", *COSTS)


def format_quality(value: float | None, metric: str | None) -> str:
    """Fractions (pass@k, accuracy, exact match, parse rate) in percent; BLEU, chrF, ROUGE, judge scores raw."""
    if value is None:
        return DASH
    if metric and (metric in PERCENT_METRICS or metric.startswith("pass@")):
        return f"{100 * value:.1f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


CONTENDED = "†"  # after a speed figure timed while another process of ours computed (eval.runner.locks)
SPEED_FIGURES = ("tokens_per_s", "speedup", "speedup_vs_generate", "speedup_vs_fastest", "speedup_vs_fastest_paired")
TOTAL = " (total)"  # after a speedup over the fastest plain decoding that is the total ratio, not the paired figure


def _fmt(e: Entry, name: str, suffix: str = "") -> str:
    v = e.value(name)
    if v is None:
        return DASH
    contended = CONTENDED if name in SPEED_FIGURES and e.fig.get("speed_contended") else ""
    return f"{v:.2f}{suffix}" + ("*" if name in e.derived else "") + contended


def cell(e: Entry | None) -> str:
    """`speedup× / τ / quality (recovery)`, `–` for each missing figure."""
    if e is None:
        return DASH
    quality = format_quality(e.value("quality"), e.quality_metric)
    return f"{_fmt(e, 'speedup', '×')} / {_fmt(e, 'tau')} / {quality} ({_fmt(e, 'quality_recovery')})"


def recovery_cell(e: Entry | None) -> str:
    """What a quality recovery rests on (`eval.scoring.recovery`): `recovery [low, high] k/n` (k of the n
    paired questions scored above zero by either method), why it is undefined (strict scored zero), then
    `agree A%` (ROUGE-L of the answers against strict's) and `ll L` (the target's mean log-likelihood per
    token of the method's answers), each where the run measured it."""
    if e is None:
        return DASH
    ci, parts = e.fig.get("quality_recovery_ci"), []
    if ci and ci.get("undefined"):
        parts.append(f"none: {ci['undefined']}")
    elif ci and ci.get("recovery") is not None:
        low, high = ci.get("low"), ci.get("high")
        interval = f"[{low:.2f}, {high:.2f}]" if low is not None and high is not None else "[interval unknown]"
        parts.append(f"{ci['recovery']:.2f} {interval} {ci['nonzero']}/{ci['n']}")
    agree = (e.fig.get("agreement_vs_strict") or {}).get("rougeL_vs_strict")
    if agree is not None:
        parts.append(f"agree {agree:.0f}")
    if e.value("loglik") is not None:
        parts.append(f"ll {e.value('loglik'):.3f}")
    return " · ".join(parts) or DASH


def generate_cell(e: Entry | None) -> str:
    return DASH if e is None else _fmt(e, "speedup_vs_generate", "×")


def fastest_cell(e: Entry | None) -> str:
    """The speedup over the fastest plain decoding, paired per question (`speedup_vs_fastest_paired`: bursts
    of background load move it less than the total ratio); where the run could not pair the questions (shards
    pooled, the baseline in another run dir, a summary from before the paired figure), the ratio of total
    tokens/s marked `TOTAL`, so that the two are never read as one."""
    if e is None:
        return DASH
    if e.value("speedup_vs_fastest_paired") is not None:
        return _fmt(e, "speedup_vs_fastest_paired", "×")
    total = _fmt(e, "speedup_vs_fastest", "×")
    return total if total == DASH else total + TOTAL


def speculation_rows(entries: Sequence[Entry]) -> list[list[str]]:
    """One row per rule method whose run recorded its speculation (`eval.runner.job.speculation_figures`):
    model, bench, T, method, tree, on / off / forced, calibration's predicted speedup over the fastest
    plain decoding, the run's measured one."""
    rows = []
    for e in entries:
        if e.fig.get("speculation") is None:
            continue
        rows.append([e.model, e.bench, f"{e.temperature:g}", e.method, str(e.fig.get("tree") or DASH),
                     str(e.fig["speculation"]), _fmt(e, "predicted_speedup_vs_fastest", "×"),
                     _fmt(e, "speedup_vs_fastest", "×")])
    return rows


def speculation_section(entries: Sequence[Entry]) -> list[str]:
    """The report's section on speculation: where each rule method speculated, and calibration's prediction
    beside the speed the run measured (both over the fastest plain decoding)."""
    rows = speculation_rows(entries)
    if not rows:
        return []
    reasons = sorted({f"- {e.method}: {e.fig['speculation_reason']}" for e in entries
                      if e.fig.get("speculation_reason") and e.fig.get("speculation") != "on"})
    return ["", "## Speculation: calibration's prediction and the run", "",
            "speculation: on (the best tree beat the fastest plain decoding in calibration), off (it did not: "
            "the method decoded plainly with our vanilla, τ 1, or took the run's vanilla answers, the same "
            "decoding) or forced (a tree set explicitly always "
            "speculates). predicted: calibration's speed of what the method ran over the fastest plain decoding "
            "timed there; measured: the run's speedup over the fastest plain decoding timed in it.", "",
            markdown_table(["model", "bench", "T", "method", "tree", "speculation", "predicted", "measured"], rows),
            *([""] + reasons if reasons else [])]


def cost_bounded(e: Entry) -> bool:
    """Whether the run reported `e`'s TV and KL per token as upper bounds, not exact (sampled drafts)."""
    bound = e.fig.get("cost_bound_tokens")
    return isinstance(bound, (int, float)) and bound > 0


def infinite_kl_tokens(fig: dict) -> int:
    """Emitted tokens whose KL the run found infinite (`kl_infinite_tokens`), left out of `kl_per_token`."""
    count = fig.get("kl_infinite_tokens")
    return int(count) if isinstance(count, (int, float)) and not isinstance(count, bool) else 0


def with_infinite_kl(text: str, fig: dict) -> str:
    """A KL-per-token cell followed by `(+∞ on N tokens)` when N > 0 of the run's tokens had an infinite
    KL. `kl_per_token` is the mean over the finite ones only (`mars.accounting.stats.VerifyStats.cost`): with N > 0
    the KL per token is +∞, and the figure alone would be neither it nor, on sampled drafts (where the
    per-draw bound is +∞ wherever a draw leaves strict's support), an upper bound on it."""
    count = infinite_kl_tokens(fig)
    return f"{text} (+∞ on {count} tokens)" if count else text


def cost_cell(e: Entry | None) -> str:
    """The relaxation's cost per token: `TV / KL` when sampling, `mismatch / regret` when greedy; exact,
    or an upper bound marked `≤` (`≤ TV / ≤ KL`) where the run says so (`cost_bound_tokens` > 0); the KL
    followed by `(+∞ on N tokens)` where N tokens' KL is infinite (`with_infinite_kl`)."""
    if e is None:
        return DASH
    pair = ("argmax_mismatch", "logprob_regret") if e.temperature == 0 else ("tv_per_token", "kl_per_token")
    values = [e.value(k) for k in pair]
    if all(v is None for v in values) and not (e.temperature != 0 and infinite_kl_tokens(e.fig)):
        return DASH
    mark = f"{BOUND} " if e.temperature != 0 and cost_bounded(e) else ""
    cells = [DASH if v is None else f"{mark}{v:.4f}" for v in values]
    if e.temperature != 0:
        cells[1] = with_infinite_kl(cells[1], e.fig)
    return " / ".join(cells)


def table(entries: Sequence[Entry], temperature: float,
          render: Callable[[Entry | None], str] = cell) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one temperature's table: rows model × method, one column per benchmark."""
    sub = [e for e in entries if e.temperature == temperature]
    benches = sorted({e.bench for e in sub})
    metric = {b: next((e.quality_metric for e in sub if e.bench == b and e.quality_metric), None) for b in benches}
    header = ["model", "method"] + [f"{b} ({metric[b]})" if metric[b] and render is cell else b for b in benches]
    found = {(e.model, e.method, e.bench): e for e in sub}
    order = {(e.model, e.method): method_order(e.method, e.theta) for e in sub}
    rows = sorted(order, key=lambda row: (row[0], order[row]))
    return header, [[m, meth] + [render(found.get((m, meth, b))) for b in benches] for m, meth in rows]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


# The settings the report states: the summaries' keys, and the drafting mode ("topk" / "sample") after the tree.
REPORT_SETTINGS = tuple(k for key in SETTING_KEYS for k in ((key, "drafting") if key == "tree" else (key,)))


def _setting(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return DASH if value is None else str(value)


def drafting_of(run: dict) -> str:
    """A run's drafting mode ("topk" or "sample"): its resolved `settings.drafting`, else its tree's; "topk"
    for greedy runs (always top-k) and for summaries from before sampled drafting (which drafted top-k)."""
    s = run["settings"]
    if not float(s["temperature"]) > 0:
        return "topk"
    tree = s.get("tree") if isinstance(s.get("tree"), dict) else {}
    return str(s.get("drafting") or tree.get("drafting") or "topk")


def run_setting(run: dict, key: str, show: Callable[[object], str] = _setting) -> str:
    """One setting of a run as a report states it (`show` formats the value); the drafting mode with the
    run's reason for it."""
    if key != "drafting":
        return show(run["settings"].get(key))
    reason = run["settings"].get("drafting_reason")
    return drafting_of(run) + (f" — {reason}" if reason else "")


def category_tables(entries: Sequence[Entry]) -> list[str]:
    """Spec-Bench's leaderboard layout for runs with per-category figures: per model x bench x temperature,
    rows methods, columns question categories, cells speedup over vanilla / over the fastest plain
    decoding / tau."""
    parts: list[str] = []
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.fig.get("by_category"):
            groups[(e.model, e.bench, e.temperature)].append(e)
    for (model, bench, t), group in sorted(groups.items()):
        categories = list(dict.fromkeys(c for e in group for c in e.fig["by_category"]))

        def cell(fig: dict | None) -> str:
            if not fig:
                return DASH
            parts_ = [f"{fig[k]:.2f}×" if isinstance(fig.get(k), (int, float)) else DASH
                      for k in ("speedup", "speedup_vs_fastest")]
            return " / ".join([*parts_, f"{fig['tau']:.2f}" if isinstance(fig.get("tau"), (int, float)) else DASH])

        rows = [[e.method, *(cell(e.fig["by_category"].get(c)) for c in categories)]
                for e in sorted(group, key=lambda e: method_order(e.method, e.theta))]
        parts += ["", f"## Per category: {model}, {bench}, temperature {t:g}", "",
                  "Each cell: speedup over vanilla× / over the fastest plain decoding× / τ.", "",
                  markdown_table(["method", *categories], rows)]
    return parts


FASTEST_TITLE = ("Speedup over the fastest plain decoding timed in the run, paired per question (20% trimmed "
                 "geometric mean of the per-question tokens/s ratios; `(total)`: ratio of total tokens/s)")


def report_markdown(runs: Sequence[dict], entries: Sequence[Entry], plots: Sequence[str]) -> str:
    """The report: the runs' settings, per temperature its tables, the speculation and per-category sections, the
    legend, the runs' notes and the plots."""
    parts = _settings_section(runs)
    for t in sorted({e.temperature for e in entries}):
        parts += _temperature_section(entries, t)
    parts += speculation_section(entries)
    parts += category_tables(entries)
    parts += ["", "## Legend", "", *LEGEND]
    notes = [f"- {e.model} / {e.bench} / T={e.temperature:g} / {e.method}: {n}" for e in entries for n in e.notes]
    if notes:
        parts += ["", "## Notes", "", *notes]
    parts += ["", "## Plots", "", *(f"- [{p}]({p})" for p in plots)]
    return "\n".join(parts) + "\n"


def _settings_section(runs: Sequence[dict]) -> list[str]:
    """The report's head: the machines, the settings every run shares stated once, the others per run dir."""
    machines = sorted({str(r.get("machine", "unknown")) for r in runs})
    keys = [k for k in REPORT_SETTINGS if any(k in r["settings"] for r in runs)]
    values = {k: {run_setting(r, k) for r in runs} for k in keys}
    common = [k for k in keys if len(values[k]) == 1]  # stated once; the rest per run dir
    varying = [k for k in keys if k not in common]
    return ["# Evaluation report", "", f"Machine: {'; '.join(machines)}", "",
            "Settings of every run: " + "; ".join(f"{k} = {next(iter(values[k]))}" for k in common), "",
            markdown_table(["run dir", *varying],
                           [[r["run_dir"], *(run_setting(r, k) for k in varying)] for r in runs])]


def _temperature_section(entries: Sequence[Entry], t: float) -> list[str]:
    """One temperature's tables: the main one, then speed against each baseline, quality recovery and the
    relaxation's cost, each only with the models that ran its baseline."""
    parts = ["", f"## Temperature {t:g}", "", "Each cell: speedup× / τ / quality (recovery).", "",
             markdown_table(*table(entries, t))]
    bounded = any(cost_bounded(e) for e in entries if e.temperature == t)
    cost_title = ("Exact cost of the relaxation per emitted token (mars/accounting/cost.py): " if not bounded else
                  f"Cost of the relaxation per emitted token (mars/accounting/cost.py; {BOUND}: an upper bound): ")
    for render, title in ((generate_cell, "Speedup over transformers' model.generate in the run's precision"),
                          (fastest_cell, FASTEST_TITLE),
                          (recovery_cell, "Quality recovery against strict with its 95% bootstrap interval and "
                           "the questions it rests on (nonzero / paired); agreement with strict's answers "
                           "(ROUGE-L); the target's mean log-likelihood per answer token"),
                          (cost_cell, cost_title + ("argmax mismatch / log-prob regret" if t == 0 else "TV / KL"))):
        header, rows = table(entries, t, render)
        rows = [row for row in rows if any(c != DASH for c in row[2:])]  # only models that ran the baseline
        if rows:
            parts += ["", f"{title}, temperature {t:g}:", "", markdown_table(header, rows)]
        if rows and render is cost_cell and bounded:
            parts += ["", f"{BOUND}: an upper bound on the cost, not the exact cost: on sampled drafts the "
                      "distribution emitted on average over the draws has no closed form, and its distance "
                      "from p is at most the average of each draw's (TV and KL are jointly convex; "
                      "`mars.accounting.cost.sampling_cost`), which is the figure given (the method's "
                      "`cost_bound_tokens` > 0)."]
        if rows and render is cost_cell and any(infinite_kl_tokens(e.fig) for e in entries if e.temperature == t):
            parts += ["", "(+∞ on N tokens): N emitted tokens had an infinite KL (on sampled drafts, each "
                      "draw's bound is +∞ wherever the draw lets the rule emit a token strict's given-the-draw "
                      "distribution excludes); the KL shown is the mean over the other tokens only, so the KL "
                      "per token (or its bound) is +∞ and the figure shown is not a bound on it."]
    return parts


# The report's legend: what each figure and mark means.
LEGEND = [
    "- **speedup**: tokens/s over our vanilla decoding (same adapter and cache) in the same run.",
    "- **speedup vs generate**: tokens/s over transformers' `model.generate` in the same run and precision.",
    "- **speedup vs fastest**: tokens/s over the fastest plain decoding timed in the same run "
    "(`model.generate` in every precision timed, e.g. `generate@bfloat16`, and vanilla). In its own "
    "table, paired per question: on every question both answered, the method's tokens/s over the "
    "fastest plain decoding's on that question; the log ratios' 20% trimmed mean (a fifth of the "
    "questions dropped at each end, none under 5 questions), exponentiated "
    "(`speedup_vs_fastest_paired`), so that a burst of background load on a few answers does not move "
    "it; `(total)` where the run could not pair (shards pooled, the baseline from another run dir, an "
    "older summary): the ratio of total tokens/s, which report.csv holds for every method "
    "(`speedup_vs_fastest`).",
    "- **predicted** (Speculation section): calibration's tokens/s of what a rule method ran (its tree, "
    "or plain decoding where its speculation was off) over the fastest plain decoding timed in "
    "calibration, beside the run's measured speedup vs fastest.",
    "- **τ**: tokens emitted per draft–verify cycle (the prefill's first token is in no cycle).",
    "- **quality**: the benchmark's headline metric (named in the column header); pass@1, accuracy "
    "and exact match in percent, BLEU / chrF / ROUGE raw.",
    "- **recovery**: quality / strict's quality on the same benchmark (1.00 = no loss). In its own table: "
    "`r [low, high] k/n`, a paired percentile bootstrap interval over the n questions both answered, k "
    "of which either method scored above zero (what a 0/1 metric rests on); `none: strict scores 0 ...` "
    "where strict solved nothing (no ratio, not 0/0); `agree`: ROUGE-L of the answers against "
    "strict's (at T=0 strict's are plain decoding's; at T>0 read a relaxed method's against vanilla's, "
    "two lossless samples); `ll`: the target's mean log-likelihood per token of the answers "
    "(`eval.scoring.recovery`).",
    "- `*`: computed against the baseline (vanilla or strict) from another run dir, i.e. a separate "
    "job: not interleaved question by question, so machine drift is not controlled.",
    f"- `{CONTENDED}`: timed while another process of ours computed (contended_questions > 0 for the "
    "method or the baseline it is divided by; `exclusive_timing=false`, or work outside the timing "
    "lock): not a figure to quote.",
    "- `–`: figure not available.",
]


def write_csv(entries: Sequence[Entry], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for e in entries:
            row = {**{c: e.value(c) for c in NUMERIC_COLUMNS}, "model": e.model, "bench": e.bench,
                   "temperature": e.temperature, "method": e.method,
                   "theta": e.theta, "questions": e.fig.get("questions"), "quality_metric": e.quality_metric,
                   "speculation": e.fig.get("speculation"),
                   "speedup_vs_fastest_paired_n": e.fig.get("speedup_vs_fastest_paired_n"),
                   "rule": json.dumps(e.rule, sort_keys=True) if e.rule else None,
                   "run_dirs": ";".join(e.run_dirs), "derived": ";".join(sorted(e.derived))}
            writer.writerow(["" if row.get(c) is None else row[c] for c in CSV_COLUMNS])
