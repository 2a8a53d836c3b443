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
  by tokens, and the per-question means (quality metrics, per-depth acceptance rates) by questions.
  That is exact for per-question means, an approximation for corpus-level scores (BLEU, chrF) and for
  acceptance rates when shards verified different numbers of positions per question. Ratios are then
  recomputed from the combined figures.
- the same key twice without distinct shard labels is an error, except for the same answers directory
  (a baseline shared by the jobs of a sweep), which counts once.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval.answers import SUMMARY
from eval.config import GENERATE, STRICT, VANILLA, method_spec
from eval.metrics import ratio
from mars.rules.margin import Mars

COSTS = ("tv_per_token", "kl_per_token", "argmax_mismatch", "logprob_regret")  # a relaxation's exact cost (mars.cost)
DASH = "–"
PERCENT_METRICS = {"accuracy", "exact_match", "em", "parse_rate", "parses"}  # fractions, shown in percent (+ pass@k)
FASTEST_PLAIN = "<fastest plain>"  # the plain-decoding method (generate in any precision, vanilla) with most tokens/s
RATIOS = {  # figure: (the method it is relative to, the figure divided)
    "speedup": (VANILLA, "tokens_per_s"),
    "speedup_vs_generate": (GENERATE, "tokens_per_s"),
    "speedup_vs_fastest": (FASTEST_PLAIN, "tokens_per_s"),
    "quality_recovery": (STRICT, "quality"),
    "quality_recovery_vs_vanilla": (VANILLA, "quality"),
}
CSV_COLUMNS = ["model", "bench", "temperature", "method", "theta", "questions", "tokens_per_s", "speedup",
               "speedup_vs_generate", "speedup_vs_fastest", "tau", "relaxed_frac", "quality_metric", "quality",
               "quality_recovery", "quality_recovery_vs_vanilla", *COSTS, "rule", "run_dirs", "derived"]
NUMERIC_COLUMNS = ("tokens_per_s", "speedup", "speedup_vs_generate", "speedup_vs_fastest", "tau", "relaxed_frac",
                   "quality", "quality_recovery", "quality_recovery_vs_vanilla", *COSTS)
SETTING_KEYS = ("model", "bench", "temperature", "top_p", "top_k", "tree", "max_new_tokens", "seed", "dtype",
                "questions", "methods", "shard")


class ReportError(ValueError):
    """Bad input: a missing or malformed summary, or runs that cannot be merged."""


# --- loading ----------------------------------------------------------------------------------

def find_summaries(path: Path, depth: int = 3) -> list[Path]:
    """`path`/summary.json, or else every summary.json up to `depth` levels below `path`
    (<out>/<model>/<bench>/<run dir>/summary.json is three)."""
    if not path.is_dir():
        raise ReportError(f"{path}: not a directory")
    if (path / SUMMARY).exists():
        return [path / SUMMARY]
    found = sorted({f for level in range(1, depth + 1) for f in path.glob("*/" * level + SUMMARY)})
    if not found:
        raise ReportError(f"{path}: no {SUMMARY} in it or up to {depth} levels below")
    return found


def _problem(data: object) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    settings, methods = data.get("settings"), data.get("methods")
    if not isinstance(settings, dict):
        return "no 'settings' object"
    missing = [k for k in ("model", "bench", "temperature") if settings.get(k) is None]
    if missing:
        return f"settings lack {', '.join(missing)}"
    if not isinstance(settings["temperature"], (int, float)):
        return f"settings.temperature is {settings['temperature']!r}, not a number"
    if not isinstance(methods, dict) or not all(isinstance(f, dict) for f in methods.values()):
        return "no 'methods' object mapping each method to its figures"
    return None


def read_summary(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(f"{file}: cannot read: {e}") from e
    problem = _problem(data)
    if problem:
        raise ReportError(f"{file}: malformed summary: {problem}")
    data["run_dir"] = str(file.parent)
    return data


def load_runs(run_dirs: Iterable[str | Path]) -> list[dict]:
    """The summaries under `run_dirs` (each with "run_dir" added), each file once however often it is named."""
    files = {f.resolve(): f for d in run_dirs for f in find_summaries(Path(d))}
    return [read_summary(f) for f in files.values()]


# --- merging ----------------------------------------------------------------------------------

@dataclass
class Entry:
    """One (model, bench, temperature, method) with its figures, merged over the run dirs that hold it."""

    model: str
    bench: str
    temperature: float
    method: str
    fig: dict
    quality_metric: str | None
    run_dirs: list[str]
    derived: set[str] = field(default_factory=set)  # ratios computed against another run dir's baseline
    notes: list[str] = field(default_factory=list)

    @property
    def rule(self) -> dict:
        """The rule and its parameters ({} for plain decoding), as the run recorded them; runs from
        before rules were plugins are read back from the method's name."""
        if "rule" in self.fig:
            return self.fig["rule"]
        if is_plain(self.method):
            return {}
        try:
            spec = method_spec(self.method)
        except ValueError:
            return {}
        return {"name": spec.kind, **spec.rule().params()}

    @property
    def theta(self) -> float | None:
        """MARS's theta (the x axis of theta sweeps), None for other methods."""
        return self.rule.get("theta") if self.rule.get("name") == Mars.name else None

    def value(self, name: str) -> float | None:
        """A numeric figure; "quality" is the headline metric's value. None when absent or not finite."""
        v = (self.fig.get("quality") or {}).get(self.quality_metric) if name == "quality" else self.fig.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def is_plain(method: str) -> bool:
    """Plain decoding: transformers' model.generate (in the run's precision or `generate@<dtype>`) or vanilla."""
    return method == VANILLA or method.partition("@")[0] == GENERATE


def method_order(method: str, theta: float | None = None) -> tuple:
    """generate (each precision), vanilla, strict, then MARS from the strictest θ down, then anything else by name."""
    fixed = {GENERATE: 0, VANILLA: 1, STRICT: 2}
    if method.partition("@")[0] == GENERATE:
        return 0, 0.0, method
    if method in fixed:
        return fixed[method], 0.0, method
    return (3, -theta, method) if theta is not None else (4, 0.0, method)


def _wmean(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    if any(v is None for v in values):
        return None
    if not sum(weights):  # e.g. vanilla's tau, 1.0 over zero cycles
        return values[0] if len(set(values)) == 1 else None
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def combine_shards(figs: Sequence[dict]) -> dict:
    """One method's figures pooled over shards (how each figure pools: the module docstring)."""
    questions = [f.get("questions") or 0 for f in figs]
    tokens = [f.get("tokens") or 0 for f in figs]
    out = {"questions": sum(questions), "tokens": sum(tokens), "seconds": sum(f.get("seconds") or 0 for f in figs)}
    out["tokens_per_s"] = out["tokens"] / out["seconds"] if out["seconds"] else None
    cycles = [f.get("cycles") for f in figs]
    if all(isinstance(c, (int, float)) for c in cycles):
        out["cycles"] = sum(cycles)
    out["tau"] = _wmean([f.get("tau") for f in figs], cycles if "cycles" in out else questions)
    out["relaxed_frac"] = _wmean([f.get("relaxed_frac") for f in figs], tokens)
    for cost in COSTS:  # per emitted token: weighted by tokens (verified positions, up to the prefill's token)
        if any(f.get(cost) is not None for f in figs):
            out[cost] = _wmean([f.get(cost) for f in figs], tokens)
    rates = [f.get("acceptance_rate_by_depth") or {} for f in figs]
    depths = sorted({d for r in rates for d in r}, key=lambda d: (len(d), d))
    out["acceptance_rate_by_depth"] = {d: _wmean([r.get(d) for r in rates], questions) for d in depths}
    scores = [f.get("quality") or {} for f in figs]
    quality = {k: _wmean([s.get(k) for s in scores], questions) for k in {k for s in scores for k in s}}
    if any(v is not None for v in quality.values()):
        out["quality"] = {k: v for k, v in sorted(quality.items()) if v is not None}
    hists = [f.get("margin_histogram") for f in figs]
    if all(hists) and all(h.get("edges") == hists[0].get("edges") for h in hists):
        counts = [sum(c) for c in zip(*(h["counts"] for h in hists), strict=True)]
        out["margin_histogram"] = {**hists[0], "counts": counts}
    return out


def _combine(key: tuple, items: list[tuple[dict, dict]]) -> Entry:
    dirs = [run["run_dir"] for run, _ in items]
    metric = next((run["quality_metric"] for run, _ in items if run.get("quality_metric")), None)
    entry = Entry(*key, fig=dict(items[0][1]), quality_metric=metric, run_dirs=dirs)
    if len(items) == 1:
        return entry
    shards = [run["settings"].get("shard") for run, _ in items]
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if shards[i] is None or shards[i] == shards[j]:
                raise ReportError(f"model {key[0]}, bench {key[1]}, T={key[2]:g}, method {key[3]} is in both "
                                  f"{dirs[i]} and {dirs[j]}, which are not distinct shards; pass only one of them")
    totals = {str(s).partition("/")[2] for s in shards}
    if len(totals) > 1:
        raise ReportError(f"shards {shards} of {key} in {dirs} disagree on the number of shards")
    total = totals.pop()
    if total.isdigit() and int(total) != len(shards):
        entry.notes.append(f"{len(shards)} of {total} shards present ({', '.join(map(str, shards))})")
    entry.fig = combine_shards([fig for _, fig in items])
    return entry


def _fill_ratios(entries: list[Entry]) -> None:
    groups: dict[tuple, dict[str, Entry]] = defaultdict(dict)
    for e in entries:
        groups[e.model, e.bench, e.temperature][e.method] = e
    for e in entries:
        group = groups[e.model, e.bench, e.temperature]
        for name, (reference, figure) in RATIOS.items():
            if reference == FASTEST_PLAIN:
                timed = [p for p in group.values() if is_plain(p.method) and p.value(figure) is not None]
                reference = max(timed, key=lambda p: p.value(figure)).method if timed else reference
            ref = group.get(reference)
            num, den = e.value(figure), ref.value(figure) if ref else None
            if e.method == reference:
                if num is not None:
                    e.fig[name] = 1.0  # the baseline's own row, as in the paper's tables
            elif num is not None and den:
                if set(ref.run_dirs) == set(e.run_dirs):
                    e.fig[name] = ratio(num, den)  # same run(s): exact, and the only way for combined shards
                elif e.value(name) is None:
                    e.fig[name] = ratio(num, den)
                    e.derived.add(name)


def merge_runs(runs: Sequence[dict]) -> list[Entry]:
    """Entries of all runs, ordered by model, temperature, bench, method (see the module docstring)."""
    parts: dict[tuple, dict[str, tuple[dict, dict]]] = defaultdict(dict)
    for run in runs:
        s = run["settings"]
        for method, fig in run["methods"].items():
            # Jobs of a sweep share their baselines' run directories: each answers directory counts once
            # (from the summary that covers most of its questions).
            answers = str(fig.get("run_dir") or f"{run['run_dir']}#{method}")
            key = str(s["model"]), str(s["bench"]), float(s["temperature"]), method
            seen = parts[key].get(answers)
            if seen is None or (fig.get("questions") or 0) > (seen[1].get("questions") or 0):
                parts[key][answers] = (run, fig)
    entries = [_combine(key, list(items.values())) for key, items in parts.items()]
    _fill_ratios(entries)
    return sorted(entries, key=lambda e: (e.model, e.temperature, e.bench, method_order(e.method, e.theta)))


# --- tables -----------------------------------------------------------------------------------

def format_quality(value: float | None, metric: str | None) -> str:
    """Fractions (pass@k, accuracy, exact match, parse rate) in percent; BLEU, chrF, ROUGE, judge scores raw."""
    if value is None:
        return DASH
    if metric and (metric in PERCENT_METRICS or metric.startswith("pass@")):
        return f"{100 * value:.1f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


def _fmt(e: Entry, name: str, suffix: str = "") -> str:
    v = e.value(name)
    return DASH if v is None else f"{v:.2f}{suffix}" + ("*" if name in e.derived else "")


def cell(e: Entry | None) -> str:
    """`speedup× / τ / quality (recovery)`, `–` for each missing figure."""
    if e is None:
        return DASH
    quality = format_quality(e.value("quality"), e.quality_metric)
    return f"{_fmt(e, 'speedup', '×')} / {_fmt(e, 'tau')} / {quality} ({_fmt(e, 'quality_recovery')})"


def generate_cell(e: Entry | None) -> str:
    return DASH if e is None else _fmt(e, "speedup_vs_generate", "×")


def fastest_cell(e: Entry | None) -> str:
    return DASH if e is None else _fmt(e, "speedup_vs_fastest", "×")


def cost_cell(e: Entry | None) -> str:
    """The relaxation's exact cost per token: `TV / KL` when sampling, `mismatch / regret` when greedy."""
    if e is None:
        return DASH
    pair = ("argmax_mismatch", "logprob_regret") if e.temperature == 0 else ("tv_per_token", "kl_per_token")
    values = [e.value(k) for k in pair]
    return DASH if all(v is None for v in values) else " / ".join(DASH if v is None else f"{v:.4f}" for v in values)


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


def _setting(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return DASH if value is None else str(value)


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


def report_markdown(runs: Sequence[dict], entries: Sequence[Entry], plots: Sequence[str]) -> str:
    machines = sorted({str(r.get("machine", "unknown")) for r in runs})
    keys = [k for k in SETTING_KEYS if any(k in r["settings"] for r in runs)]
    values = {k: {_setting(r["settings"].get(k)) for r in runs} for k in keys}
    common = [k for k in keys if len(values[k]) == 1]  # stated once; the rest per run dir
    varying = [k for k in keys if k not in common]
    parts = ["# Evaluation report", "", f"Machine: {'; '.join(machines)}", "",
             "Settings of every run: " + "; ".join(f"{k} = {next(iter(values[k]))}" for k in common), "",
             markdown_table(["run dir", *varying],
                            [[r["run_dir"], *(_setting(r["settings"].get(k)) for k in varying)] for r in runs])]
    for t in sorted({e.temperature for e in entries}):
        parts += ["", f"## Temperature {t:g}", "", "Each cell: speedup× / τ / quality (recovery).", "",
                  markdown_table(*table(entries, t))]
        for render, title in ((generate_cell, "Speedup over transformers' model.generate in the run's precision"),
                              (fastest_cell, "Speedup over the fastest plain decoding timed in the run"),
                              (cost_cell, "Exact cost of the relaxation per emitted token (mars/cost.py): "
                                          + ("argmax mismatch / log-prob regret" if t == 0 else "TV / KL"))):
            header, rows = table(entries, t, render)
            rows = [row for row in rows if any(c != DASH for c in row[2:])]  # only models that ran the baseline
            if rows:
                parts += ["", f"{title}, temperature {t:g}:", "", markdown_table(header, rows)]
    parts += category_tables(entries)
    parts += ["", "## Legend", "",
              "- **speedup**: tokens/s over our vanilla decoding (same adapter and cache) in the same run.",
              "- **speedup vs generate**: tokens/s over transformers' `model.generate` in the same run and precision.",
              "- **speedup vs fastest**: tokens/s over the fastest plain decoding timed in the same run "
              "(`model.generate` in every precision timed, e.g. `generate@bfloat16`, and vanilla).",
              "- **τ**: tokens emitted per draft–verify cycle (the prefill's first token is in no cycle).",
              "- **quality**: the benchmark's headline metric (named in the column header); pass@1, accuracy "
              "and exact match in percent, BLEU / chrF / ROUGE raw.",
              "- **recovery**: quality / strict's quality on the same benchmark (1.00 = no loss).",
              "- `*`: computed against the baseline (vanilla or strict) from another run dir, i.e. a separate "
              "job: not interleaved question by question, so machine drift is not controlled.",
              "- `–`: figure not available."]
    notes = [f"- {e.model} / {e.bench} / T={e.temperature:g} / {e.method}: {n}" for e in entries for n in e.notes]
    if notes:
        parts += ["", "## Notes", "", *notes]
    parts += ["", "## Plots", "", *(f"- [{p}]({p})" for p in plots)]
    return "\n".join(parts) + "\n"


def write_csv(entries: Sequence[Entry], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for e in entries:
            row = {**{c: e.value(c) for c in NUMERIC_COLUMNS}, "model": e.model, "bench": e.bench,
                   "temperature": e.temperature, "method": e.method,
                   "theta": e.theta, "questions": e.fig.get("questions"), "quality_metric": e.quality_metric,
                   "rule": json.dumps(e.rule, sort_keys=True) if e.rule else None,
                   "run_dirs": ";".join(e.run_dirs), "derived": ";".join(sorted(e.derived))}
            writer.writerow(["" if row.get(c) is None else row[c] for c in CSV_COLUMNS])


# --- plots ------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def _slug(*parts: object) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def _colors(entries: Iterable[Entry]) -> dict[str, object]:
    """One colour per method across every plot: baselines fixed, MARS along a colormap by θ."""
    plt = _pyplot()
    fixed = {GENERATE: "tab:brown", VANILLA: "tab:gray", STRICT: "black"}
    methods = sorted({(method_order(e.method, e.theta), e.method) for e in entries})
    mars = [m for o, m in methods if o[0] == 3]
    others = [m for o, m in methods if o[0] != 3 and m not in fixed]  # e.g. generate@bfloat16, other rules
    colors = {m: plt.cm.viridis(0.1 + 0.65 * i / max(1, len(mars) - 1)) for i, m in enumerate(mars)}
    colors.update({m: plt.cm.tab10(3 + i % 7) for i, m in enumerate(others)})
    return {**colors, **fixed}


def _save(fig, out: Path, name: str, written: list[str]) -> None:
    fig.savefig(out / name, dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    written.append(name)


def _methods(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: method_order(e.method, e.theta))


def plot_by_bench(entries: list[Entry], figure: str, title: str, ylabel: str, out: Path, name: str,
                  written: list[str], colors: dict) -> None:
    """Grouped bars, benchmark on x, one bar per method; one panel per model × temperature."""
    plt = _pyplot()
    groups = sorted({(e.model, e.temperature) for e in entries})
    benches = sorted({e.bench for e in entries})
    fig, axes = plt.subplots(len(groups), 1, figsize=(3 + 2.2 * len(benches), 3.4 * len(groups)), squeeze=False)
    for ax, (model, t) in zip(axes[:, 0], groups, strict=True):
        sub = [e for e in entries if (e.model, e.temperature) == (model, t) and e.value(figure) is not None]
        methods = list(dict.fromkeys(e.method for e in _methods(sub)))
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            mine = [e for e in sub if e.method == method]
            xs = [benches.index(e.bench) + (i - (len(methods) - 1) / 2) * width for e in mine]
            bars = ax.bar(xs, [e.value(figure) for e in mine], width, label=method, color=colors[method])
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(benches)), benches)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model}, temperature {t:g}")
        ax.margins(y=0.12)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), title="method")
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, out, name, written)


def plot_group(group: list[Entry], out: Path, written: list[str], colors: dict) -> None:
    """Margin histograms, per-depth acceptance and (with MARS) the θ sweep of one model × bench × temperature."""
    plt = _pyplot()
    e0 = group[0]
    where = f"{e0.model}, {e0.bench}, temperature {e0.temperature:g}"
    tag = f"{_slug(e0.model, e0.bench)}_T{e0.temperature:g}"
    hists = [e for e in group if sum((e.fig.get("margin_histogram") or {}).get("counts") or []) > 0]
    if hists:  # one panel per method on a shared x axis: overlaid histograms of similar shape are unreadable
        fig, axes = plt.subplots(len(hists), 1, sharex=True, squeeze=False, figsize=(8, 1 + 1.5 * len(hists)))
        for ax, e in zip(axes[:, 0], hists, strict=True):
            h = e.fig["margin_histogram"]
            ax.stairs([c / sum(h["counts"]) for c in h["counts"]], h["edges"], fill=True, alpha=0.75,
                      color=colors[e.method], label=e.method)
            if e.theta is not None:
                ax.axvline(e.theta, color="crimson", ls="--", lw=1.3, label=f"θ = {e.theta:g}")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        metric = hists[0].fig["margin_histogram"].get("metric", "?")
        axes[-1, 0].set_xlabel(f"margin at verified position ({metric})")
        fig.supylabel("share of verified positions", fontsize=10)
        fig.suptitle(f"Verification margins — {where}")
        fig.tight_layout()
        _save(fig, out, f"margins_{tag}.png", written)
    accept = [e for e in group if e.fig.get("acceptance_rate_by_depth")]
    if accept:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for e in accept:
            rates = sorted((int(d), r) for d, r in e.fig["acceptance_rate_by_depth"].items() if r is not None)
            ax.plot(*zip(*rates, strict=True), marker="o", label=e.method, color=colors[e.method])
        ax.set(xlabel="draft depth (0 = first drafted token)", ylabel="acceptance rate", ylim=(0, 1.05),
               title=f"Acceptance by draft depth — {where}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        _save(fig, out, f"acceptance_by_depth_{tag}.png", written)
    mars = sorted((e for e in group if e.theta is not None), key=lambda e: e.theta)
    if mars:
        strict = next((e for e in group if e.method == STRICT), None)
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        panels = [("speedup", "speedup over vanilla (×)"), ("tau", "τ (tokens per cycle)"),
                  ("quality_recovery", "quality recovery (÷ strict)")]
        for ax, (figure, label) in zip(axes, panels, strict=True):
            points = [(e.theta, e.value(figure)) for e in mars if e.value(figure) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", color="tab:green", label="MARS")
            if strict and strict.value(figure) is not None:
                ax.axhline(strict.value(figure), color="black", ls="--", lw=1, label=STRICT)
            if not points:
                ax.text(0.5, 0.5, "not available", ha="center", va="center", transform=ax.transAxes)
            ax.set(xlabel="θ (MARS margin threshold)", ylabel=label, title=label)
            ax.legend(fontsize=8)
        fig.suptitle(f"MARS θ sweep — {where}")
        fig.tight_layout()
        _save(fig, out, f"theta_{tag}.png", written)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point matches or beats on both axes (higher is better), by increasing x."""
    return sorted({p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)})


def plot_pareto(entries: list[Entry], out: Path, written: list[str], colors: dict) -> None:
    """Speed vs quality recovery (raw quality when no recovery exists), one point per method × bench:
    colour = method (as in every plot), marker = bench; each bench's Pareto front ringed and connected."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    y_name = "quality_recovery" if any(e.value("quality_recovery") is not None for e in entries) else "quality"
    points = [e for e in entries if e.value("speedup") is not None and e.value(y_name) is not None]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    handles = [Line2D([], [], ls="", marker="o", color=colors[m], label=m)
               for m in dict.fromkeys(e.method for e in _methods(points))]
    for i, bench in enumerate(sorted({e.bench for e in points})):
        mine = [e for e in points if e.bench == bench]
        xy = [(e.value("speedup"), e.value(y_name)) for e in mine]
        marker, style = "osD^v<>"[i % 7], ["-", "--", ":", "-."][i % 4]
        ax.scatter(*zip(*xy, strict=True), c=[colors[e.method] for e in mine], marker=marker, s=55, zorder=3)
        front = pareto_front(xy)
        ax.plot(*zip(*front, strict=True), color="black", ls=style, lw=1.2, zorder=2)
        ax.scatter(*zip(*front, strict=True), marker=marker, s=190, facecolors="none", edgecolors="black", zorder=2)
        handles.append(Line2D([], [], color="black", ls=style, marker=marker, mfc="none", label=f"{bench}: front"))
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    if y_name == "quality_recovery":
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")  # strict's quality
    ax.margins(x=0.08, y=0.08)
    ax.set(xlabel="speedup over vanilla (×)",
           ylabel="quality recovery (÷ strict)" if y_name == "quality_recovery" else "quality (headline metric, raw)",
           title=f"Speed–quality trade-off — {entries[0].model}, temperature {entries[0].temperature:g}")
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    _save(fig, out, f"pareto_{_slug(entries[0].model)}_T{entries[0].temperature:g}.png", written)


def write_plots(entries: list[Entry], out: Path) -> list[str]:
    """Every plot into `out`; returns the file names written."""
    written: list[str] = []
    colors = _colors(entries)
    plot_by_bench(entries, "speedup", "Speedup over vanilla decoding (tokens/s ratio)", "speedup (×)", out,
                  "speedup_by_bench.png", written, colors)
    plot_by_bench(entries, "tau", "Mean accepted length τ", "τ (tokens per draft–verify cycle)", out,
                  "tau_by_bench.png", written, colors)
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.model, e.bench, e.temperature].append(e)
    for group in groups.values():
        plot_group(group, out, written, colors)
    for model, t in sorted({(e.model, e.temperature) for e in entries}):
        plot_pareto([e for e in entries if (e.model, e.temperature) == (model, t)], out, written, colors)
    return written


# --- command line -----------------------------------------------------------------------------

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
