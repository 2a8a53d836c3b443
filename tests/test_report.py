"""eval.report: merging run dirs (sweeps, shards), the paper-layout table, the CSV, the plots, bad input.

All run directories here are SYNTHETIC TEST FIXTURES: summary.json files in the format eval.run
writes, filled with invented, seeded-random per-question results. They measure nothing.
"""

from __future__ import annotations

import csv
import json
import random
import struct
import warnings
from pathlib import Path

import pytest

from eval.report import main
from eval.reporting.metrics import category_speedups
from eval.reporting.summaries import ReportError, is_plain, load_runs, merge_runs
from eval.reporting.tables import DASH, cost_cell, generate_cell, table

# --- synthetic fixtures ---------------------------------------------------------------------------

MACHINE = "SYNTHETIC TEST FIXTURE (invented numbers, not a measurement)"
MODELS = ("model-a", "model-b")
BENCHES = {"humaneval": ("pass@1",), "wmt19": ("bleu", "chrf")}
MARS = ["mars@0.8", "mars@0.9", "mars@0.95"]
METHODS = ["vanilla", "strict", *MARS]
SPEED = {"generate": 1.05, "generate@bfloat16": 1.3, "vanilla": 1.0, "strict": 1.8, "mars@0.95": 1.9, "mars@0.9": 2.0,
         "mars@0.8": 2.1}
DEPTHS, POSITIONS = 4, 10  # every question verifies POSITIONS drafts per depth: pooled rates = question means
EDGES = [round(-0.5 + i * 0.05, 6) for i in range(41)]


def fake_questions(model: str, bench: str, temperature: float, method: str, n: int = 12) -> list[dict]:
    """Invented per-question results, the same for a method whichever run dir it is written into."""
    rng = random.Random(f"{model}|{bench}|{temperature}|{method}")
    speculative = not is_plain(method)
    out = []
    for i in range(n):
        tokens = rng.randint(100, 128)
        quality = ({"pass@1": float(rng.random() < 0.4)} if bench == "humaneval"
                   else {"bleu": rng.uniform(20, 35), "chrf": rng.uniform(45, 60)})
        out.append({
            "tokens": tokens, "seconds": tokens / (40 * SPEED[method] * rng.uniform(0.9, 1.1)),
            "cycles": round((tokens - 1) / (1.8 * SPEED[method] * rng.uniform(0.9, 1.1))) if speculative else 0,
            "relaxed": rng.randint(0, 10) if method.startswith("mars") else 0,
            "accepted": [rng.randint(0, POSITIONS) for _ in range(DEPTHS)] if speculative else [],
            "margins": [2 * rng.betavariate(5, 2) - 0.5 for _ in range(30)] if speculative else [],
            "quality": quality,
            "category": f"category{i % 3}",
        })
    return out


def fake_figures(qs: list[dict], method: str) -> dict:
    """One method's figures pooled as eval.reporting.metrics pools them."""
    tokens, seconds, cycles = (sum(q[k] for q in qs) for k in ("tokens", "seconds", "cycles"))
    counts = [0] * (len(EDGES) - 1)
    for m in (m for q in qs for m in q["margins"]):
        counts[min(int((m + 0.5) / 0.05), len(counts) - 1)] += 1
    theta = float(method.split("@")[1]) if method.startswith("mars@") else None
    return {
        "questions": len(qs), "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
        "cycles": cycles, "tau": sum(q["tokens"] - 1 for q in qs) / cycles if cycles else 1.0,
        "relaxed_frac": sum(q["relaxed"] for q in qs) / tokens,
        "acceptance_rate_by_depth": {str(d): sum(q["accepted"][d] for q in qs) / (POSITIONS * len(qs))
                                     for d in range(DEPTHS) if qs[0]["accepted"]},
        "margin_histogram": {"metric": "logit_ratio", "theta": theta, "edges": EDGES, "counts": counts},
        "quality": {k: sum(q["quality"][k] for q in qs) / len(qs) for k in qs[0]["quality"]},
    }


def fake_categories(qs: list[dict]) -> dict[str, dict]:
    """Per-category sums and rates, as eval.reporting.metrics.by_category writes them (before speedups)."""
    out = {}
    for cat in dict.fromkeys(q["category"] for q in qs):
        part = [q for q in qs if q["category"] == cat]
        tokens, seconds, cycles = (sum(q[k] for q in part) for k in ("tokens", "seconds", "cycles"))
        out[cat] = {"questions": len(part), "tokens": tokens, "seconds": seconds, "cycles": cycles,
                    "tokens_per_s": tokens / seconds,
                    "tau": sum(q["tokens"] - 1 for q in part) / cycles if cycles else 1.0}
    return out


def fake_summary(model: str, bench: str, temperature: float, methods: list[str], shard: tuple[int, int] | None = None,
                 n: int = 12) -> dict:
    """A summary.json as eval.run writes it (ratios only against baselines in the same run)."""
    pick = slice(shard[0], None, shard[1]) if shard else slice(None)
    questions = {m: fake_questions(model, bench, temperature, m, n)[pick] for m in methods}
    figs = {m: fake_figures(qs, m) for m, qs in questions.items()}
    categories = {m: fake_categories(qs) for m, qs in questions.items()}
    category_speedups(categories, "vanilla", [m for m in methods if is_plain(m)])
    for m, fig in figs.items():
        fig["by_category"] = categories[m]
    metric = BENCHES[bench][0]
    for m, fig in figs.items():
        for key, ref in (("speedup", "vanilla"), ("speedup_vs_generate", "generate")):
            if ref in figs and m != ref:
                fig[key] = fig["tokens_per_s"] / figs[ref]["tokens_per_s"]
        for key, ref in (("quality_recovery", "strict"), ("quality_recovery_vs_vanilla", "vanilla")):
            if ref in figs and m != ref:
                fig[key] = fig["quality"][metric] / figs[ref]["quality"][metric]
    plain = [m for m in figs if is_plain(m)]
    if plain:
        fastest = max(figs[m]["tokens_per_s"] for m in plain)
        for fig in figs.values():
            fig["speedup_vs_fastest"] = fig["tokens_per_s"] / fastest
    settings = {"model": model, "bench": bench, "temperature": temperature, "top_p": 1.0, "top_k": 0,
                "tree": {"total_tokens": 20, "depth": 4, "branching": 5}, "max_new_tokens": 128, "seed": 0,
                "methods": methods, "run_id": "synthetic", "shard": f"{shard[0]}/{shard[1]}" if shard else None}
    return {"machine": MACHINE, "settings": settings, "quality_metric": metric, "methods": figs}


def write_run(directory: Path, summary: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2))
    return directory


def build_results(root: Path) -> Path:
    """model-a: a humaneval run with model.generate, wmt19 in two shards (two levels down), a T=1 run;
    model-b: a θ sweep on humaneval (baseline and each MARS method in its own run dir) and a wmt19 run with
    one method's quality missing."""
    write_run(root / "a-humaneval", fake_summary("model-a", "humaneval", 0.0, ["generate", *METHODS]))
    for i in range(2):
        write_run(root / "a-wmt19" / f"shard{i}", fake_summary("model-a", "wmt19", 0.0, METHODS, shard=(i, 2)))
    write_run(root / "a-humaneval-t1", fake_summary("model-a", "humaneval", 1.0, ["vanilla", "strict", "mars@0.9"]))
    write_run(root / "sweep" / "base", fake_summary("model-b", "humaneval", 0.0, ["vanilla", "strict"]))
    for m in MARS:
        write_run(root / "sweep" / m, fake_summary("model-b", "humaneval", 0.0, [m]))
    unscored = fake_summary("model-b", "wmt19", 0.0, METHODS)
    for key in ("quality", "quality_recovery", "quality_recovery_vs_vanilla"):
        del unscored["methods"]["mars@0.95"][key]
    write_run(root / "b-wmt19", unscored)
    return root


# --- tests ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    root = build_results(tmp_path_factory.mktemp("results"))
    out = tmp_path_factory.mktemp("report")
    (out / "keep.txt").write_text("not ours")
    assert main([str(root), "--out", str(out)]) == 0
    return root, out


def expected_cell(fig: dict, metric: str, speedup: float | None = None, recovery: float | None = None,
                  mark: str = "") -> str:
    speedup = fig.get("speedup", 1.0) if speedup is None else speedup
    recovery = fig.get("quality_recovery", 1.0) if recovery is None else recovery
    q = fig["quality"][metric]
    quality = f"{100 * q:.1f}" if metric == "pass@1" else f"{q:.1f}"
    return f"{speedup:.2f}×{mark} / {fig['tau']:.2f} / {quality} ({recovery:.2f}{mark})"


def test_table_layout_and_cells(report):
    entries = merge_runs(load_runs([report[0]]))
    header, rows = table(entries, 0.0)
    assert header == ["model", "method", "humaneval (pass@1)", "wmt19 (bleu)"]
    order = ["vanilla", "strict", "mars@0.95", "mars@0.9", "mars@0.8"]  # from strict towards the loosest θ
    assert [r[:2] for r in rows] == [["model-a", "generate"]] + [[m, meth] for m in MODELS for meth in order]
    cells = {(r[0], r[1]): r[2:] for r in rows}
    plain = fake_summary("model-a", "humaneval", 0.0, ["generate", *METHODS])["methods"]
    for m in METHODS:
        assert cells["model-a", m][0] == expected_cell(plain[m], "pass@1")
    assert cells["model-a", "generate"][1] == DASH  # no generate run on wmt19
    header, rows = table(entries, 0.0, generate_cell)
    assert header == ["model", "method", "humaneval", "wmt19"]
    assert [r[2] for r in rows if r[0] == "model-a"] == [f"{plain[m].get('speedup_vs_generate', 1.0):.2f}×"
                                                         for m in ["generate", *order]]
    assert {r[3] for r in rows} == {r[2] for r in rows if r[0] == "model-b"} == {DASH}
    # The sweep's MARS runs had no baseline: ratios come from the baseline run dir, marked *.
    base = fake_summary("model-b", "humaneval", 0.0, ["vanilla", "strict"])["methods"]
    for m in MARS:
        fig = fake_summary("model-b", "humaneval", 0.0, [m])["methods"][m]
        speedup = fig["tokens_per_s"] / base["vanilla"]["tokens_per_s"]
        recovery = fig["quality"]["pass@1"] / base["strict"]["quality"]["pass@1"]
        assert cells["model-b", m][0] == expected_cell(fig, "pass@1", speedup, recovery, mark="*")
    header, rows = table(entries, 1.0)
    assert [r[:2] for r in rows] == [["model-a", m] for m in ("vanilla", "strict", "mars@0.9")]
    assert header == ["model", "method", "humaneval (pass@1)"]


def test_missing_figure_is_a_dash(report):
    entries = merge_runs(load_runs([report[0]]))
    row = next(r for r in table(entries, 0.0)[1] if r[:2] == ["model-b", "mars@0.95"])
    fig = fake_summary("model-b", "wmt19", 0.0, METHODS)["methods"]["mars@0.95"]
    assert row[3] == f"{fig['speedup']:.2f}× / {fig['tau']:.2f} / {DASH} ({DASH})"
    row = next(r for r in table(entries, 1.0)[1] if r[1] == "mars@0.9")
    assert row[2].count(DASH) == 0
    row = next(r for r in table(entries, 0.0)[1] if r[:2] == ["model-b", "mars@0.95"])
    assert "| " + " | ".join(row) + " |" in (report[1] / "report.md").read_text()


def test_shards_equal_unsharded(tmp_path):
    write_run(tmp_path / "whole", fake_summary("model-a", "wmt19", 0.0, METHODS))
    for i in range(3):
        write_run(tmp_path / "parts" / str(i), fake_summary("model-a", "wmt19", 0.0, METHODS, shard=(i, 3)))
    whole = {e.method: e for e in merge_runs(load_runs([tmp_path / "whole"]))}
    parts = {e.method: e for e in merge_runs(load_runs([tmp_path / "parts"]))}
    assert whole.keys() == parts.keys()
    for m, e in parts.items():
        assert len(e.run_dirs) == 3 and not e.derived and not e.notes
        for name in ("questions", "tokens", "seconds", "tokens_per_s", "tau", "relaxed_frac", "quality", "speedup",
                     "quality_recovery", "quality_recovery_vs_vanilla"):
            assert e.value(name) == pytest.approx(whole[m].value(name), rel=1e-12, abs=1e-12), (m, name)
        assert e.fig["quality"] == pytest.approx(whole[m].fig["quality"])
        assert e.fig["acceptance_rate_by_depth"] == pytest.approx(whole[m].fig["acceptance_rate_by_depth"])
        assert e.fig["margin_histogram"]["counts"] == whole[m].fig["margin_histogram"]["counts"]
        # Spec-Bench's per-category figures pool too: sums, then rates and speedups from the pooled sums.
        assert e.fig["by_category"].keys() == whole[m].fig["by_category"].keys() == {f"category{i}" for i in range(3)}
        for cat, fig in e.fig["by_category"].items():
            assert fig == pytest.approx(whole[m].fig["by_category"][cat], rel=1e-12, abs=1e-12), (m, cat)
        assert e.fig["by_category"]["category0"]["speedup"] != 1.0 or m == "vanilla"


def test_missing_shard_is_noted(tmp_path):
    write_run(tmp_path / "0", fake_summary("model-a", "wmt19", 0.0, ["strict"], shard=(0, 3)))
    write_run(tmp_path / "2", fake_summary("model-a", "wmt19", 0.0, ["strict"], shard=(2, 3)))
    (entry,) = merge_runs(load_runs([tmp_path]))
    assert entry.notes == ["2 of 3 shards present (0/3, 2/3)"]


def test_csv_round_trip(report):
    entries = merge_runs(load_runs([report[0]]))
    with (report[1] / "report.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(entries) == 2 * 2 * 5 + 1 + 3
    numbers = ("tokens_per_s", "speedup", "speedup_vs_generate", "speedup_vs_fastest", "tau", "relaxed_frac", "quality",
               "quality_recovery", "quality_recovery_vs_vanilla")
    for row, e in zip(rows, entries, strict=True):
        assert (row["model"], row["bench"], float(row["temperature"]), row["method"]) == (
            e.model, e.bench, e.temperature, e.method)
        assert row["theta"] == ("" if e.theta is None else str(e.theta))
        assert int(row["questions"]) == e.fig["questions"] and row["quality_metric"] == e.quality_metric
        for name in numbers:
            assert (float(row[name]) if row[name] else None) == e.value(name), name
        assert row["run_dirs"].split(";") == e.run_dirs
    sharded = [r for r in rows if r["bench"] == "wmt19" and r["model"] == "model-a"]
    assert all(len(r["run_dirs"].split(";")) == 2 for r in sharded)
    swept = {r["derived"] for r in rows if (r["model"], r["bench"]) == ("model-b", "humaneval") and r["method"] in MARS}
    assert swept == {"quality_recovery;quality_recovery_vs_vanilla;speedup;speedup_vs_fastest"}


def test_speedup_vs_fastest_is_against_the_fastest_plain_decoding(tmp_path):
    """A float32 run that also timed model.generate in bf16 (faster here) quotes every method against it,
    in the run and, marked derived, for a method swept in another run dir."""
    write_run(tmp_path / "base", fake_summary("model-a", "humaneval", 0.0,
                                              ["generate", "generate@bfloat16", "vanilla", "strict"]))
    write_run(tmp_path / "sweep", fake_summary("model-a", "humaneval", 0.0, ["mars@0.9"]))
    entries = {e.method: e for e in merge_runs(load_runs([tmp_path]))}
    fastest = entries["generate@bfloat16"].value("tokens_per_s")
    assert fastest > max(entries[m].value("tokens_per_s") for m in ("generate", "vanilla"))
    for method, e in entries.items():
        assert e.value("speedup_vs_fastest") == pytest.approx(e.value("tokens_per_s") / fastest), method
    assert entries["generate@bfloat16"].value("speedup_vs_fastest") == 1.0
    assert "speedup_vs_fastest" in entries["mars@0.9"].derived and not entries["strict"].derived
    assert [e.method for e in merge_runs(load_runs([tmp_path]))][:3] == ["generate", "generate@bfloat16", "vanilla"]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_plots_exist_and_are_linked(report, capsys):
    out = report[1]
    names = ["speedup_by_bench.png", "tau_by_bench.png"]
    groups = [(m, b, 0) for m in MODELS for b in BENCHES] + [("model-a", "humaneval", 1)]
    for kind in ("margins", "acceptance_by_depth", "theta"):
        names += [f"{kind}_{m}_{b}_T{t}.png" for m, b, t in groups]
    names += ["pareto_model-a_T0.png", "pareto_model-b_T0.png", "pareto_model-a_T1.png"]
    assert sorted(p.name for p in out.glob("*.png")) == sorted(names)
    md = (out / "report.md").read_text()
    for name in names:
        width, height = png_size(out / name)
        assert 300 <= width <= 3000 and 200 <= height <= 3000, (name, width, height)
        assert f"]({name})" in md
    assert (out / "keep.txt").read_text() == "not ours"
    assert MACHINE in md and "Legend" in md and "model.generate in the run's precision, temperature 0:" in md
    assert "Speedup over the fastest plain decoding timed in the run, paired per question" in md


def test_a_theta_panel_with_nothing_to_plot_has_no_empty_legend(tmp_path):
    """A benchmark without references (MT-bench): the θ sweep's recovery panel says "not available" and draws no
    legend, where matplotlib would warn of one with no labelled artists."""
    summary = fake_summary("model-a", "humaneval", 0.0, METHODS)
    summary["quality_metric"] = None
    for fig in summary["methods"].values():
        for key in ("quality", "quality_recovery", "quality_recovery_vs_vanilla"):
            fig.pop(key, None)  # strict has no recovery against itself, vanilla none against itself
    write_run(tmp_path / "runs" / "unscored", summary)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")
        assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "theta_model-a_humaneval_T0.png").exists()


def test_a_bar_panel_with_nothing_to_plot_has_no_empty_legend(tmp_path):
    """A temperature whose run has no vanilla (method=mars baselines=[strict]): its panel of the speedup over
    vanilla draws no bars and no legend, where matplotlib would warn of one with no labelled artists."""
    write_run(tmp_path / "runs" / "t0", fake_summary("model-a", "humaneval", 0.0, ["vanilla", "strict", "mars@0.9"]))
    write_run(tmp_path / "runs" / "t1", fake_summary("model-a", "humaneval", 1.0, ["strict", "mars@0.9"]))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")
        assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "speedup_by_bench.png").exists()


def test_duplicate_runs_are_an_error(tmp_path):
    summary = fake_summary("model-a", "humaneval", 0.0, ["vanilla", "strict"])
    write_run(tmp_path / "first", summary)
    write_run(tmp_path / "second", summary)
    with pytest.raises(ValueError, match="first.*second.*not distinct shards"):
        merge_runs(load_runs([tmp_path]))
    # The same directory named twice is read once.
    assert len(merge_runs(load_runs([tmp_path / "first", tmp_path / "first"]))) == 2


@pytest.mark.parametrize("content, message", [
    (None, "no summary.json"), ("{not json", "cannot read"), ("[1, 2]", "not a JSON object"),
    ('{"settings": {"model": "m", "bench": "b"}, "methods": {}}', "settings lack temperature"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "summary.json").write_text(content)
    with pytest.raises(ReportError, match=message) as error:
        load_runs([run])
    assert str(run) in str(error.value)
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not (tmp_path / "out").exists()


def test_path_that_is_not_a_directory(tmp_path, capsys):
    with pytest.raises(ReportError, match="not a directory"):
        load_runs([tmp_path / "missing"])
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "missing: not a directory" in capsys.readouterr().err


# --- costs on sampled drafts: upper bounds ---------------------------------------------------------

def sampled_drafts_summary(bound: int) -> dict:
    """A T=1 run on sampled drafts whose relaxing method reports its TV / KL as bounds on `bound` tokens
    (eval.run's cost_bound_tokens; strict's costs are exact zeros)."""
    data = fake_summary("model-a", "humaneval", 1.0, ["vanilla", "strict", "mars@0.9"])
    data["settings"].update(drafting="sample", drafting_reason="set explicitly (tree.drafting)")
    data["settings"]["tree"]["drafting"] = "sample"
    data["methods"]["strict"].update(tv_per_token=0.0, kl_per_token=0.0, cost_bound_tokens=0)
    data["methods"]["mars@0.9"].update(tv_per_token=0.0125, kl_per_token=0.031, cost_bound_tokens=bound)
    return data


def cost_rows(markdown: str) -> dict[str, str]:
    """The cost table of temperature 1 in report.md: method -> its cell."""
    part = markdown.split("per emitted token (mars/accounting/cost.py", 1)[1].split("\n\n", 2)[1]
    return {cells[1]: cells[2] for cells in ([c.strip() for c in line.strip("|").split("|")]
                                             for line in part.splitlines()[2:])}


@pytest.mark.parametrize("bound", [0, 12])
def test_costs_are_marked_as_upper_bounds_exactly_when_the_run_says_so(tmp_path, bound):
    write_run(tmp_path / "run", sampled_drafts_summary(bound))
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    cells = cost_rows(md)
    assert cells["strict"] == "0.0000 / 0.0000"  # exact whatever the drafts: strict reports no bound
    if bound:
        assert cells["mars@0.9"] == "≤ 0.0125 / ≤ 0.0310"
        assert "Cost of the relaxation per emitted token (mars/accounting/cost.py; ≤: an upper bound): TV / KL" in md
        assert "≤: an upper bound on the cost, not the exact cost" in md and "Exact cost" not in md
    else:
        assert cells["mars@0.9"] == "0.0125 / 0.0310" and "≤" not in md
        assert "Exact cost of the relaxation per emitted token (mars/accounting/cost.py): TV / KL" in md


def test_the_drafting_mode_is_among_the_settings(tmp_path):
    write_run(tmp_path / "sampled", sampled_drafts_summary(3))
    write_run(tmp_path / "greedy", fake_summary("model-a", "humaneval", 0.0, ["vanilla", "strict"]))
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| run dir"))
    # It differs between the runs, so it is stated per run dir, next to the tree.
    assert [c.strip() for c in header.strip("|").split("|")][:4] == ["run dir", "temperature", "tree", "drafting"]
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith(f"| {tmp_path}")}
    assert "| sample — set explicitly (tree.drafting) |" in rows[str(tmp_path / "sampled")]
    assert "| topk |" in rows[str(tmp_path / "greedy")]  # greedy (and older summaries): top-k drafts


def test_cost_cell_marks_bounds_only_when_sampling():
    (entry,) = [e for e in merge_runs([{**sampled_drafts_summary(5), "run_dir": "/x"}]) if e.method == "mars@0.9"]
    assert cost_cell(entry) == "≤ 0.0125 / ≤ 0.0310"
    entry.fig["cost_bound_tokens"] = 0
    assert cost_cell(entry) == "0.0125 / 0.0310"
    del entry.fig["cost_bound_tokens"]  # summaries from before sampled drafts
    assert cost_cell(entry) == "0.0125 / 0.0310"
    entry.temperature, entry.fig["argmax_mismatch"], entry.fig["cost_bound_tokens"] = 0.0, 0.25, 5
    assert cost_cell(entry).startswith("0.2500 / ")  # greedy costs are exact


def test_a_kl_left_infinite_on_some_tokens_is_stated_in_the_cost_table(tmp_path):
    """kl_per_token is the mean over the tokens whose KL is finite; where some are +inf (`kl_infinite_tokens`,
    on sampled drafts most relaxing positions' bound) the KL per token is +inf and the cell says on how many
    tokens, as the zoo's table does, pooled over shards; the report explains it."""
    for i in range(2):  # two shards of one run: 3 + 4 tokens with an infinite KL
        data = sampled_drafts_summary(12)
        data["settings"]["shard"] = f"{i}/2"
        data["methods"]["mars@0.9"]["kl_infinite_tokens"] = 3 + i
        data["methods"]["strict"]["kl_infinite_tokens"] = 0
        write_run(tmp_path / "run" / str(i), data)
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    cells = cost_rows(md)
    assert cells["mars@0.9"] == "≤ 0.0125 / ≤ 0.0310 (+∞ on 7 tokens)"
    assert cells["strict"] == "0.0000 / 0.0000"
    assert "the KL shown is the mean over the other tokens only" in md
    (entry,) = [e for e in merge_runs([{**sampled_drafts_summary(0), "run_dir": "/x"}]) if e.method == "mars@0.9"]
    entry.fig["kl_infinite_tokens"] = 2
    assert cost_cell(entry) == "0.0125 / 0.0310 (+∞ on 2 tokens)"  # exact costs (top-k drafts) too
    entry.fig["kl_per_token"] = None  # every token's KL infinite: no finite mean, the count still shown
    assert cost_cell(entry) == "0.0125 / – (+∞ on 2 tokens)"
    entry.temperature, entry.fig["argmax_mismatch"] = 0.0, 0.25
    assert "∞" not in cost_cell(entry)  # greedy: mismatch / regret, no KL


def test_a_batch_sweep_reports_each_batch_size_against_its_own_baselines_and_plots_it(tmp_path):
    """Runs of one model × bench × temperature at batch sizes 1, 4 and 16: each batch size's methods are
    rows of their own (`strict[B=4]`), their ratios are to the plain decoding of the same batch size, and
    the report draws throughput and speedup against the batch size."""
    for size in (1, 4, 16):
        summary = fake_summary("model-a", "humaneval", 0.0, ["generate", "vanilla", "strict", "mars@0.9"])
        for fig in summary["methods"].values():
            fig.update(batch_size=size, tokens_per_s=fig["tokens_per_s"] * size ** 0.5)
        summary["settings"]["batch_size"] = size
        write_run(tmp_path / "runs" / f"b{size}", summary)
    entries = {e.method: e for e in merge_runs(load_runs([tmp_path / "runs"]))}
    assert {"strict", "strict[B=4]", "vanilla[B=16]", "mars@0.9[B=16]"} <= set(entries)
    for size in (4, 16):
        strict, plains = entries[f"strict[B={size}]"], [entries[f"{m}[B={size}]"] for m in ("generate", "vanilla")]
        fastest = max(p.value("tokens_per_s") for p in plains)
        assert strict.value("speedup_vs_fastest") == pytest.approx(strict.value("tokens_per_s") / fastest)
        assert entries[f"mars@0.9[B={size}]"].theta == 0.9
    out = tmp_path / "report"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert png_size(out / "batch_model-a_humaneval_T0.png")[0] > 600


def test_speed_figures_timed_under_contention_are_marked(tmp_path):
    from test_tracking import record  # an answer record as eval.run writes it

    from eval.reporting.metrics import summarize

    def timed(rec: dict, others_cpu_s: float) -> dict:
        wall = sum(rec["choices"][0]["wall_time"])
        return {**rec, "timing": {"waited_s": 0.0, "exclusive": others_cpu_s == 0, "wall_s": wall,
                                  "others_cpu_s": others_cpu_s, "contended": others_cpu_s > 0}}

    calm = [timed(record(q, [20], [5], [1.0]), 0.0) for q in range(4)]
    # strict: one of four seconds shared with another job's half a core (share 0.125 > CONTENDED_SHARE)
    busy = [timed(record(q, [40], [5], [1.0]), 0.5 if q == 0 else 0.0) for q in range(4)]
    figures = summarize({"vanilla": calm, "strict": busy}, plain=["vanilla"])
    assert figures["strict"]["contended_share"] == pytest.approx(0.125) and figures["strict"]["speed_contended"]
    assert figures["vanilla"]["contended_share"] == 0 and not figures["vanilla"]["speed_contended"]
    assert figures["strict"]["contended_questions"] == 1 and figures["strict"]["unchecked_questions"] == 0
    # The speedup of a calm method over a contended baseline is contended too.
    figures = summarize({"vanilla": busy, "strict": calm}, plain=["vanilla"])
    assert figures["strict"]["speed_contended"]

    summary = fake_summary("model-a", "humaneval", 0.0, ["vanilla", "strict"])
    summary["methods"]["strict"]["speed_contended"] = True
    write_run(tmp_path / "run", summary)
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| model-a |")}
    assert "×†" in rows["strict"] and "†" not in rows["vanilla"]
    assert "`†`: timed while another process of ours computed" in text


# --- the paired speedup over the fastest plain decoding -------------------------------------------

def answers(rates: list[float], tokens: list[int]) -> list[dict]:
    """Answer records (`test_tracking.record`) of one method: question i's `tokens[i]` new tokens at `rates[i]`
    tokens/s."""
    from test_tracking import record

    return [record(q, [n], [max(n // 3, 1)], [n / rate]) for q, (rate, n) in enumerate(zip(rates, tokens, strict=True))]


def test_paired_speedup_of_a_method_twice_as_fast_on_each_question_is_two():
    from eval.reporting.metrics import paired_ratio, summarize

    tokens = [40, 64, 17, 90, 33, 58, 71]
    plain = [10.0, 12.0, 9.0, 11.0, 10.5, 8.0, 13.0]
    figures = summarize({"vanilla": answers(plain, tokens), "strict": answers([2 * r for r in plain], tokens)},
                        plain=["vanilla"])
    assert figures["strict"]["speedup_vs_fastest_paired"] == pytest.approx(2.0, rel=1e-12)
    assert figures["strict"]["speedup_vs_fastest_paired_n"] == len(tokens)
    assert figures["vanilla"]["speedup_vs_fastest_paired"] == 1.0 and figures["vanilla"]["fastest_plain"] == "vanilla"
    # Under five pairs nothing is trimmed; a pair with no rate has no log ratio; no pairs, no figure.
    assert paired_ratio([2.0, 8.0], [1.0, 1.0]) == (pytest.approx(4.0), 2)
    assert paired_ratio([2.0, 0.0], [1.0, 1.0]) == (pytest.approx(2.0), 1)
    assert paired_ratio([], []) is None


@pytest.mark.parametrize("n", [5, 8, 12])
def test_one_burst_on_the_plain_decoding_moves_the_total_ratio_not_the_paired_figure(n):
    """A plain-decoding answer slowed 5x (a burst of background load landed on it) inflates the total
    ratio; the paired figure trims that question's ratio and stays at the true 2x."""
    from eval.reporting.metrics import summarize

    rng = random.Random(n)
    tokens = [rng.randint(40, 128) for _ in range(n)]
    plain = [rng.uniform(8.0, 12.0) for _ in range(n)]
    fast = [2 * r for r in plain]
    burst = max(range(n), key=lambda q: tokens[q])  # the longest answer: the burst costs the total ratio most
    slowed = [r / 5 if q == burst else r for q, r in enumerate(plain)]
    figures = summarize({"vanilla": answers(slowed, tokens), "strict": answers(fast, tokens)}, plain=["vanilla"])
    strict = figures["strict"]
    assert strict["speedup_vs_fastest"] > 2.0 * 1.1  # the total ratio moved by more than 10%
    assert strict["speedup_vs_fastest_paired"] == pytest.approx(2.0, rel=0.01)
    assert strict["speedup_vs_fastest_paired_n"] == n


def test_the_report_quotes_the_paired_speedup_over_the_fastest_and_keeps_the_total_in_the_csv(tmp_path):
    from eval.reporting.tables import TOTAL, fastest_cell

    summary = fake_summary("model-a", "humaneval", 0.0, ["vanilla", "strict"])
    summary["methods"]["strict"].update(speedup_vs_fastest_paired=1.75, speedup_vs_fastest_paired_n=12)
    summary["methods"]["vanilla"].update(speedup_vs_fastest_paired=1.0, speedup_vs_fastest_paired_n=12)
    write_run(tmp_path / "run", summary)
    write_run(tmp_path / "sweep", fake_summary("model-a", "humaneval", 0.0, ["mars@0.9"]))
    entries = {e.method: e for e in merge_runs(load_runs([tmp_path]))}
    assert fastest_cell(entries["strict"]) == "1.75×"
    total = entries["mars@0.9"].value("speedup_vs_fastest")  # against vanilla of another run dir: not paired
    assert fastest_cell(entries["mars@0.9"]) == f"{total:.2f}×*{TOTAL}"
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "paired per question (20% trimmed geometric mean of the per-question tokens/s ratios" in md
    with (tmp_path / "out" / "report.csv").open(newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    strict = summary["methods"]["strict"]
    assert float(rows["strict"]["speedup_vs_fastest"]) == pytest.approx(strict["speedup_vs_fastest"])
    assert float(rows["strict"]["speedup_vs_fastest_paired"]) == 1.75
    assert rows["strict"]["speedup_vs_fastest_paired_n"] == "12" and rows["mars@0.9"]["speedup_vs_fastest_paired"] == ""


def test_the_run_table_shows_the_paired_speedup_in_its_own_column():
    from eval.reporting.metrics import PAIRED_HEADER, PAIRED_NOTE, format_table

    keys = ("tokens_per_s", "speedup_vs_fastest", "speedup_vs_fastest_paired")
    speeds = {"vanilla": (10.0, 1.0, 1.0), "strict": (25.0, 2.5, 2.0)}
    table = format_table({m: dict(zip(keys, v, strict=True)) for m, v in speeds.items()})
    header, _, _, strict, note = table.splitlines()
    assert header.index("vs fastest") < header.index(PAIRED_HEADER)
    assert "2.50x" in strict and "2.00x" in strict and note == PAIRED_NOTE
