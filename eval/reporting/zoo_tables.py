"""The zoo's report: a table per temperature and drafting mode (report.md), zoo.json, and the Pareto
plot of speed against cost, both drafting modes of a temperature in one panel (see `eval.reporting.zoo_sweep`
for what the zoo sweeps). Costs a run reported as upper bounds (sampled drafts) are marked "≤".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eval.config.methods import STRICT
from eval.reporting.plots import pyplot
from eval.reporting.tables import BOUND, DASH, drafting_of, format_quality, run_setting, with_infinite_kl
from eval.reporting.zoo_sweep import COST, SWEEP, TV, Group, Point, drafts_name
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


def _bounded(p: Point, text: str) -> str:
    """A cost cell, "≤"-prefixed where the run reported the figure as an upper bound."""
    return f"{BOUND} {text}" if p.bounded and text != DASH else text


def table(group: Group) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one group's table (see the module docstring)."""
    quality = group.quality_metric
    moves = group.quality_moves()
    header = ["method", "rule parameters", "vs fastest plain", "vs vanilla", "τ", "relaxed"]
    bound = f" ({BOUND}: upper bound)" if group.bounded else ""
    header += [f"TV / token{bound}", f"KL / token{bound}"] if group.sampled else ["argmax mismatch", "log-prob regret"]
    if quality:
        header += [quality, "recovery"]
    header += ["= vanilla", "Pareto front"]
    rows = []
    for p in group.points:
        fig = p.entry.fig
        row = [p.method, _params(p.rule), _num(p.value("speedup_vs_fastest"), "{:.2f}×"),
               _num(p.value("speedup"), "{:.2f}×"), _num(p.value("tau")), _num(p.value("relaxed_frac"), "{:.1%}")]
        if group.sampled:
            kl = with_infinite_kl(_sig(p.value("kl_per_token")), fig)
            row += [_bounded(p, _sig(p.value("tv_per_token"))), _bounded(p, kl)]
        else:
            row += [_num(p.value("argmax_mismatch"), "{:.1%}"), _sig(p.value("logprob_regret"))]
        if quality:
            row += [format_quality(p.value("quality"), quality), _num(p.value("quality_recovery"))]
        front_names = {"cost": "KL" if group.sampled else "mismatch", "tv": "TV", "quality": "quality"}
        fronts = [front_names[name] for name, on in p.on_front.items() if on]
        row += [_num(p.value("identical_to_vanilla"), "{:.0%}"), ", ".join(fronts) or ("" if p.rule_name else DASH)]
        rows.append(row)
    if quality and not moves and len(group.rules) > 1:
        header[header.index(quality)] = f"{quality} (same for every rule)"
    return header, rows


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(line) + " |" for line in [header, ["---"] * len(header), *rows])


SETTINGS = ("model", "bench", "questions", "max_new_tokens", "tree", "drafting", "dtype", "seed", "top_p", "top_k")


def _setting(value: object) -> str:
    if isinstance(value, dict) and {"total_tokens", "depth", "branching"} <= set(value):  # a tree
        return (f"{value['total_tokens']} nodes / depth {value['depth']} / {value['branching']} children"
                + (" (adaptive: at most)" if value.get("adaptive") else ""))
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return DASH if value is None else str(value)


def _key(run: dict) -> tuple[str, str, float, str]:
    s = run["settings"]
    return str(s["model"]), str(s["bench"]), float(s["temperature"]), drafting_of(run)


def _named(group: Group, groups_: Sequence[Group]) -> bool:
    """Whether the report names `group`'s drafting mode: once it has sampled drafts, at T > 0 (greedy
    decoding drafts top-k only, so there is nothing to tell apart at T = 0)."""
    return group.sampled and any(g.drafting != "topk" for g in groups_)


def _heading(group: Group, groups_: Sequence[Group]) -> str:
    """A group's section title: its temperature, and its drafting mode where the report names it."""
    return f"Temperature {group.temperature:g}" + (f", {group.drafts}" if _named(group, groups_) else "")


def report_markdown(runs: Sequence[dict], groups_: Sequence[Group], plots: dict[tuple, str]) -> str:
    machines = sorted({str(r.get("machine", "unknown")) for r in runs})
    keys = [k for k in SETTINGS if any(k in r["settings"] for r in runs)]
    values = {k: {run_setting(r, k, _setting) for r in runs} for k in keys}
    common = [k for k in keys if len(values[k]) == 1]  # the rest is stated per temperature
    parts = ["# Rule zoo", "", f"Machine: {'; '.join(machines)}", "",
             "Settings of every run: " + "; ".join(f"{k} {next(iter(values[k]))}" for k in common) + "."]
    parts += ["", "Sweep (each rule from its mildest point to its most aggressive; ears at T > 0 only): "
              + "; ".join(f"{name}: " + ", ".join(make_rule(name, **p).display for p in sweep)
                          for name, sweep in SWEEP.items() if name != STRICT) + "."]
    for (model, bench), plot in plots.items():
        parts += ["", f"## {model}, {bench}", "", f"![Pareto plot]({plot})"]
        for g in (g for g in groups_ if (g.model, g.bench) == (model, bench)):
            mine = [r for r in runs if _key(r) == (g.model, g.bench, g.temperature, g.drafting)]
            own = "; ".join(f"{k} {'; '.join(sorted({run_setting(r, k, _setting) for r in mine}))}"
                            for k in keys if k not in common and k not in ("model", "bench"))
            parts += ["", f"### {_heading(g, groups_)}", "", *([f"Settings: {own}.", ""] if own else []),
                      f"Fastest plain decoding timed: {g.fastest_plain or DASH}. Pareto front: the rules no other "
                      f"point{f' on {g.drafts}' if _named(g, groups_) else ''} beats on both speed ({g.speed}) and "
                      + ("KL per token" + (f" (an upper bound where marked {BOUND})" if g.bounded else "")
                         if g.sampled else "argmax mismatch")
                      + (" (and, separately, on both speed and quality)" if g.quality_moves() else "") + ".", "",
                      _markdown(*table(g))]
    parts += ["", "## Legend", "",
              "- **vs fastest plain**: tokens/s over the fastest plain decoding timed in the same run "
              "(`model.generate` in every precision timed, vanilla); **vs vanilla**: over our plain decoding.",
              "- **τ**: tokens per draft–verify cycle. **relaxed**: share of the emitted tokens accepted only "
              "through the rule's relaxation.",
              "- **TV / KL per token** (T > 0): the exact total variation and KL(π‖p) between the distribution "
              "the rule emits (π) and the target's (p), per emitted token (`mars.accounting.cost`); strict's are 0.",
              *([f"- **{BOUND}** (sampled drafts): an upper bound on the cost, not the cost: the distribution "
                 "emitted on average over the draft's draws is no farther from p than the average over draws "
                 "of each draw's distance (TV and KL are jointly convex; `mars.accounting.cost.sampling_cost`), and "
                 "the "
                 "figure is that average (the run's `cost_bound_tokens` > 0)."]
                if any(g.bounded for g in groups_) else []),
              *(["- **top-k drafts / sampled drafts**: the tree's children are the draft head's most likely "
                 "tokens, or drawn from its distribution without replacement (`tree.drafting`); greedy runs "
                 "draft top-k."] if any(g.drafting != "topk" for g in groups_) else []),
              "- **argmax mismatch / log-prob regret** (T = 0): share of tokens that are not the target's argmax, "
              "and log p₁ − log p(token) at temperature 1, per token.",
              "- **recovery**: quality / strict's quality. **= vanilla**: share of questions whose tokens equal "
              "vanilla's exactly.",
              f"- `{DASH}`: not available (plain decoding has no rule cost)."]
    return "\n".join(parts) + "\n"


FIGURES = ("questions", "tokens_per_s", "speedup_vs_fastest", "speedup", "tau", "relaxed_frac", "tv_per_token",
           "kl_per_token", "kl_infinite_tokens", "cost_bound_tokens", "argmax_mismatch", "logprob_regret",
           "quality_recovery",
           "identical_to_vanilla")


def zoo_json(groups_: Sequence[Group], plots: dict[tuple, str]) -> dict:
    return {
        "sweep": {name: [make_rule(name, **p).display for p in sweep] for name, sweep in SWEEP.items()},
        "groups": [{
            "model": g.model, "bench": g.bench, "temperature": g.temperature, "drafting": g.drafting,
            "plot": plots.get((g.model, g.bench)), "fastest_plain": g.fastest_plain, "speed_figure": g.speed,
            "cost_figure": COST[g.sampled][0], "cost_is_upper_bound": g.bounded,
            "quality_metric": g.quality_metric, "quality_moves": g.quality_moves(),
            "methods": [{"method": p.method, "rule": p.rule or None,
                         **{k: p.entry.fig.get(k) for k in FIGURES},
                         "quality": p.value("quality"),
                         "pareto": {k: v for k, v in p.on_front.items()}} for p in g.points],
        } for g in groups_],
    }


# --- the plot ---------------------------------------------------------------------------------------

MARKERS = {STRICT: "*", Mars.name: "o", Typical.name: "s", TopM.name: "D", EntropyGate.name: "^", Ears.name: "v"}
# How a drafting mode is drawn when both share a panel: top-k drafts as the zoo always drew them (filled
# markers, solid lines, a dashed front); sampled drafts hollow, dashed, their front dotted. The rules keep
# their colours and markers in both, so a rule's two curves read as one rule under two draftings.
MODES = {"topk": {"filled": True, "ls": "-", "front": "--", "italic": False},
         "sample": {"filled": False, "ls": "--", "front": ":", "italic": True}}


def _mode(drafting: str) -> dict:
    return MODES.get(drafting, MODES["sample"])


@dataclass
class Overlay:
    """The groups of one model × bench × temperature, one per drafting mode: one panel draws them all."""

    groups: list[Group]

    @property
    def temperature(self) -> float:
        return self.groups[0].temperature

    @property
    def sampled(self) -> bool:
        return self.groups[0].sampled

    def quality_moves(self) -> bool:
        return any(g.quality_moves() for g in self.groups)


def overlays(groups_: Sequence[Group]) -> list[Overlay]:
    """`groups_` (one model × bench) gathered by temperature, in their order."""
    by_t: dict[float, list[Group]] = {}
    for g in groups_:
        by_t.setdefault(g.temperature, []).append(g)
    return [Overlay(gs) for gs in by_t.values()]


def cost_label(overlay: Overlay, panel: str = "cost") -> str:
    """The cost axis's label ("cost": KL or argmax mismatch; "tv": TV); it says which costs are upper
    bounds (sampled drafts), and that they are."""
    name = TV[1] if panel == "tv" else COST[overlay.sampled][1]
    bounded = [g for g in overlay.groups if g.bounded]
    if not bounded:
        return name
    if len(bounded) == len(overlay.groups):
        return f"{BOUND} {name} (upper bound)"
    return f"{name}; {', '.join(g.drafts for g in bounded)}: {BOUND} upper bound"


def _style(rules: Sequence[str]) -> dict[str, tuple]:
    """(colour, marker) per rule: strict black, the others from tab10 in sweep order."""
    plt = pyplot()
    others = [r for r in rules if r != STRICT]
    style = {r: (plt.cm.tab10(i % 10), MARKERS.get(r, "Pho<>"[i % 5])) for i, r in enumerate(others)}
    style[STRICT] = ("black", "*")
    return style


def _panel(ax, overlay: Overlay, panel: str, style: dict) -> None:
    layers = [(g, g.panel_points(panel)) for g in overlay.groups]
    if not any(xy for _, xy in layers):
        ax.text(0.5, 0.5, "not available", ha="center", va="center", transform=ax.transAxes)
        return
    finite = [x for _, xy in layers for _, x, _ in xy if math.isfinite(x)]
    right = max(finite, default=1.0) * 1.15 or 1.0  # where an infinite cost is drawn: past every finite one
    for group, xy in layers:
        mode = _mode(group.drafting)
        plotted = [(p, x if math.isfinite(x) else right, y) for p, x, y in xy]
        for rule in dict.fromkeys(p.rule_name for p, _, _ in plotted):
            mine = [(p, x, y) for p, x, y in plotted if p.rule_name == rule]
            color, marker = style[rule]
            xs, ys = [x for _, x, _ in mine], [y for _, _, y in mine]
            ax.plot(xs, ys, color=color, lw=0.8, ls=mode["ls"], alpha=0.5, zorder=2)
            ax.scatter(xs, ys, marker=marker, s=140 if rule == STRICT else 45, zorder=4, linewidths=1.0,
                       facecolors=color if mode["filled"] else "none", edgecolors=color)
            for p, x, y in mine:
                if rule != STRICT:
                    infinite = panel == "cost" and not math.isfinite(p.cost(group.sampled) or 0.0)
                    text = p.label + (" (KL ∞)" if infinite else "")
                    ax.annotate(text, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=6.5, color=color,
                                fontstyle="italic" if mode["italic"] else "normal")
        front = sorted(((x, y) for p, x, y in plotted if p.on_front.get(panel)), key=lambda xy_: (xy_[0], -xy_[1]))
        if panel == "quality":
            front.reverse()
        if front:
            fx, fy = zip(*front, strict=True)
            # The edge of the region the front dominates: from each point across to the next one's x, then up to it.
            ax.plot(fx, fy, color="black", ls=mode["front"], lw=1.1, zorder=3, drawstyle="steps-post")
            ax.scatter(fx, fy, s=170, facecolors="none", edgecolors="black", lw=0.9, zorder=3,
                       linestyle="solid" if mode["filled"] else "dotted")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", zorder=1)
    if panel != "quality" and len(positive := [x for x in finite if x > 0]) > 1 and max(positive) / min(positive) > 100:
        ax.set_xscale("symlog", linthresh=min(positive))
    g0 = overlay.groups[0]
    speed = "the fastest plain decoding" if g0.speed == "speedup_vs_fastest" else "vanilla"
    fastest = {g.fastest_plain for g in overlay.groups if g.fastest_plain}
    fastest_text = f" ({', '.join(sorted(fastest))})" if g0.speed == "speedup_vs_fastest" and fastest else ""
    drafts = (" — " + " vs ".join(g.drafts for g in overlay.groups) if len(overlay.groups) > 1
              else f" ({g0.drafts})" if g0.drafting != "topk" else "")
    if panel != "quality":
        xlabel = cost_label(overlay, panel) + " → costlier"
        measure = "TV" if panel == "tv" else "KL" if overlay.sampled else "argmax mismatch"
        title = f"T={overlay.temperature:g}: speed vs {measure}{drafts}"
    else:
        xlabel = f"{g0.quality_metric} → better"
        title = f"T={overlay.temperature:g}: speed vs quality{drafts}"
    ax.set(xlabel=xlabel, ylabel=f"speedup over {speed}{fastest_text} (×)", title=title)
    ax.margins(x=0.12, y=0.1)


def panels(groups_: Sequence[Group]) -> list[tuple[Overlay, str]]:
    """One model × bench's panels: a cost panel per temperature (highest first; at T > 0 KL, then TV),
    then a quality panel per temperature where quality differs between the rules; each panel holds every
    drafting mode run."""
    layers = overlays(groups_)
    costs = [(o, panel) for o in layers for panel in ("cost", *(("tv",) if o.sampled else ()))]
    return costs + [(o, "quality") for o in layers if o.quality_moves()]


def _rules(groups_: Sequence[Group]) -> list[str]:
    """The rules of `groups_` in sweep order (strict first)."""
    return list(dict.fromkeys(p.rule_name for g in groups_ for p in sorted(g.rules, key=lambda p: p.order)))


def legend_entries(groups_: Sequence[Group], panels_: Sequence[tuple[Overlay, str]]) -> list[tuple[str, dict]]:
    """(label, Line2D keywords) of the figure's legend: the rules; the drafting modes when a sampled one is
    drawn ("(cost ≤: upper bound)" where its costs are bounds); a Pareto front per mode that has one."""
    style = _style(_rules(groups_))
    out = [(rule, {"color": style[rule][0], "marker": style[rule][1], "ls": "none",
                   "markersize": 11 if rule == STRICT else 6.5}) for rule in _rules(groups_)]
    modes = list(dict.fromkeys(g.drafting for g in groups_))
    named = modes != ["topk"]  # a zoo of top-k drafts only keeps the legend it always had
    if named:
        for drafting in modes:
            mode, bounded = _mode(drafting), any(g.bounded for g in groups_ if g.drafting == drafting)
            label = drafts_name(drafting) + (f" (cost {BOUND}: upper bound)" if bounded else "")
            out.append((label, {"color": "grey", "marker": "o", "ls": mode["ls"],
                                "markerfacecolor": "grey" if mode["filled"] else "none"}))
    for drafting in modes:
        if any(g.drafting == drafting and any(p.on_front.get(panel) for p in g.rules)
               for overlay, panel in panels_ for g in overlay.groups):
            label = f"Pareto front, {drafts_name(drafting)}" if named else "Pareto front"
            out.append((label, {"color": "black", "ls": _mode(drafting)["front"]}))
    return out


def plot(groups_: Sequence[Group], path: Path) -> None:
    """One model × bench's Pareto plot (`panels`) into `path`."""
    plt = pyplot()
    from matplotlib.lines import Line2D  # after pyplot(), which chooses the backend

    panels_ = panels(groups_)
    style = _style(_rules(groups_))
    fig, axes = plt.subplots(1, len(panels_), figsize=(6.2 * len(panels_), 5.2), squeeze=False)
    for ax, (overlay, panel) in zip(axes[0], panels_, strict=True):
        _panel(ax, overlay, panel, style)
    fig.tight_layout()
    entries = legend_entries(groups_, panels_)
    ncol = min(len(entries), 4 * len(panels_))  # about the figure's width; more wrap to further rows
    legend = fig.legend([Line2D([], [], **kw) for _, kw in entries], [label for label, _ in entries],
                        loc="lower center", ncol=ncol, fontsize=9, bbox_to_anchor=(0.5, 1.0), frameon=False)
    # Above the panels, however many rows the legend takes: the title goes on top of its measured height.
    fig.canvas.draw()
    height = legend.get_window_extent().height / fig.bbox.height
    g0 = groups_[0]
    fig.suptitle(f"Rule zoo — {g0.model}, {g0.bench}: speed against the rules' cost", y=1.0 + height,
                 va="bottom")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def slug(text: str) -> str:
    """`text` as a file name part."""
    return re.sub(r"[^\w.-]+", "-", text)
