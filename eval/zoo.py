"""The rule zoo: every verification rule swept over its parameter range, all answered in one run per
temperature, and its report: a table per temperature and a Pareto plot of speed against cost.

    python -m eval.zoo OUT/summary_t0.json OUT/summary_t1.json --out OUT   # report.md, pareto.png, zoo.json
    python -m eval.zoo results/paper/zoo/llama31_8b --out results/paper/zoo/report   # run dirs, or parents
    python -m eval.zoo --baselines 0 1     # eval.run's baselines=[...] value at T=0 and at T=1, one a line

The sweep (`SWEEP`) is the one definition that scripts/rule_zoo_embedded.sh and `eval.paper zoo` run:
per rule, its points from barely relaxing to aggressive. A zoo job's method is strict (lossless: KL 0,
argmax mismatch 0) with plain decoding (model.generate, vanilla) and every other point as baselines,
so all speed ratios of one temperature come from one run, the methods interleaved question by question.
Rules without a greedy form (ears) are swept at T > 0 only.

Why these points (each rule relaxes at least as much at each next point: tests/test_zoo.py checks it
on a random tree; 4 points a rule keep the zoo affordable on a CPU). A pilot on the embedded pair (4
prompts x 48 tokens, T=0 and 1) showed where each knob bites on a flat target (top-1 mass ~0.2 at T=1):
- mars θ 0.98, 0.9, 0.8, 0.6 (logit ratio z2/z1): from near strict through the paper's 0.9 (its
  ablation sweeps 0.84-0.98) to relaxing where the target is far from undecided (pilot, T=1: 25% of
  tokens relaxed at 0.95, 70% at 0.6).
- typical ε 0.5, 0.3, 0.15 with δ = 100, then Medusa's default ε 0.09, δ 0.3: the bar is
  min(ε, δ·exp(-H)), and at Medusa's δ (with or without its δ = sqrt(ε) coupling) the entropy term sets
  it on a flat target whatever ε: in the pilot ε 0.25 ... 0.04 with δ = sqrt(ε) emitted the same tokens
  (72% relaxed at T=1, 13% at T=0). δ = 100 takes the entropy term out of play below H ≈ 5 nats, so
  that ε alone (Medusa's posterior threshold) spans mild to aggressive.
- topm (m, α) (2, 0.7), (2, 0.5), (2, 0.3), (3, 0.2): a runner-up within α of the top token's
  probability, then three candidates; (2, 0.5) is the rule's default. Greedy it spans 4-10% relaxed in
  the pilot; when sampling, accepting a drafted top-1 outright is already most of the relaxation.
- entropy h 5, 4, 3, 1 nats (FLy's gate): the pilot's target had H >= 3 nats at ~90% of greedy and
  ~75% of sampled positions, so lower gates all relax about the same.
- ears β 0.05, 0.1, 0.3, 0.6 (T > 0 only): the strict test's tolerance β·(1 - max p); 0.1 is the
  default (pilot: 13% to 50% relaxed).

The report reads the summaries eval.run wrote (files, or directories searched as eval.report does) and
merges them as eval.report does (a baseline shared by several jobs counts once). Per model × bench:
- report.md: a table per temperature (method, rule parameters, speedup over the fastest plain
  decoding timed and over vanilla, τ, relaxed share, TV and KL per token at T > 0, argmax mismatch and
  log-prob regret at T = 0, the bench's quality and its recovery vs strict, identical_to_vanilla, and
  whether the point is on the Pareto front);
- pareto.png (pareto_<model>_<bench>.png when there are several model × bench groups): at T > 0,
  speedup against KL per token; at T = 0, against argmax mismatch; and speedup against quality at a
  temperature where the quality differs between the rules. One colour and marker per rule, each point
  labelled with its parameters, the Pareto front (faster and cheaper than every other point) drawn;
- zoo.json: the same figures.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval.config import GENERATE, STRICT, VANILLA
from eval.report import DASH, Entry, ReportError, find_summaries, format_quality, is_plain, merge_runs, read_summary
from mars.rules import Rule, make_rule, rule_class
from mars.rules.ears import Ears
from mars.rules.entropy import EntropyGate
from mars.rules.margin import Mars
from mars.rules.topm import TopM
from mars.rules.typical import Typical

# --- the sweep --------------------------------------------------------------------------------------

SWEEP: dict[str, tuple[dict, ...]] = {  # rule name: its points, from the mildest to the most aggressive
    STRICT: ({},),
    Mars.name: tuple({"theta": t} for t in (0.98, 0.9, 0.8, 0.6)),
    Typical.name: (*({"epsilon": e, "delta": 100.0} for e in (0.5, 0.3, 0.15)), {"epsilon": 0.09, "delta": 0.3}),
    TopM.name: ({"m": 2, "alpha": 0.7}, {"m": 2, "alpha": 0.5}, {"m": 2, "alpha": 0.3}, {"m": 3, "alpha": 0.2}),
    EntropyGate.name: tuple({"h": h} for h in (5.0, 4.0, 3.0, 1.0)),
    Ears.name: tuple({"beta": b} for b in (0.05, 0.1, 0.3, 0.6)),
}
PLAIN_METHODS = (GENERATE, VANILLA)  # the plain decoding every zoo job times (speedup_vs_fastest)


def _rounded(params: dict) -> dict:
    """Parameters as a display name carries them (6 significant digits): sqrt(0.09) is 0.3, not 0.30000000000000004."""
    return {k: float(f"{v:g}") if isinstance(v, float) else v for k, v in params.items()}


def points(temperature: float) -> list[Rule]:
    """Every point of the sweep that can run at `temperature` (greedy: rules with a greedy form), strict first."""
    return [make_rule(name, **_rounded(params)) for name, sweep in SWEEP.items() for params in sweep
            if temperature > 0 or rule_class(name).greedy_form]


def baselines(temperature: float) -> list[str]:
    """A zoo job's baselines (its method is strict): plain decoding, then every other point by display name."""
    return [*PLAIN_METHODS, *(r.display for r in points(temperature) if r.name != STRICT)]


def hydra_list(names: Iterable[str]) -> str:
    """`names` as a Hydra list value; names with brackets, commas or '=' (topm@2[alpha=0.3]) quoted."""
    return "[" + ",".join(n if re.fullmatch(r"[\w@.+-]+", n) else f'"{n}"' for n in names) + "]"


def sweep_order(method: str, rule: dict) -> tuple:
    """Plain decoding first, then the rules in SWEEP order with their points in sweep order, then others by name."""
    if is_plain(method):
        return (0, PLAIN_METHODS.index(method.partition("@")[0]), 0, method)
    name = rule.get("name", method.partition("@")[0])
    if name not in SWEEP:
        return (2, 0, 0, method)
    for i, params in enumerate(SWEEP[name]):
        if all(rule.get(k) == v for k, v in _rounded(params).items()):
            return (1, list(SWEEP).index(name), i, method)
    return (1, list(SWEEP).index(name), len(SWEEP[name]), method)


# --- figures and fronts -----------------------------------------------------------------------------

SPEED = ("speedup_vs_fastest", "speedup")  # the speed axis: over the fastest plain decoding, else over vanilla
COST = {True: ("kl_per_token", "KL(π‖p) per token (nats)"), False: ("argmax_mismatch", "argmax mismatch per token")}


@dataclass
class Point:
    """One method of one model × bench × temperature as the zoo reports it."""

    entry: Entry
    order: tuple = ()
    on_front: dict[str, bool] = field(default_factory=dict)  # panel ("cost", "quality") -> on its Pareto front

    @property
    def method(self) -> str:
        return self.entry.method

    @property
    def rule(self) -> dict:
        return self.entry.rule

    @property
    def rule_name(self) -> str | None:
        return self.rule.get("name")

    @property
    def label(self) -> str:
        """The point's parameters as its display name gives them: 0.9, 2[alpha=0.3] -> "2 alpha=0.3"."""
        text = self.method[len(self.rule_name or ""):].lstrip("@")
        return text.replace("[", " ").replace("]", "").replace(",", " ") or self.method

    def value(self, name: str) -> float | None:
        return self.entry.value(name)

    def cost(self, sampled: bool) -> float | None:
        """The rule's exact cost per token: KL when sampling (inf when some token's is infinite), the
        argmax mismatch when greedy; 0 for strict when the run did not record it (lossless)."""
        figure = COST[sampled][0]
        value = self.value(figure)
        if sampled and value is not None and (self.entry.fig.get("kl_infinite_tokens") or 0) > 0:
            return math.inf
        if value is None and self.rule_name == STRICT:
            return 0.0
        return value


def pareto(points: Sequence[tuple[str, float, float]], lower_x_is_better: bool = True) -> set[str]:
    """The names of the points (name, x, y) that no other point dominates: y at least as high and x at
    least as good (lower, or higher with lower_x_is_better=False), one of them strictly."""
    sign = 1 if lower_x_is_better else -1
    front = set()
    for name, x, y in points:
        dominated = any((sign * qx <= sign * x and qy >= y) and (sign * qx < sign * x or qy > y)
                        for _, qx, qy in points)
        if not dominated:
            front.add(name)
    return front


@dataclass
class Group:
    """One model × bench × temperature of the zoo."""

    model: str
    bench: str
    temperature: float
    points: list[Point]
    quality_metric: str | None

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def rules(self) -> list[Point]:
        return [p for p in self.points if p.rule_name]

    @property
    def speed(self) -> str:
        """speedup_vs_fastest when every rule point has it, else speedup (over vanilla)."""
        rules = self.rules
        return next((s for s in SPEED if rules and all(p.value(s) is not None for p in rules)), SPEED[0])

    @property
    def fastest_plain(self) -> str | None:
        return next((p.entry.fig.get("fastest_plain") for p in self.points if p.entry.fig.get("fastest_plain")), None)

    def quality_moves(self) -> bool:
        """Whether the headline quality differs between the rule points."""
        values = {round(v, 9) for p in self.rules if (v := p.value("quality")) is not None}
        return len(values) > 1

    def panel_points(self, panel: str) -> list[tuple[Point, float, float]]:
        """(point, x, y) of the rule points with both figures: x the cost ("cost") or quality ("quality")."""
        out = []
        for p in self.rules:
            x = p.cost(self.sampled) if panel == "cost" else p.value("quality")
            y = p.value(self.speed)
            if x is not None and y is not None:
                out.append((p, x, y))
        return out

    def mark_fronts(self) -> None:
        panels = ["cost", *(["quality"] if self.quality_moves() else [])]
        for panel in panels:
            xy = self.panel_points(panel)
            front = pareto([(p.method, x, y) for p, x, y in xy], lower_x_is_better=panel == "cost")
            for p, _, _ in xy:
                p.on_front[panel] = p.method in front


def load(paths: Iterable[str | Path]) -> list[dict]:
    """The summaries named (summary.json files, or directories searched as eval.report searches them), each once."""
    files: dict[Path, Path] = {}
    for path in map(Path, paths):
        for f in ([path] if path.is_file() else find_summaries(path) if path.is_dir() else []):
            files.setdefault(f.resolve(), f)
        if not path.exists():
            raise ReportError(f"{path}: no such file or directory")
    return [read_summary(f) for f in files.values()]


def groups(runs: Sequence[dict]) -> list[Group]:
    """The zoo's groups, by model, bench and temperature (highest first), fronts marked."""
    by_key: dict[tuple, list[Entry]] = defaultdict(list)
    for e in merge_runs(runs):
        by_key[e.model, e.bench, e.temperature].append(e)
    out = []
    for (model, bench, t), entries in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2])):
        pts = sorted((Point(e, sweep_order(e.method, e.rule)) for e in entries), key=lambda p: p.order)
        metric = next((e.quality_metric for e in entries if e.quality_metric), None)
        group = Group(model, bench, t, pts, metric)
        group.mark_fronts()
        out.append(group)
    return out


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
    from eval.report import _pyplot

    plt = _pyplot()
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
    from eval.report import _pyplot

    plt = _pyplot()
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


# --- command line -----------------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "-", text)


def write_report(paths: Sequence[str | Path], out: str | Path) -> list[Path]:
    """report.md, zoo.json and the Pareto plot(s) for the summaries under `paths` into `out`."""
    runs = load(paths)
    groups_ = groups(runs)
    if not groups_:
        raise ReportError(f"no methods in any summary under {', '.join(map(str, paths))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = list(dict.fromkeys((g.model, g.bench) for g in groups_))
    plots = {pair: "pareto.png" if len(pairs) == 1 else f"pareto_{_slug(pair[0])}_{_slug(pair[1])}.png"
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
