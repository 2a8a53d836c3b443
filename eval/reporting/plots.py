"""The report's plots: speedup, τ and quality per benchmark, speed against quality, and throughput
and speedup against the batch size where runs decoded at several (matplotlib).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from eval.config.methods import GENERATE, STRICT, VANILLA
from eval.reporting.summaries import Entry, batch_of, method_order


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (imported when a plot is drawn: matplotlib is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def _slug(*parts: object) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def _colors(entries: Iterable[Entry]) -> dict[str, object]:
    """One colour per method across every plot: baselines fixed, MARS along a colormap by θ."""
    plt = pyplot()
    fixed = {GENERATE: "tab:brown", VANILLA: "tab:gray", STRICT: "black"}
    methods = sorted({(method_order(e.method, e.theta), e.method, e.theta is not None) for e in entries})
    mars = [m for _, m, is_mars in methods if is_mars]  # on either drafting mode
    others = [m for _, m, is_mars in methods if not is_mars and m not in fixed]  # e.g. generate@bfloat16, other rules
    colors = {m: plt.cm.viridis(0.1 + 0.65 * i / max(1, len(mars) - 1)) for i, m in enumerate(mars)}
    colors.update({m: plt.cm.tab10(3 + i % 7) for i, m in enumerate(others)})
    return {**colors, **fixed}


def _save(fig, out: Path, name: str, written: list[str]) -> None:
    fig.savefig(out / name, dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    written.append(name)


def _methods(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: method_order(e.method, e.theta))


def _legend(ax, **kwargs) -> None:
    """A legend on a panel that drew something labelled; an empty panel gets none (matplotlib warns of one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def plot_by_bench(entries: list[Entry], figure: str, title: str, ylabel: str, out: Path, name: str,
                  written: list[str], colors: dict) -> None:
    """Grouped bars, benchmark on x, one bar per method; one panel per model × temperature."""
    plt = pyplot()
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
        _legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), title="method")  # a panel may be empty
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, out, name, written)


def plot_group(group: list[Entry], out: Path, written: list[str], colors: dict) -> None:
    """Margin histograms, per-depth acceptance and (with MARS) the θ sweep of one model × bench × temperature."""
    plt = pyplot()
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
            _legend(ax, fontsize=8)  # MT-bench's recovery panel has nothing to plot
        fig.suptitle(f"MARS θ sweep — {where}")
        fig.tight_layout()
        _save(fig, out, f"theta_{tag}.png", written)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point matches or beats on both axes (higher is better), by increasing x."""
    return sorted({p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)})


def plot_pareto(entries: list[Entry], out: Path, written: list[str], colors: dict) -> None:
    """Speed vs quality recovery (raw quality when no recovery exists), one point per method × bench:
    colour = method (as in every plot), marker = bench; each bench's Pareto front ringed and connected. A
    recovery carries its paired 95% bootstrap interval (`quality_recovery_ci`) as a vertical bar: a front
    point whose bar crosses 1 has not been shown to lose quality."""
    plt = pyplot()
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
        for e, (x, _) in zip(mine, xy, strict=True):
            ci = e.fig.get("quality_recovery_ci") or {} if y_name == "quality_recovery" else {}
            if ci.get("low") is not None and ci.get("high") is not None:  # the per-question interval (a corpus
                # headline's ratio, WMT19's BLEU, may lie outside it)
                ax.vlines(x, ci["low"], ci["high"], colors=[colors[e.method]], lw=1, zorder=2)
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


def plot_batches(entries: list[Entry], out: Path, written: list[str], colors: dict) -> None:
    """Throughput and speedup over the fastest batched plain decoding against the batch size, one line per
    method, for each model × bench × temperature whose runs decoded at two batch sizes or more."""
    groups: dict[tuple, dict[str, dict[int, Entry]]] = defaultdict(lambda: defaultdict(dict))
    for e in entries:
        base, size = batch_of(e.method)
        groups[e.model, e.bench, e.temperature][base][size] = e
    plt = pyplot()
    for (model, bench, t), methods in sorted(groups.items()):
        if len({size for sizes in methods.values() for size in sizes}) < 2:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        panels = [("tokens_per_s", "throughput (tokens/s over the batch)"),
                  ("speedup_vs_fastest", "speedup over the fastest batched plain decoding (×)")]
        for ax, (figure, label) in zip(axes, panels, strict=True):
            for base, sizes in sorted(methods.items(), key=lambda kv: method_order(kv[0])):
                points = sorted((size, e.value(figure)) for size, e in sizes.items() if e.value(figure) is not None)
                if points:
                    first = next(iter(sizes.values()))
                    ax.plot(*zip(*points, strict=True), marker="o", label=base, color=colors.get(first.method))
            ax.set_xscale("log", base=2)
            ax.set(xlabel="batch size (requests decoded together)", ylabel=label, title=label)
            if figure == "speedup_vs_fastest":
                ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            _legend(ax, fontsize=8)
        fig.suptitle(f"Batching — {model}, {bench}, temperature {t:g}")
        fig.tight_layout()
        _save(fig, out, f"batch_{_slug(model, bench)}_T{t:g}.png", written)


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
    plot_batches(entries, out, written, colors)
    return written
