"""Aggregation of answer records into per-method figures: speed, acceptance, relaxation, quality.

Definitions (all pooled over the questions every method answered):
  tokens_per_s             total new tokens / total generation wall time (batched, batch_size > 1: each
                           answer's wall_time is its share of its batch's, so this is the batch throughput)
  latency_mean, latency_p90  per request (a turn): seconds from its start (batched: its batch's start, all
                           requests of a batch submitted at once) to its last token; batch_size
  speedup                  tokens_per_s / our plain decoding's (vanilla) tokens_per_s
  speedup_vs_generate      tokens_per_s / transformers' model.generate's tokens_per_s (method "generate",
                           in the run's precision)
  speedup_vs_fastest       tokens_per_s / the fastest plain decoding's tokens_per_s among those timed in
                           the run (model.generate in each precision timed, e.g. "generate@bfloat16", and
                           vanilla); `fastest_plain` names it
  speedup_vs_fastest_paired  the same comparison question by question: per question both answered, the
                           method's tokens/s over the fastest plain decoding's on that question, pooled as the
                           20% trimmed geometric mean (`paired_ratio`); a burst of background load that lands on
                           one method's answer moves the total ratio but only one of these ratios, which the
                           trim drops; speedup_vs_fastest_paired_n: the questions it pairs
  predicted_speedup_vs_fastest  a rule method's: the calibration's paired ratio of what it runs (its tree, or
                           plain decoding where its speculation is off) over the fastest plain decoding
                           timed in calibration, set by `eval.runner.job` beside the measured
                           speedup_vs_fastest_paired (the same estimator), with its 90% predicted_interval;
                           `speculation` says "on", "off" (decoded plainly by vanilla's loop, tau 1; its
                           answers the run's vanilla's where it has them: `answers_of`) or
                           "forced" (a tree set explicitly, or strict's with tree.per_method=false)
  speedup_per_question     mean per-question tokens/s / vanilla's mean per-question tokens/s,
                           the figure of the EAGLE / MARS `speed.py` tools
  tau                      tokens emitted by draft-verify cycles / cycles: every turn's first token
                           comes from the prefill, in no cycle, so tau = sum(new_tokens - 1) / sum(cycles)
                           (the reference tools' "tau" divides by the last loop index instead, which
                           overstates it; they also credit a bonus token when EOS ends a path early)
  tau_by_turn              tau of each turn position pooled over the questions that have it (MT-bench: the
                           first turns', then the second's, asked after a longer context)
  relaxed_frac             tokens accepted only through the MARS relaxation / new tokens
  parse_rate, loglik       see `eval.scoring.quality`; token_prob = exp(loglik)
  identical_to_vanilla     fraction of questions whose tokens equal the baseline's exactly
  exact_at_tree_kernels    where vanilla decodes at other kernels than the trees (`DecodeSettings.plain`: in bf16
                           the two round differently, so identical_to_vanilla stops showing strict exact): the
                           fraction of strict greedy's first turns checked (`exact_checked_turns`, untimed)
                           that equal plain decoding at the trees' kernels; None where none was checked
  margin_histogram         counts of the margin values at verified positions (`margin_histogram`)
  phase_seconds, phase_share  wall time by phase of the decoding loop (`mars.accounting.timing.PHASES`: prefill,
                           draft, tree_forward, accept, cache_update, catch_up; plain decoding: decode)
                           and each phase's share of the loop's total; phase_seconds also holds
                           `accounting`, settling the cost accounting after the timed loop (outside
                           tokens_per_s and the shares)
  contended_share          CPU seconds other processes of ours used while the method was timed / its timed
                           wall seconds (`eval.runner.locks.timed`; 0 when timing held the machine's
                           timing lock); contended_questions: answers over CONTENDED_SHARE each;
                           speed_contended: the share of the method or of a baseline its speedups divide
                           by exceeds CONTENDED_SHARE (the report marks those figures); retimed_questions:
                           answers whose first timing was contended and was repeated alone (`run_timed`)
Task quality and its recovery (method / strict) are added by `eval.runner.job.score_quality`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from eval.config.methods import GENERATE, VANILLA
from eval.rundirs.layout import CONTENDED_SHARE
from eval.scoring.quality import token_prob
from mars.accounting.stats import VerifyStats
from mars.accounting.timing import ACCOUNTING
from mars.tuning.pairs import TRIM, estimate

# Histogram ranges per margin metric; values outside fall into the end bins.
MARGIN_BINS = 40


def merged_stats(records: list[dict]) -> VerifyStats:
    total = VerifyStats()
    for r in records:
        total.merge(VerifyStats.from_json(r["eval"]["verify"]))
    return total


def speed_counts(record: dict) -> tuple[int, float]:
    """(new tokens, generation wall time) of one answer record, over all its turns."""
    choice = record["choices"][0]
    return sum(choice["new_tokens"]), sum(choice["wall_time"])


def cycle_counts(record: dict) -> tuple[int, int]:
    """(tokens emitted by draft-verify cycles, cycles) of one answer record: each turn's first token
    comes from the prefill, in no cycle."""
    choice = record["choices"][0]
    return sum(n - 1 for n in choice["new_tokens"] if n > 0), sum(choice["idxs"])


def tau_by_turn(records: list[dict]) -> list[float]:
    """tau per turn position (0-based), each pooled over the records that reached that turn."""
    turns = max((len(r["choices"][0]["new_tokens"]) for r in records), default=0)
    out = []
    for i in range(turns):
        choices = [r["choices"][0] for r in records if len(r["choices"][0]["new_tokens"]) > i]
        out.append(tau(sum(max(c["new_tokens"][i] - 1, 0) for c in choices), sum(c["idxs"][i] for c in choices)))
    return out


def tokens_per_s(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def question_rates(records: list[dict]) -> dict:
    """{question_id: tokens/s of that answer} of one method's answer records (`speed_counts`); answers
    timed at zero seconds have no rate and are left out."""
    return {r["question_id"]: t / s for r in records for t, s in [speed_counts(r)] if s > 0}


def paired_ratio(values_a: Sequence[float], values_b: Sequence[float]) -> tuple[float, int] | None:
    """The typical ratio a / b of paired values (the i-th of each belong together, e.g. two methods'
    tokens/s on one question) and the number of pairs: the trimmed mean of the log ratios, exponentiated, as
    the calibration computes what it predicts (`mars.tuning.pairs.estimate`: 20% dropped at each end, none
    under 5 pairs), so a few pairs one of whose values was disturbed (a burst of background load on one answer)
    do not move it. Pairs with a value that is not positive have no log ratio and are left out; None when no
    pair is left."""
    logs = [math.log(a / b) for a, b in zip(values_a, values_b, strict=True) if a > 0 and b > 0]
    if not logs:
        return None
    found = estimate(logs)
    return (found.ratio if found else math.exp(logs[0])), len(logs)


def paired_speedup(records: list[dict], reference: list[dict]) -> tuple[float, int] | None:
    """`paired_ratio` of a method's per-question tokens/s over `reference`'s, on the questions both answered."""
    rates, base = question_rates(records), question_rates(reference)
    both = [q for q in rates if q in base]
    return paired_ratio([rates[q] for q in both], [base[q] for q in both])


def tau(cycle_tokens: int, cycles: int) -> float:
    """Tokens per draft-verify cycle; 1.0 before any cycle."""
    return cycle_tokens / cycles if cycles else 1.0


def method_figures(records: list[dict]) -> dict:
    """Figures of one method that need no other method."""
    tokens = sum(speed_counts(r)[0] for r in records)
    seconds = sum(speed_counts(r)[1] for r in records)
    counts = [cycle_counts(r) for r in records]
    cycle_tokens, cycles = sum(t for t, _ in counts), sum(c for _, c in counts)
    relaxed = sum(sum(r["eval"]["relaxed"]) for r in records)
    per_question = [t / s for t, s in map(speed_counts, records) if s > 0]
    parses = [p for r in records for p in r["eval"]["parses"] if p is not None]
    loglik = sum(x for r in records for x in r["eval"]["loglik"] if x is not None)
    loglik_tokens = sum(r["eval"]["loglik_tokens"][i] for r in records
                        for i, x in enumerate(r["eval"]["loglik"]) if x is not None)
    stats = merged_stats(records)
    phases = Counter()
    for r in records:
        phases.update(r["eval"].get("phase_seconds", {}))
    loop = {k: v for k, v in phases.items() if k != ACCOUNTING}  # what `seconds` timed
    checked = [x for r in records for x in r["eval"].get("exact_at_tree_kernels", [])]
    latencies = sorted(x for r in records for x in r["eval"].get("latency", r["choices"][0]["wall_time"]))
    figures = {
        "questions": len(records),
        "batch_size": max((r["eval"].get("batch_size", 1) for r in records), default=1),
        "latency_mean": _mean(latencies),
        "latency_p90": latencies[math.ceil(0.9 * len(latencies)) - 1] if latencies else None,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": tokens_per_s(tokens, seconds),
        "mean_question_tokens_per_s": sum(per_question) / len(per_question) if per_question else 0.0,
        "cycles": cycles,
        "tau": tau(cycle_tokens, cycles),
        "tau_by_turn": tau_by_turn(records),
        "exact_at_tree_kernels": _mean(checked) if checked else None,
        "exact_checked_turns": len(checked),
        "relaxed_tokens": relaxed,
        "relaxed_frac": relaxed / tokens if tokens else 0.0,
        "stopped_by_eos_frac": _mean([s == "eos" for r in records for s in r["eval"]["stopped_by"]]),
        "acceptance_rate_by_depth": stats.acceptance_rate_by_depth,
        "relax_allowed_frac": stats.relax_allowed / stats.positions if stats.positions else 0.0,
        "phase_seconds": {k: round(v, 4) for k, v in phases.items()},
        "phase_share": {k: v / sum(loop.values()) for k, v in loop.items()} if sum(loop.values()) else {},
        **stats.cost(),  # the relaxation's exact cost per token: tv/kl_per_token, argmax_mismatch, logprob_regret
    }
    # Whether anything else of ours computed while this method was timed (eval.runner.locks.timed);
    # answers from before that check have no "timing" and count as unchecked.
    timings = [r.get("timing") for r in records]
    checked = [t for t in timings if t is not None and t.get("others_cpu_s") is not None]
    wall = sum(t["wall_s"] for t in checked)
    figures["contended_share"] = sum(t["others_cpu_s"] for t in checked) / wall if wall else None
    figures["contended_questions"] = sum(bool(t and t.get("contended")) for t in timings)
    figures["unchecked_questions"] = sum(t is None or t.get("contended") is None for t in timings)
    figures["retimed_questions"] = sum(bool(t and t.get("retimed")) for t in timings)
    figures["timed_exclusive"] = bool(timings) and all(t is not None and t.get("exclusive") for t in timings)
    if parses:
        figures["parse_rate"] = _mean(parses)
    if loglik_tokens:
        figures["loglik"] = loglik / loglik_tokens
        figures["token_prob"] = token_prob(loglik, loglik_tokens)
    return figures


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def ratio(value: float | None, base: float | None) -> float | None:
    """`value` relative to a baseline's `base`: every speedup and quality recovery of the project. None
    when either is missing or the base is 0 (a ratio to nothing is no figure)."""
    return None if value is None or base is None or base == 0 else value / base


CATEGORY_FIGURES = ("questions", "tokens", "seconds", "cycles", "tokens_per_s", "tau")  # summed ones pool over shards


def by_category(kept: dict[str, list[dict]], categories: dict, baseline: str, plain: Sequence[str]) -> dict[str, dict]:
    """Per method, per question category: questions, tokens, seconds, cycles, tokens/s, tau, and speedups
    over `baseline` and the fastest of `plain` in that category (Spec-Bench's leaderboard layout)."""
    out: dict[str, dict] = {}
    for method, recs in kept.items():
        groups: dict[str, list[dict]] = {}
        for r in sorted(recs, key=lambda r: (str(type(r["question_id"])), r["question_id"])):  # file order
            groups.setdefault(str(categories.get(r["question_id"], "")), []).append(r)
        out[method] = {cat: {k: method_figures(rs)[k] for k in CATEGORY_FIGURES} for cat, rs in groups.items()}
    category_speedups(out, baseline, plain)
    return out


def category_speedups(figures: dict[str, dict[str, dict]], baseline: str, plain: Sequence[str]) -> None:
    """Set each category's `speedup` (over `baseline`) and `speedup_vs_fastest` (over the fastest of
    `plain` in that category) in `figures` = {method: {category: figures}}, from tokens_per_s."""
    for figs in figures.values():
        for cat, fig in figs.items():
            base = figures.get(baseline, {}).get(cat)
            fig["speedup"] = ratio(fig["tokens_per_s"], base["tokens_per_s"]) if base else None
            rates = [figures[m][cat]["tokens_per_s"] for m in plain if m in figures and cat in figures[m]]
            fig["speedup_vs_fastest"] = ratio(fig["tokens_per_s"], max(rates)) if rates else None


def summarize(records: dict[str, list[dict]], baseline: str = VANILLA, generate: str = GENERATE,
              plain: Sequence[str] = (), categories: dict | None = None) -> dict[str, dict]:
    """Per-method figures over the questions all methods answered, with speedups over the baselines;
    `plain` names the plain-decoding methods (the candidates for the fastest plain decoding).
    `categories` ({question_id: category}) adds `by_category` figures to each method."""
    common = set.intersection(*(set(r["question_id"] for r in recs) for recs in records.values()))
    kept = {m: sorted((r for r in recs if r["question_id"] in common), key=lambda r: str(r["question_id"]))
            for m, recs in records.items()}
    figures = {m: method_figures(recs) for m, recs in kept.items()}
    for method, fig in figures.items():
        if baseline in figures and method != baseline:
            base = figures[baseline]
            fig["speedup"] = ratio(fig["tokens_per_s"], base["tokens_per_s"])
            fig["speedup_per_question"] = ratio(fig["mean_question_tokens_per_s"], base["mean_question_tokens_per_s"])
            same = [_tokens(a) == _tokens(b) for a, b in zip(kept[method], kept[baseline], strict=True)]
            fig["identical_to_vanilla"] = _mean(same)
        if generate in figures and method != generate:
            fig["speedup_vs_generate"] = ratio(fig["tokens_per_s"], figures[generate]["tokens_per_s"])
    timed = [m for m in plain if m in figures]
    if timed:
        fastest = max(timed, key=lambda m: figures[m]["tokens_per_s"])
        for method, fig in figures.items():
            fig["speedup_vs_fastest"] = ratio(fig["tokens_per_s"], figures[fastest]["tokens_per_s"])
            fig["fastest_plain"] = fastest
            paired = paired_speedup(kept[method], kept[fastest])
            fig["speedup_vs_fastest_paired"], fig["speedup_vs_fastest_paired_n"] = paired or (None, 0)
    # A speed figure is contended when its method's timing or the timing it is divided by was.
    compared = {m for m in (baseline, generate, fastest if timed else None) if m in figures}
    for method, fig in figures.items():
        shares = [figures[m]["contended_share"] or 0.0 for m in {method, *compared}]
        fig["speed_contended"] = max(shares) > CONTENDED_SHARE
    if categories:
        for method, per in by_category(kept, categories, baseline, timed).items():
            figures[method]["by_category"] = per
    return figures


def margin_histogram(margins: list[float], metric: str, lo: float, hi: float, theta: float | None) -> dict:
    """Counts of finite gate values (MARS: margins) in MARGIN_BINS equal bins over [lo, hi] (clipped
    into the end bins); the rule says which metric and range (`Rule.gate_scale`)."""
    width = (hi - lo) / MARGIN_BINS
    counts = [0] * MARGIN_BINS
    for m in margins:
        if math.isfinite(m):
            counts[min(max(int((m - lo) / width), 0), MARGIN_BINS - 1)] += 1
    return {"metric": metric, "theta": theta, "edges": [round(lo + i * width, 6) for i in range(MARGIN_BINS + 1)],
            "counts": counts}


def _tokens(record: dict) -> list[list[int]]:
    return record["eval"]["token_ids"]


PAIRED_HEADER = "vs fastest paired"
PAIRED_NOTE = (f"{PAIRED_HEADER}: per question, tokens/s over the fastest plain decoding's on the same question, "
               f"{TRIM:.0%} trimmed geometric mean; vs fastest: ratio of total tokens/s")


def format_table(figures: dict[str, dict], quality_metric: str | None = None) -> str:
    """A plain-text table of the headline figures, one row per method (quality: `quality_metric`'s value)."""
    columns = [
        ("method", None, "{}"), ("tok/s", "tokens_per_s", "{:.1f}"), ("speedup", "speedup", "{:.2f}x"),
        ("vs generate", "speedup_vs_generate", "{:.2f}x"), ("vs fastest", "speedup_vs_fastest", "{:.2f}x"),
        (PAIRED_HEADER, "speedup_vs_fastest_paired", "{:.2f}x"),
        ("predicted", "predicted_speedup_vs_fastest", "{:.2f}x"), ("speculation", "speculation", "{}"),
        ("tau", "tau", "{:.2f}"),
        ("relaxed", "relaxed_frac", "{:.1%}"),
        (quality_metric or "quality", "quality", "{:.3f}"), ("recovery", "quality_recovery", "{:.3f}"),
        ("=vanilla", "identical_to_vanilla", "{:.0%}"), ("=plain@tree", "exact_at_tree_kernels", "{:.0%}"),
        ("contended", "contended_questions", "{}"),
    ]
    rows = [[name for name, _, _ in columns]]
    for method, fig in figures.items():
        cells = []
        for _, key, fmt in columns:
            value = method if key is None else fig.get(key)
            if key == "quality":
                value = (value or {}).get(quality_metric)
            cells.append("-" if value is None else fmt.format(value))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    lines = [line(row) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if any(fig.get("speedup_vs_fastest_paired") is not None for fig in figures.values()):
        lines.append(PAIRED_NOTE)  # the two "vs fastest" columns differ in kind, not only in value
    return "\n".join(lines)
