"""The rule zoo: every verification rule swept over its parameter range, all answered in one run per
temperature (and drafting mode), and its report: a table per temperature and drafting mode and a Pareto
plot of speed against cost.

    python -m eval.zoo OUT/summary_t0.json OUT/summary_t1.json --out OUT   # report.md, pareto.png, zoo.json
    python -m eval.zoo OUT/summary_t1.json OUT/summary_t1_sampled.json --out OUT   # T=1: top-k vs sampled drafts
    python -m eval.zoo results/paper/zoo/llama31_8b --out results/paper/zoo/report   # run dirs, or parents
    python -m eval.zoo --baselines 0 1     # eval.run's baselines=[...] value at T=0 and at T=1, one a line

The sweep (`SWEEP`) is the one definition that scripts/rule_zoo_embedded.sh and `eval.paper zoo` run:
every registered rule's `sweep` declaration (`mars.rules.base.Rule.sweep`, beside the rule, with why
those points), its points from barely relaxing to aggressive. A zoo job's method is strict (lossless:
KL 0, argmax mismatch 0) with plain decoding (model.generate, vanilla) and every other point as
baselines, so all speed ratios of one temperature come from one run, the methods interleaved question
by question. Rules without a greedy form (ears) are swept at T > 0 only.

Each rule relaxes at least as much at each next point (tests/test_zoo.py checks it on a random tree),
and 4 points a rule keep the zoo affordable on a CPU. The points come from a pilot on the embedded
pair (4 prompts x 48 tokens, T=0 and 1) that showed where each knob bites on a flat target (top-1
mass ~0.2 at T=1); each rule's figures from it are in the comment on its `sweep`.

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

Costs on sampled drafts are upper bounds (`mars.accounting.cost.sampling_cost`: the cost of a relaxation averaged
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

from eval.config.methods import PLAIN, STRICT
from eval.reporting.summaries import Entry, ReportError, find_summaries, is_plain, merge_runs, read_summary
from eval.reporting.tables import cost_bounded, drafting_of
from mars.rules import RULES, Rule, make_rule, rule_class
from mars.rules.ears import Ears
from mars.rules.entropy import EntropyGate
from mars.rules.margin import Mars
from mars.rules.topm import TopM
from mars.rules.typical import Typical

# --- the sweep --------------------------------------------------------------------------------------

# The order the zoo lists rules in (the jobs' baselines, the tables, the plot's legend): strict, the
# paper's rule, then the others; a registered rule with sweep points that is not named here follows in
# registration order.
ORDER = (STRICT, Mars.name, Typical.name, TopM.name, EntropyGate.name, Ears.name)


def _rounded(params: dict) -> dict:
    """Parameters as a display name carries them (6 significant digits): sqrt(0.09) is 0.3, not 0.30000000000000004."""
    return {k: float(f"{v:g}") if isinstance(v, float) else v for k, v in params.items()}


def swept_rules() -> list[str]:
    """The registered rules that declare sweep points (`Rule.sweep`), in the zoo's order (`ORDER`, then
    the others in registration order)."""
    named = [name for name, cls in RULES.items() if cls.sweep]
    return sorted(named, key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), list(RULES).index(name)))


SWEEP: dict[str, tuple[dict, ...]] = {  # rule name: its points (its `sweep`), as display names carry them
    name: tuple(_rounded(params) for params in rule_class(name).sweep) for name in swept_rules()}


def points(temperature: float) -> list[Rule]:
    """Every point of the sweep that can run at `temperature` (greedy: rules with a greedy form), strict first."""
    return [make_rule(name, **params) for name, sweep in SWEEP.items() for params in sweep
            if temperature > 0 or rule_class(name).greedy_form]


def baselines(temperature: float) -> list[str]:
    """A zoo job's baselines (its method is strict): plain decoding, then every other point by display name."""
    return [*PLAIN, *(r.display for r in points(temperature) if r.name != STRICT)]


def hydra_list(names: Iterable[str]) -> str:
    """`names` as a Hydra list value; names with brackets, commas or '=' (topm@2[alpha=0.3]) quoted."""
    return "[" + ",".join(n if re.fullmatch(r"[\w@.+-]+", n) else f'"{n}"' for n in names) + "]"


def sweep_order(method: str, rule: dict) -> tuple:
    """Plain decoding first, then the rules in SWEEP order with their points in sweep order, then others by name."""
    if is_plain(method):
        return (0, PLAIN.index(method.partition("@")[0]), 0, method)
    name = rule.get("name", method.partition("@")[0])
    if name not in SWEEP:
        return (2, 0, 0, method)
    for i, params in enumerate(SWEEP[name]):
        if all(rule.get(k) == v for k, v in params.items()):
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
        """Whether the run reported this point's TV and KL as upper bounds (sampled drafts, `mars.accounting.cost`)."""
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
