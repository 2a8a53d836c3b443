"""Run summaries (summary.json, written by `eval.run`) read and merged into report entries.

An entry is one (model, bench, temperature, method) with its figures. Methods of several run
directories sit side by side, shards of one run combine, and ratios a run lacked a baseline for are
filled in from another run's (marked `*`); see `eval.report` for the rules.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval.config.methods import GENERATE, STRICT, VANILLA, method_spec
from eval.reporting.metrics import category_speedups, ratio
from eval.rundirs.layout import SUMMARY
from mars.rules.margin import Mars

COSTS = ("tv_per_token", "kl_per_token", "argmax_mismatch", "logprob_regret")  # mars.accounting.cost
FASTEST_PLAIN = "<fastest plain>"  # the plain-decoding method (generate in any precision, vanilla) with most tokens/s
RATIOS = {  # figure: (the method it is relative to, the figure divided)
    "speedup": (VANILLA, "tokens_per_s"),
    "speedup_vs_generate": (GENERATE, "tokens_per_s"),
    "speedup_vs_fastest": (FASTEST_PLAIN, "tokens_per_s"),
    "quality_recovery": (STRICT, "quality"),
    "quality_recovery_vs_vanilla": (VANILLA, "quality"),
}
# A rule method's speculation (on / off / forced), its tree and calibration's predicted speedup over the fastest
# plain decoding (eval.runner.job.speculation_figures).
SPECULATION = ("speculation", "tree", "predicted_speedup_vs_fastest", "speculation_reason", "answers_of")
SETTING_KEYS = ("model", "bench", "temperature", "top_p", "top_k", "tree", "max_new_tokens", "seed", "dtype",
                "exact_attention", "prepack", "questions", "methods", "shard", "sandbox")


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
            spec = method_spec(batch_of(self.method)[0])
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


SAMPLED_DRAFTS = " (sampled drafts)"  # after a rule's name: its tree drew its children (tree.drafting=sample)


def batched_name(method: str, fig: dict) -> str:
    """How a report names a method's figures: as the run does at batch size 1 with top-k drafts;
    `SAMPLED_DRAFTS` after it when its tree sampled its children (the run's tree label ends " sampled"), so
    that both drafting modes at one temperature are rows of their own; `[B=<b>]` last when the run decoded
    b requests at a time (a batch sweep's points are rows of their own)."""
    size = fig.get("batch_size") or 1
    if str(fig.get("tree") or "").endswith(" sampled"):
        method += SAMPLED_DRAFTS
    return method if size == 1 else f"{method}[B={size}]"


def drafted_like(reference: str, method: str) -> str:
    """The rule baseline `reference` (strict) drafted as `method` was: a sampled-draft method's recovery is
    against strict on sampled drafts too."""
    return reference + SAMPLED_DRAFTS if reference == STRICT and method.endswith(SAMPLED_DRAFTS) else reference


def batch_of(method: str) -> tuple[str, int]:
    """(the method, its batch size) of a report's method name (`batched_name`)."""
    base, _, rest = method.partition("[B=")
    return (base, int(rest.rstrip("]"))) if rest.rstrip("]").isdigit() else (method, 1)


def is_plain(method: str) -> bool:
    """Plain decoding: transformers' model.generate (in the run's precision or `generate@<dtype>`) or vanilla."""
    method = batch_of(method)[0]
    return method == VANILLA or method.partition("@")[0] == GENERATE


def method_order(method: str, theta: float | None = None) -> tuple:
    """generate (each precision), vanilla, strict, then MARS from the strictest θ down, then anything else by
    name; rules on sampled drafts (`SAMPLED_DRAFTS`) after all of those, in the same order."""
    fixed = {GENERATE: 0, VANILLA: 1, STRICT: 2}
    sampled = method.endswith(SAMPLED_DRAFTS)
    base = method.removesuffix(SAMPLED_DRAFTS)
    if base.partition("@")[0] == GENERATE:
        return sampled, 0, 0.0, method
    if base in fixed:
        return sampled, fixed[base], 0.0, method
    return (sampled, 3, -theta, method) if theta is not None else (sampled, 4, 0.0, method)


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
    if any(f.get("cost_bound_tokens") for f in figs):  # some shard's costs are upper bounds (sampled drafts)
        out["cost_bound_tokens"] = sum(f.get("cost_bound_tokens") or 0 for f in figs)
    if any(f.get("kl_infinite_tokens") for f in figs):  # tokens left out of kl_per_token: the KL is +inf
        out["kl_infinite_tokens"] = sum(f.get("kl_infinite_tokens") or 0 for f in figs)
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
    for key in SPECULATION:  # one setting of the run, the same in every shard
        values = {json.dumps(f.get(key)) for f in figs}
        if len(values) == 1 and figs[0].get(key) is not None:
            out[key] = figs[0][key]
    if categories := _pool_categories([f.get("by_category") for f in figs]):
        out["by_category"] = categories  # its speedups: _fill_category_ratios, once every method is pooled
    return out


def _pool_categories(parts: list[dict | None]) -> dict | None:
    """Per-category figures summed over shards (tau weighted by cycles); None unless every shard has them
    with their sums (summaries written before they carried tokens, seconds and cycles do not)."""
    if not parts or not all(parts) or any("seconds" not in c for p in parts for c in p.values()):
        return None
    out: dict[str, dict] = {}
    for part in parts:
        for cat, fig in part.items():
            pooled = out.setdefault(cat, {"questions": 0, "tokens": 0, "seconds": 0.0, "cycles": 0, "_tau": 0.0})
            for k in ("questions", "tokens", "seconds", "cycles"):
                pooled[k] += fig[k]
            pooled["_tau"] += fig["tau"] * fig["cycles"]  # tau * cycles = the cycles' tokens
    for fig in out.values():
        fig["tokens_per_s"] = fig["tokens"] / fig["seconds"] if fig["seconds"] else None
        cycle_tokens = fig.pop("_tau")
        fig["tau"] = cycle_tokens / fig["cycles"] if fig["cycles"] else 1.0
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


def _fill_category_ratios(group: dict[str, Entry]) -> None:
    """Per-category speedups of pooled shards, against the baselines pooled from the same shards."""
    for e in group.values():
        figs = e.fig.get("by_category") or {}
        if all("speedup" in f for f in figs.values()):
            continue  # as the run computed them
        same = {m: {c: dict(f) for c, f in o.fig["by_category"].items()} for m, o in group.items()
                if o.fig.get("by_category") and set(o.run_dirs) == set(e.run_dirs)}
        category_speedups(same, VANILLA, [m for m in same if is_plain(m)])
        e.fig["by_category"] = same[batch_of(e.method)[0]]


def _fill_ratios(entries: list[Entry]) -> None:
    """Ratios to the baselines of the same model, bench, temperature and batch size (`batched_name`)."""
    groups: dict[tuple, dict[str, Entry]] = defaultdict(dict)
    for e in entries:
        base, size = batch_of(e.method)
        groups[e.model, e.bench, e.temperature, size][base] = e
    for group in groups.values():
        _fill_category_ratios(group)
    for e in entries:
        base, size = batch_of(e.method)
        group = groups[e.model, e.bench, e.temperature, size]
        for name, (reference, figure) in RATIOS.items():
            reference = drafted_like(reference, base)
            if reference == FASTEST_PLAIN:
                timed = [p for p in group.values() if is_plain(p.method) and p.value(figure) is not None]
                reference = batch_of(max(timed, key=lambda p: p.value(figure)).method)[0] if timed else reference
            ref = group.get(reference)
            num, den = e.value(figure), ref.value(figure) if ref else None
            if base == reference:
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
            key = str(s["model"]), str(s["bench"]), float(s["temperature"]), batched_name(method, fig)
            seen = parts[key].get(answers)
            if seen is None or (fig.get("questions") or 0) > (seen[1].get("questions") or 0):
                parts[key][answers] = (run, fig)
    entries = [_combine(key, list(items.values())) for key, items in parts.items()]
    _fill_ratios(entries)
    return sorted(entries, key=lambda e: (e.model, e.temperature, e.bench, method_order(e.method, e.theta)))
