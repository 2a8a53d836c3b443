"""The zoo's report: a table per temperature (report.md), zoo.json, and the Pareto plot of speed
against exact cost (see `eval.reporting.zoo` for what the zoo sweeps).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from eval.config.methods import STRICT
from eval.reporting.plots import pyplot
from eval.reporting.tables import DASH, format_quality
from eval.reporting.zoo import COST, SWEEP, Group, _rounded
from mars.rules import make_rule
from mars.rules.ears import Ears
from mars.rules.entropy import EntropyGate
from mars.rules.margin import Mars
from mars.rules.topm import TopM
from mars.rules.typical import Typical

# --- report.md and zoo.json -------------------------------------------------------------------------

def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return DASH if value is None else fmt.format(value)


def _sig(value: float | None) -> str:
    return DASH if value is None else f"{value:.3g}"


def _params(rule: dict) -> str:
    if not rule:
        return "plain decoding"
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in rule.items() if k != "name") \
        or "(none: lossless)"


def table(group: Group) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one group's table (see the module docstring)."""
    quality = group.quality_metric
    moves = group.quality_moves()
    header = ["method", "rule parameters", "vs fastest plain", "vs vanilla", "τ", "relaxed"]
    header += ["TV / token", "KL / token"] if group.sampled else ["argmax mismatch", "log-prob regret"]
    if quality:
        header += [quality, "recovery"]
    header += ["= vanilla", "Pareto front"]
    rows = []
    for p in group.points:
        fig = p.entry.fig
        row = [p.method, _params(p.rule), _num(p.value("speedup_vs_fastest"), "{:.2f}×"),
               _num(p.value("speedup"), "{:.2f}×"), _num(p.value("tau")), _num(p.value("relaxed_frac"), "{:.1%}")]
        if group.sampled:
            kl = _sig(p.value("kl_per_token"))
            if fig.get("kl_infinite_tokens"):
                kl += f" (+∞ on {fig['kl_infinite_tokens']} tokens)"
            row += [_sig(p.value("tv_per_token")), kl]
        else:
            row += [_num(p.value("argmax_mismatch"), "{:.1%}"), _sig(p.value("logprob_regret"))]
        if quality:
            row += [format_quality(p.value("quality"), quality), _num(p.value("quality_recovery"))]
        fronts = [name if name == "quality" else ("KL" if group.sampled else "mismatch")
                  for name, on in p.on_front.items() if on]
        row += [_num(p.value("identical_to_vanilla"), "{:.0%}"), ", ".join(fronts) or ("" if p.rule_name else DASH)]
        rows.append(row)
    if quality and not moves and len(group.rules) > 1:
        header[header.index(quality)] = f"{quality} (same for every rule)"
    return header, rows


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(line) + " |" for line in [header, ["---"] * len(header), *rows])


SETTINGS = ("model", "bench", "questions", "max_new_tokens", "tree", "dtype", "seed", "top_p", "top_k")


def _setting(value: object) -> str:
    if isinstance(value, dict) and {"total_tokens", "depth", "branching"} <= set(value):  # a tree
        return (f"{value['total_tokens']} nodes / depth {value['depth']} / {value['branching']} children"
                + (" (adaptive: at most)" if value.get("adaptive") else ""))
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return DASH if value is None else str(value)


def _key(run: dict) -> tuple[str, str, float]:
    s = run["settings"]
    return str(s["model"]), str(s["bench"]), float(s["temperature"])


def report_markdown(runs: Sequence[dict], groups_: Sequence[Group], plots: dict[tuple, str]) -> str:
    machines = sorted({str(r.get("machine", "unknown")) for r in runs})
    keys = [k for k in SETTINGS if any(k in r["settings"] for r in runs)]
    values = {k: {_setting(r["settings"].get(k)) for r in runs} for k in keys}
    common = [k for k in keys if len(values[k]) == 1]  # the rest is stated per temperature
    parts = ["# Rule zoo", "", f"Machine: {'; '.join(machines)}", "",
             "Settings of every run: " + "; ".join(f"{k} {next(iter(values[k]))}" for k in common) + "."]
    parts += ["", "Sweep (each rule from its mildest point to its most aggressive; ears at T > 0 only): "
              + "; ".join(f"{name}: " + ", ".join(make_rule(name, **_rounded(p)).display for p in sweep)
                          for name, sweep in SWEEP.items() if name != STRICT) + "."]
    for (model, bench), plot in plots.items():
        parts += ["", f"## {model}, {bench}", "", f"![Pareto plot]({plot})"]
        for g in (g for g in groups_ if (g.model, g.bench) == (model, bench)):
            mine = [r for r in runs if _key(r) == (g.model, g.bench, g.temperature)]
            own = "; ".join(f"{k} {'; '.join(sorted({_setting(r['settings'].get(k)) for r in mine}))}"
                            for k in keys if k not in common and k not in ("model", "bench"))
            parts += ["", f"### Temperature {g.temperature:g}", "", *([f"Settings: {own}.", ""] if own else []),
                      f"Fastest plain decoding timed: {g.fastest_plain or DASH}. Pareto front: the rules no other "
                      f"point beats on both speed ({g.speed}) and "
                      + ("KL per token" if g.sampled else "argmax mismatch")
                      + (" (and, separately, on both speed and quality)" if g.quality_moves() else "") + ".", "",
                      _markdown(*table(g))]
    parts += ["", "## Legend", "",
              "- **vs fastest plain**: tokens/s over the fastest plain decoding timed in the same run "
              "(`model.generate` in every precision timed, vanilla); **vs vanilla**: over our plain decoding.",
              "- **τ**: tokens per draft–verify cycle. **relaxed**: share of the emitted tokens accepted only "
              "through the rule's relaxation.",
              "- **TV / KL per token** (T > 0): the exact total variation and KL(π‖p) between the distribution "
              "the rule emits (π) and the target's (p), per emitted token (`mars.cost`); strict's are 0.",
              "- **argmax mismatch / log-prob regret** (T = 0): share of tokens that are not the target's argmax, "
              "and log p₁ − log p(token) at temperature 1, per token.",
              "- **recovery**: quality / strict's quality. **= vanilla**: share of questions whose tokens equal "
              "vanilla's exactly.",
              f"- `{DASH}`: not available (plain decoding has no rule cost)."]
    return "\n".join(parts) + "\n"


FIGURES = ("questions", "tokens_per_s", "speedup_vs_fastest", "speedup", "tau", "relaxed_frac", "tv_per_token",
           "kl_per_token", "kl_infinite_tokens", "argmax_mismatch", "logprob_regret", "quality_recovery",
           "identical_to_vanilla")


def zoo_json(groups_: Sequence[Group], plots: dict[tuple, str]) -> dict:
    return {
        "sweep": {name: [make_rule(name, **_rounded(p)).display for p in sweep] for name, sweep in SWEEP.items()},
        "groups": [{
            "model": g.model, "bench": g.bench, "temperature": g.temperature, "plot": plots.get((g.model, g.bench)),
            "fastest_plain": g.fastest_plain, "speed_figure": g.speed, "cost_figure": COST[g.sampled][0],
            "quality_metric": g.quality_metric, "quality_moves": g.quality_moves(),
            "methods": [{"method": p.method, "rule": p.rule or None,
                         **{k: p.entry.fig.get(k) for k in FIGURES},
                         "quality": p.value("quality"),
                         "pareto": {k: v for k, v in p.on_front.items()}} for p in g.points],
        } for g in groups_],
    }


# --- the plot ---------------------------------------------------------------------------------------

MARKERS = {STRICT: "*", Mars.name: "o", Typical.name: "s", TopM.name: "D", EntropyGate.name: "^", Ears.name: "v"}


def _style(rules: Sequence[str]) -> dict[str, tuple]:
    """(colour, marker) per rule: strict black, the others from tab10 in sweep order."""
    plt = pyplot()
    others = [r for r in rules if r != STRICT]
    style = {r: (plt.cm.tab10(i % 10), MARKERS.get(r, "Pho<>"[i % 5])) for i, r in enumerate(others)}
    style[STRICT] = ("black", "*")
    return style


def _panel(ax, group: Group, panel: str, style: dict) -> None:
    xy = group.panel_points(panel)
    if not xy:
        ax.text(0.5, 0.5, "not available", ha="center", va="center", transform=ax.transAxes)
        return
    finite = [x for _, x, _ in xy if math.isfinite(x)]
    right = max(finite, default=1.0) * 1.15 or 1.0
    plotted = [(p, x if math.isfinite(x) else right, y) for p, x, y in xy]
    for rule in dict.fromkeys(p.rule_name for p, _, _ in plotted):
        mine = [(p, x, y) for p, x, y in plotted if p.rule_name == rule]
        color, marker = style[rule]
        ax.plot([x for _, x, _ in mine], [y for _, _, y in mine], color=color, lw=0.8, alpha=0.5, zorder=2)
        ax.scatter([x for _, x, _ in mine], [y for _, _, y in mine], color=color, marker=marker,
                   s=140 if rule == STRICT else 45, zorder=4, label=rule)
        for p, x, y in mine:
            if rule != STRICT:
                text = p.label + (" (KL ∞)" if not math.isfinite(p.cost(group.sampled) or 0.0) else "")
                ax.annotate(text, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=6.5, color=color)
    front = sorted(((x, y) for p, x, y in plotted if p.on_front.get(panel)), key=lambda xy_: (xy_[0], -xy_[1]))
    if panel == "quality":
        front.reverse()
    if front:
        fx, fy = zip(*front, strict=True)
        # The edge of the region the front dominates: from each point across to the next one's x, then up to it.
        ax.plot(fx, fy, color="black", ls="--", lw=1.1, zorder=3, drawstyle="steps-post", label="Pareto front")
        ax.scatter(fx, fy, s=170, facecolors="none", edgecolors="black", lw=0.9, zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", zorder=1)
    if panel == "cost" and len(positive := [x for x in finite if x > 0]) > 1 and max(positive) / min(positive) > 100:
        ax.set_xscale("symlog", linthresh=min(positive))
    speed = "the fastest plain decoding" if group.speed == "speedup_vs_fastest" else "vanilla"
    fastest = f" ({group.fastest_plain})" if group.speed == "speedup_vs_fastest" and group.fastest_plain else ""
    if panel == "cost":
        xlabel = COST[group.sampled][1] + " → costlier"
        title = f"T={group.temperature:g}: speed vs {'KL' if group.sampled else 'argmax mismatch'}"
    else:
        xlabel = f"{group.quality_metric} → better"
        title = f"T={group.temperature:g}: speed vs quality"
    ax.set(xlabel=xlabel, ylabel=f"speedup over {speed}{fastest} (×)", title=title)
    ax.margins(x=0.12, y=0.1)


def panels(groups_: Sequence[Group]) -> list[tuple[Group, str]]:
    """One model × bench's panels: a cost panel per temperature (highest first), then a quality panel per
    temperature where quality differs between the rules."""
    return [(g, "cost") for g in groups_] + [(g, "quality") for g in groups_ if g.quality_moves()]


def plot(groups_: Sequence[Group], path: Path) -> None:
    """One model × bench's Pareto plot (`panels`) into `path`."""
    plt = pyplot()
    panels_ = panels(groups_)
    rules = list(dict.fromkeys(p.rule_name for g in groups_ for p in sorted(g.rules, key=lambda p: p.order)))
    style = _style(rules)
    fig, axes = plt.subplots(1, len(panels_), figsize=(6.2 * len(panels_), 5.2), squeeze=False)
    for ax, (g, panel) in zip(axes[0], panels_, strict=True):
        _panel(ax, g, panel, style)
    handles, labels = {}, []
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="upper center", ncol=len(labels), fontsize=9,
               bbox_to_anchor=(0.5, 1.0), frameon=False)
    g0 = groups_[0]
    fig.suptitle(f"Rule zoo — {g0.model}, {g0.bench}: speed against the rules' cost", y=1.06)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def slug(text: str) -> str:
    """`text` as a file name part."""
    return re.sub(r"[^\w.-]+", "-", text)
