"""The rule zoo: every verification rule swept over its parameter range, all answered in one run per
temperature (and drafting mode), and its report: a table per temperature and drafting mode and a Pareto
plot of speed against cost.

    python -m eval.zoo OUT/summary_t0.json OUT/summary_t1.json --out OUT   # report.md, pareto.png, zoo.json
    python -m eval.zoo OUT/summary_t1.json OUT/summary_t1_sampled.json --out OUT   # T=1: top-k vs sampled drafts
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
merges them as eval.report does (a baseline shared by several jobs counts once), separately per drafting
mode: a run's `settings.drafting` ("topk": the head's top-k children, "sample": children sampled from the
head, `tree.drafting`; summaries from before sampled drafting lack it and drafted top-k, as every greedy
run does). Two T=1 runs that differ only in drafting are two groups of one temperature, each with its
own Pareto front. Per model × bench:
- report.md: a table per temperature and drafting mode (method, rule parameters, speedup over the fastest plain
  decoding timed and over vanilla, τ, relaxed share, TV and KL per token at T > 0, argmax mismatch and
  log-prob regret at T = 0, the bench's quality and its recovery vs strict, identical_to_vanilla, and
  whether the point is on the Pareto front);
- pareto.png (pareto_<model>_<bench>.png when there are several model × bench groups): at T > 0,
  speedup against KL per token and against TV per token (finite where a KL bound on sampled drafts is
  not); at T = 0, against argmax mismatch; and speedup against quality at a
  temperature where the quality differs between the rules. One colour and marker per rule, each point
  labelled with its parameters, the Pareto front (faster and cheaper than every other point) drawn;
  both drafting modes of a temperature share its panel (top-k drafts filled, sampled drafts hollow),
  one front each;
- zoo.json: the same figures.

Costs on sampled drafts are upper bounds (`mars.cost.sampling_cost`: the cost of a relaxation averaged
over the draws is at most the average of each draw's cost, by joint convexity); a method's summary says
so with `cost_bound_tokens` > 0, and the tables, axis labels and legends mark those figures with "≤".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval.config.methods import GENERATE, STRICT, VANILLA
from eval.reporting.summaries import Entry, ReportError, find_summaries, is_plain, merge_runs, read_summary
from eval.reporting.tables import cost_bounded, drafting_of
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

DRAFTING = {"topk": "top-k drafts", "sample": "sampled drafts"}  # settings.drafting: its name in the report


def drafts_name(drafting: str) -> str:
    """A drafting mode as the report names it ("top-k drafts", "sampled drafts")."""
    return DRAFTING.get(drafting, f"{drafting} drafts")

SPEED = ("speedup_vs_fastest", "speedup")  # the speed axis: over the fastest plain decoding, else over vanilla
COST = {True: ("kl_per_token", "KL(π‖p) per token (nats)"), False: ("argmax_mismatch", "argmax mismatch per token")}
# At T > 0 also speed against TV per token: always finite, where the KL bound on sampled drafts is infinite
# at any position whose draw leaves strict's given-the-draw support (the bound, not the cost, is infinite).
TV = ("tv_per_token", "TV(π, p) per token")


@dataclass
class Point:
    """One method of one model × bench × temperature as the zoo reports it."""

    entry: Entry
    order: tuple = ()
    on_front: dict[str, bool] = field(default_factory=dict)  # panel ("cost", "tv", "quality") -> on its Pareto front

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

    def tv(self) -> float | None:
        """TV per token (T > 0); 0 for strict when the run did not record it (lossless)."""
        value = self.value(TV[0])
        return 0.0 if value is None and self.rule_name == STRICT else value

    @property
    def bounded(self) -> bool:
        """Whether the run reported this point's TV and KL as upper bounds (sampled drafts, `mars.cost`)."""
        return cost_bounded(self.entry)


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
    """One model × bench × temperature × drafting mode of the zoo."""

    model: str
    bench: str
    temperature: float
    points: list[Point]
    quality_metric: str | None
    drafting: str = "topk"

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def drafts(self) -> str:
        return drafts_name(self.drafting)

    @property
    def bounded(self) -> bool:
        """Whether some rule point's costs are upper bounds (cost_bound_tokens > 0)."""
        return any(p.bounded for p in self.rules)

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
        """(point, x, y) of the rule points with both figures: x the cost ("cost": KL at T > 0, argmax
        mismatch at T = 0), TV per token ("tv", T > 0) or quality ("quality")."""
        out = []
        for p in self.rules:
            x = p.cost(self.sampled) if panel == "cost" else p.tv() if panel == "tv" else p.value("quality")
            y = p.value(self.speed)
            if x is not None and y is not None:
                out.append((p, x, y))
        return out

    def mark_fronts(self) -> None:
        panels = ["cost", *(["tv"] if self.sampled else []), *(["quality"] if self.quality_moves() else [])]
        for panel in panels:
            xy = self.panel_points(panel)
            front = pareto([(p.method, x, y) for p, x, y in xy], lower_x_is_better=panel != "quality")
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


def _drafting_order(drafting: str) -> tuple:
    return (list(DRAFTING).index(drafting) if drafting in DRAFTING else len(DRAFTING), drafting)


def groups(runs: Sequence[dict]) -> list[Group]:
    """The zoo's groups, by model, bench, temperature (highest first) and drafting mode (top-k first),
    fronts marked per group."""
    by_drafting: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_drafting[drafting_of(run)].append(run)
    by_key: dict[tuple, list[Entry]] = defaultdict(list)
    # Merged per drafting mode: the same method on top-k and on sampled drafts is two points, not two
    # shards of one, and each mode's speed ratios are against the plain decoding timed in its own runs.
    for drafting, mine in by_drafting.items():
        for e in merge_runs(mine):
            by_key[e.model, e.bench, e.temperature, drafting].append(e)
    out = []
    for (model, bench, t, drafting), entries in sorted(
            by_key.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2], _drafting_order(kv[0][3]))):
        pts = sorted((Point(e, sweep_order(e.method, e.rule)) for e in entries), key=lambda p: p.order)
        metric = next((e.quality_metric for e in entries if e.quality_metric), None)
        group = Group(model, bench, t, pts, metric, drafting)
        group.mark_fronts()
        out.append(group)
    return out
