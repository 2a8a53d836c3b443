"""eval.zoo: the rule sweep, its eval.run baselines, the Pareto fronts, report.md, zoo.json and the plot.

The summaries here are SYNTHETIC TEST FIXTURES in the format eval.run writes, with invented figures
chosen so that each Pareto front can be worked out by hand. They measure nothing.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from eval import zoo as zoo_command
from eval.config.methods import method_spec
from eval.config.paths import REPO_ROOT
from eval.config.schema import validate
from eval.reporting import zoo_sweep, zoo_tables
from eval.reporting.plots import pyplot
from mars.rules import BUILT_IN, RULES, make_rule, rule_class
from mars.rules.base import Rule, TargetView

MACHINE = "SYNTHETIC TEST FIXTURE (invented numbers, not a measurement)"
FASTEST = 100.0  # generate@bfloat16's tokens/s in every fixture


def rule_of(method: str) -> dict | None:
    spec = method_spec(method)
    if spec.kind in ("generate", "vanilla"):
        return None
    rule = spec.rule()
    return {"name": rule.name, **rule.params()}


def figures(method: str, speed: float, tau: float = 1.0, relaxed: float = 0.0, cost: float | None = None,
            temperature: float = 1.0, quality: float = 0.5, kl_infinite: int = 0, bound: int | None = None,
            runs: str = "synthetic") -> dict:
    """One method's figures as eval.run writes them: `speed` over the fastest plain (generate@bfloat16);
    `bound` the cost_bound_tokens of a run on sampled drafts (absent before sampled drafting)."""
    fig = {"questions": 8, "tokens": 800, "tokens_per_s": speed * FASTEST, "speedup_vs_fastest": speed,
           "fastest_plain": "generate@bfloat16", "speedup": speed * FASTEST / 80.0, "tau": tau,
           "relaxed_frac": relaxed, "kl_infinite_tokens": kl_infinite,
           "tv_per_token": None, "kl_per_token": None, "argmax_mismatch": None, "logprob_regret": None,
           "quality": {"parse_rate": quality, "token_prob": 0.3}, "run_dir": f"/{runs}/{method}-T{temperature:g}"}
    if bound is not None:
        fig["cost_bound_tokens"] = bound
    if temperature > 0 and rule_of(method):
        fig.update(tv_per_token=cost / 2, kl_per_token=cost)
    elif rule_of(method):
        fig.update(argmax_mismatch=cost, logprob_regret=cost * 3)
    if method != "vanilla":
        fig["identical_to_vanilla"] = 1.0 if method == "strict" and temperature == 0 else 0.0
    if rule_of(method):
        fig["rule"] = rule_of(method)
    return fig


PLAIN_SPEED = {"generate": 0.6, "generate@bfloat16": 1.0, "vanilla": 0.8}
# T=1: (speed vs fastest, KL per token). Front by hand: strict, ears@0.1, mars@0.98, mars@0.9,
# typical@0.15[delta=100], typical@0.09. mars@0.8 loses to mars@0.9 (slower, costlier), topm@2 to
# typical@0.15[delta=100], and entropy@1 has infinite KL on 2 tokens (so loses to the faster typical@0.09).
T1 = {"strict": (1.50, 0.0), "mars@0.98": (1.55, 0.002), "mars@0.9": (1.60, 0.010), "mars@0.8": (1.58, 0.030),
      "typical@0.15[delta=100]": (1.70, 0.050), "typical@0.09": (1.80, 0.300), "topm@2": (1.65, 0.060),
      "entropy@1": (1.75, 0.200), "ears@0.1": (1.52, 0.001)}
T1_FRONT = {"strict", "ears@0.1", "mars@0.98", "mars@0.9", "typical@0.09", "typical@0.15[delta=100]"}
# Against TV per token (finite for every point; half the KL here) entropy@1 joins: faster than
# typical@0.15[delta=100] and cheaper than typical@0.09.
T1_TV_FRONT = T1_FRONT | {"entropy@1"}
# T=0: (speed, argmax mismatch, parse rate). Cost front: strict, typical@0.09 (beats mars@0.9 on both), entropy@1.
# Quality front (higher quality, higher speed): typical@0.09 (beats strict and mars@0.9 on both), entropy@1.
T0 = {"strict": (1.45, 0.0, 0.50), "mars@0.9": (1.60, 0.05, 0.45), "typical@0.09": (1.62, 0.04, 0.55),
      "entropy@1": (1.70, 0.10, 0.40)}
T0_COST_FRONT, T0_QUALITY_FRONT = {"strict", "typical@0.09", "entropy@1"}, {"typical@0.09", "entropy@1"}


TREES = {0.0: {"total_tokens": 8, "depth": 4, "branching": 2},  # as calibrated: greedy and sampled differ
         1.0: {"total_tokens": 20, "depth": 6, "branching": 5, "adaptive": True}}


def summary(temperature: float, methods: dict, model: str = "embedded", bench: str = "stdlib_heldout",
            drafting: str | None = None) -> dict:
    """A job's summary; `drafting` the resolved tree.drafting eval.run records (None: a summary from before it)."""
    settings = {"model": model, "bench": bench, "temperature": temperature, "top_p": 1.0, "top_k": 0,
                "questions": 8, "max_new_tokens": 96, "tree": TREES[temperature],
                "dtype": "float32", "seed": 0, "methods": list(methods), "shard": None}
    if drafting is not None:
        settings.update(tree={**TREES[temperature], "adaptive": False, "drafting": drafting}, drafting=drafting,
                        drafting_reason="set explicitly (tree.drafting)" if temperature > 0
                        else "greedy decoding drafts the head's top-k")
    return {"machine": MACHINE, "settings": settings, "quality_metric": "parse_rate", "methods": methods}


def t1_summary(**kw) -> dict:
    methods = {m: figures(m, s, temperature=1.0) for m, s in PLAIN_SPEED.items()}
    for m, (speed, kl) in T1.items():
        methods[m] = figures(m, speed, tau=2 * speed, relaxed=kl, cost=kl, temperature=1.0,
                             kl_infinite=2 if m == "entropy@1" else 0)
    return summary(1.0, methods, **kw)


# T=1 on sampled drafts: (speed, KL per token, upper bounds as eval.run reports them there). Front by hand:
# strict, ears@0.1, mars@0.98, mars@0.9, typical@0.15[delta=100], topm@2, entropy@1 (finite KL here);
# mars@0.8 loses to mars@0.9 and typical@0.09 to topm@2. Not the top-k front: each mode has its own.
T1S = {"strict": (1.90, 0.0), "mars@0.98": (1.95, 0.004), "mars@0.9": (2.05, 0.020), "mars@0.8": (2.00, 0.050),
       "typical@0.15[delta=100]": (2.10, 0.080), "typical@0.09": (2.08, 0.400), "topm@2": (2.20, 0.090),
       "entropy@1": (2.30, 0.500), "ears@0.1": (1.92, 0.002)}
T1S_FRONT = {"strict", "ears@0.1", "mars@0.98", "mars@0.9", "typical@0.15[delta=100]", "topm@2", "entropy@1"}
BOUND_TOKENS = 37  # sampled positions a relaxing rule's costs bound rather than give exactly


def t1_sampled_summary(bound: int = BOUND_TOKENS, **kw) -> dict:
    """The T=1 job again with tree.drafting=sample, in run directories of its own; strict's costs are
    exact (0), the relaxing rules' are upper bounds on `bound` tokens (none when 0)."""
    runs = "synthetic-sampled"
    methods = {m: figures(m, s, temperature=1.0, runs=runs) for m, s in PLAIN_SPEED.items()}
    for m, (speed, kl) in T1S.items():
        methods[m] = figures(m, speed, tau=2 * speed, relaxed=kl, cost=kl, temperature=1.0, runs=runs,
                             bound=0 if m == "strict" else bound)
    return summary(1.0, methods, drafting="sample", **kw)


def t0_summary(**kw) -> dict:
    methods = {m: figures(m, s, temperature=0.0) for m, s in PLAIN_SPEED.items()}
    for m, (speed, mismatch, parses) in T0.items():
        methods[m] = figures(m, speed, tau=2 * speed, relaxed=mismatch, cost=mismatch, temperature=0.0,
                             quality=parses)
    return summary(0.0, methods, **kw)


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    files = [write(root / "summary_t0.json", t0_summary()), write(root / "summary_t1.json", t1_summary())]
    assert zoo_command.main([*map(str, files), "--out", str(root / "out")]) == 0
    return root / "out"


def rows(markdown: str, temperature: float) -> dict[str, list[str]]:
    """The table rows of one temperature's section of report.md, by method."""
    section = markdown.split(f"### Temperature {temperature:g}\n", 1)[1].split("\n## ", 1)[0].split("\n### ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


# --- the sweep --------------------------------------------------------------------------------------

def test_the_sweep_is_what_each_rule_declares(monkeypatch):
    """The zoo sweeps each rule at the points the rule declares (`Rule.sweep`, beside its `relaxing`):
    every built-in rule, strict first; a rule registered later with sweep points joins it, one without
    stays out."""
    assert list(zoo_sweep.SWEEP)[0] == "strict" and set(zoo_sweep.SWEEP) == set(BUILT_IN)
    for name in BUILT_IN:
        assert zoo_sweep.SWEEP[name] == rule_class(name).sweep, name  # the literals as declared, no copy in the zoo
        assert 3 <= len(rule_class(name).sweep) <= 4 or name == "strict", name

    @dataclass(frozen=True)
    class Swept(Rule):
        name: ClassVar[str] = "test_swept"
        sweep: ClassVar[tuple[dict, ...]] = ({"gap": 0.5}, {"gap": 0.2})
        gap: float = 0.5

    @dataclass(frozen=True)
    class Unswept(Rule):
        name: ClassVar[str] = "test_unswept"

    monkeypatch.setitem(RULES, Swept.name, Swept)  # registered for this test only
    monkeypatch.setitem(RULES, Unswept.name, Unswept)
    assert zoo_sweep.swept_rules() == [*zoo_sweep.SWEEP, "test_swept"]


def test_the_sweep_covers_every_builtin_rule_and_ears_only_when_sampling():
    greedy, sampled = ([r.display for r in zoo_sweep.points(t)] for t in (0.0, 1.0))
    assert greedy[0] == sampled[0] == "strict"
    assert not any(d.startswith("ears") for d in greedy) and sum(d.startswith("ears") for d in sampled) == 4
    assert sampled[:len(greedy)] == greedy and len(set(sampled)) == len(sampled) == 1 + 4 + 4 + 4 + 4 + 4
    assert greedy[greedy.index("typical@0.5[delta=100]"):][:4] == ["typical@0.5[delta=100]", "typical@0.3[delta=100]",
                                                                   "typical@0.15[delta=100]", "typical@0.09"]
    assert zoo_sweep.baselines(0.0) == ["generate", "vanilla", *greedy[1:]]  # the job's method is strict


def test_each_rule_relaxes_at_least_as_much_at_each_next_point():
    """Along a rule's sweep the relaxation only grows, on a random tree: every child accepted outright at
    one point still is at the next, the strict test's tolerance never shrinks, and the last point relaxes
    more than the first."""
    gen = torch.Generator().manual_seed(0)
    n, vocab = 40, 12
    kids = torch.zeros(n, n, dtype=torch.bool)
    for j in range(1, n):
        kids[torch.randint(0, j, (1,), generator=gen), j] = True
    for greedy in (False, True):
        logits = torch.randn(n, vocab, generator=gen) * torch.rand(n, 1, generator=gen) * 6
        view = TargetView(logits, torch.randint(0, vocab, (n,), generator=gen), kids, greedy)
        for name, sweep in zoo_sweep.SWEEP.items():
            relaxations = [make_rule(name, **p).relax(view) for p in sweep]
            for a, b in zip(relaxations[:-1], relaxations[1:], strict=True):
                assert not (a.outright & ~b.outright).any(), name
                if a.tolerance is not None:
                    assert (b.tolerance >= a.tolerance).all(), name
            amounts = [float(r.outright.sum()) + (0.0 if r.tolerance is None else float(r.tolerance.sum()))
                       for r in relaxations]
            assert amounts[-1] > amounts[0] or name == "strict", (name, amounts)


@pytest.mark.parametrize("temperature,preset", [(0.0, "t0"), (1.0, "t1")])
def test_the_baselines_line_composes_into_a_valid_zoo_job(temperature, preset, capsys):
    """What `python -m eval.zoo --baselines T` prints is one Hydra value that eval.run's config accepts."""
    assert zoo_command.main(["--baselines", f"{temperature:g}"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert OverridesParser.create().parse_override(f"baselines={line}").value() == zoo_sweep.baselines(temperature)
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        run = validate(compose("config", overrides=["method=strict", f"sampling={preset}", f"baselines={line}"]))
    assert run.baselines == zoo_sweep.baselines(temperature) and run.method.kind == "strict"
    assert [method_spec(b).name for b in run.baselines] == run.baselines  # display names round-trip


# --- fronts -----------------------------------------------------------------------------------------

def test_pareto_keeps_exactly_the_undominated_points():
    pts = [("a", 0.0, 1.0), ("b", 0.1, 1.2), ("c", 0.2, 1.1), ("d", 0.2, 1.3), ("e", 0.2, 1.3), ("f", math.inf, 2.0),
           ("g", 0.5, 1.3)]
    assert zoo_sweep.pareto(pts) == {"a", "b", "d", "e", "f"}  # c loses to b; g ties d on speed but costs more
    assert zoo_sweep.pareto([(n, -x, y) for n, x, y in pts], lower_x_is_better=False) == {"a", "b", "d", "e", "f"}


# --- the report -------------------------------------------------------------------------------------

def test_t1_table_has_every_rule_its_kl_and_its_front(report):
    table = rows((report / "report.md").read_text(), 1.0)
    assert list(table) == ["generate", "generate@bfloat16", "vanilla", "strict", "mars@0.98", "mars@0.9", "mars@0.8",
                           "typical@0.15[delta=100]", "typical@0.09", "topm@2", "entropy@1", "ears@0.1"]
    assert table["mars@0.9"] == ["mars@0.9", "theta 0.9, margin logit_ratio, fallback strict", "1.60×", "2.00×", "3.20",
                                 "1.0%", "0.005", "0.01", "50.0", "1.00", "0%", "KL, TV"]
    assert table["strict"][6:8] == ["0", "0"] and table["strict"][-1] == "KL, TV"
    assert table["entropy@1"][7] == "0.2 (+∞ on 2 tokens)" and table["entropy@1"][-1] == "TV"
    assert table["generate@bfloat16"][:3] == ["generate@bfloat16", "plain decoding", "1.00×"]
    assert {m for m, cells in table.items() if "KL" in cells[-1].split(", ")} == T1_FRONT
    assert {m for m, cells in table.items() if "TV" in cells[-1].split(", ")} == T1_TV_FRONT
    assert "parse_rate (same for every rule)" in (report / "report.md").read_text()


def test_t0_table_has_mismatch_regret_quality_and_both_fronts(report):
    table = rows((report / "report.md").read_text(), 0.0)
    assert list(table) == ["generate", "generate@bfloat16", "vanilla", "strict", "mars@0.9", "typical@0.09",
                           "entropy@1"]
    assert table["typical@0.09"][2:] == ["1.62×", "2.02×", "3.24", "4.0%", "4.0%", "0.12", "55.0", "1.10", "0%",
                                         "mismatch, quality"]
    assert table["strict"][-3:] == ["1.00", "100%", "mismatch"] and table["mars@0.9"][-1] == ""
    assert {m for m, cells in table.items() if "mismatch" in cells[-1]} == T0_COST_FRONT
    assert {m for m, cells in table.items() if "quality" in cells[-1]} == T0_QUALITY_FRONT


def test_settings_are_stated_once_and_the_tree_per_temperature(report):
    text = (report / "report.md").read_text()
    assert ("Settings of every run: model embedded; bench stdlib_heldout; questions 8; max_new_tokens 96; "
            "dtype float32; seed 0; top_p 1.0; top_k 0.") in text
    t1, t0 = text.split("### Temperature 1\n")[1].split("### Temperature 0\n")
    assert "Settings: tree 20 nodes / depth 6 / 5 children (adaptive: at most)." in t1
    assert "Settings: tree 8 nodes / depth 4 / 2 children." in t0
    assert "Fastest plain decoding timed: generate@bfloat16." in t0


def test_zoo_json_holds_the_figures_and_fronts(report):
    data = json.loads((report / "zoo.json").read_text())
    assert data["sweep"]["entropy"] == ["entropy@5", "entropy@4", "entropy@3", "entropy@1"]
    t1, t0 = data["groups"]
    assert (t1["temperature"], t0["temperature"], t1["plot"]) == (1.0, 0.0, "pareto.png")
    assert (t1["cost_figure"], t0["cost_figure"], t1["quality_moves"], t0["quality_moves"]) == \
        ("kl_per_token", "argmax_mismatch", False, True)
    methods = {m["method"]: m for m in t1["methods"]}
    assert {m for m, f in methods.items() if f["pareto"].get("cost")} == T1_FRONT
    assert methods["mars@0.8"]["kl_per_token"] == 0.03 and methods["mars@0.8"]["speedup_vs_fastest"] == 1.58
    assert methods["mars@0.8"]["rule"] == {"name": "mars", "theta": 0.8, "margin": "logit_ratio", "fallback": "strict"}
    assert methods["vanilla"]["rule"] is None and methods["vanilla"]["pareto"] == {}
    t0_methods = {m["method"]: m for m in t0["methods"]}
    assert {m for m, f in t0_methods.items() if f["pareto"].get("quality")} == T0_QUALITY_FRONT
    assert t0_methods["entropy@1"]["quality"] == 0.40 and t0_methods["entropy@1"]["argmax_mismatch"] == 0.10


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_plot_has_a_cost_panel_per_temperature_and_a_quality_panel_where_quality_moves(report):
    groups = zoo_sweep.groups(zoo_sweep.load([report.parent / "summary_t0.json", report.parent / "summary_t1.json"]))
    assert [(g.temperature, panel) for g, panel in zoo_tables.panels(groups)] == [
        (1.0, "cost"), (1.0, "tv"), (0.0, "cost"), (0.0, "quality")]
    width, height = png_size(report / "pareto.png")
    assert width > 3.5 * height  # four panels side by side
    assert "![Pareto plot](pareto.png)" in (report / "report.md").read_text()


def test_run_dirs_and_several_models_give_one_plot_each_and_count_shared_answers_once(tmp_path):
    write(tmp_path / "runs" / "a" / "strict-T1-x" / "summary.json", t1_summary(model="model-a"))
    copy = write(tmp_path / "summary_a.json", t1_summary(model="model-a"))  # eval.run's summary_path copy
    write(tmp_path / "runs" / "b" / "strict-T0-y" / "summary.json", t0_summary(model="model-b", bench="gsm8k"))
    out = tmp_path / "out"
    assert zoo_command.main([str(tmp_path / "runs"), str(copy), "--out", str(out)]) == 0
    data = json.loads((out / "zoo.json").read_text())
    assert [(g["model"], g["bench"], g["plot"]) for g in data["groups"]] == [
        ("model-a", "stdlib_heldout", "pareto_model-a_stdlib_heldout.png"),
        ("model-b", "gsm8k", "pareto_model-b_gsm8k.png")]
    assert len(data["groups"][0]["methods"]) == len(PLAIN_SPEED) + len(T1)  # the copy's answers are the run's: once
    assert all((out / g["plot"]).exists() for g in data["groups"]) and not (out / "pareto.png").exists()


def test_missing_input_exits_2_naming_it(tmp_path, capsys):
    assert zoo_command.main([str(tmp_path / "nope.json"), "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'nope.json'}: no such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        zoo_command.main([str(tmp_path)])  # no --out
    assert e.value.code == 2


# --- two drafting modes at one temperature -----------------------------------------------------------

@pytest.fixture(scope="module")
def drafting_report(tmp_path_factory) -> Path:
    """The zoo of DRAFTING=both: T=0, and T=1 on top-k drafts and again on sampled drafts."""
    root = tmp_path_factory.mktemp("zoo-drafting")
    files = [write(root / "summary_t0.json", t0_summary(drafting="topk")),
             write(root / "summary_t1.json", t1_summary(drafting="topk")),
             write(root / "summary_t1_sampled.json", t1_sampled_summary())]
    assert zoo_command.main([*map(str, files), "--out", str(root / "out")]) == 0
    return root / "out"


def section(markdown: str, heading: str) -> str:
    return markdown.split(f"### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ")[0]


def section_rows(markdown: str, heading: str) -> dict[str, list[str]]:
    lines = [line for line in section(markdown, heading).splitlines() if line.startswith("| ")]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


def test_two_drafting_modes_give_a_table_and_a_front_each(drafting_report):
    data = json.loads((drafting_report / "zoo.json").read_text())
    assert [(g["temperature"], g["drafting"], g["cost_is_upper_bound"], g["plot"]) for g in data["groups"]] == [
        (1.0, "topk", False, "pareto.png"), (1.0, "sample", True, "pareto.png"), (0.0, "topk", False, "pareto.png")]
    fronts = [{m["method"] for m in g["methods"] if m["pareto"].get("cost")} for g in data["groups"][:2]]
    assert fronts == [T1_FRONT, T1S_FRONT]  # merged per mode: the same method twice is two points, not shards
    sampled = {m["method"]: m for m in data["groups"][1]["methods"]}
    assert sampled["mars@0.9"]["speedup_vs_fastest"] == 2.05 and sampled["mars@0.9"]["cost_bound_tokens"] == 37
    text = (drafting_report / "report.md").read_text()
    assert "### Temperature 1\n" not in text and "### Temperature 0\n" in text  # greedy drafts top-k only
    topk, sample = (section_rows(text, f"Temperature 1, {d}") for d in ("top-k drafts", "sampled drafts"))
    assert list(topk) == list(sample) and len(topk) == len(PLAIN_SPEED) + len(T1)
    assert topk["mars@0.9"][2] == "1.60×" and sample["mars@0.9"][2] == "2.05×"
    assert {m for m, cells in topk.items() if "KL" in cells[-1].split(", ")} == T1_FRONT
    assert {m for m, cells in sample.items() if "KL" in cells[-1].split(", ")} == T1S_FRONT
    assert {m for m, cells in sample.items() if "TV" in cells[-1].split(", ")} == T1S_FRONT  # TV = KL / 2 here
    assert ("Settings: tree 20 nodes / depth 6 / 5 children; drafting topk — set explicitly (tree.drafting)."
            in section(text, "Temperature 1, top-k drafts"))
    assert "drafting sample — set explicitly (tree.drafting)" in section(text, "Temperature 1, sampled drafts")
    assert "drafting topk — greedy decoding drafts the head's top-k" in section(text, "Temperature 0")


def test_costs_on_sampled_drafts_are_marked_as_upper_bounds(drafting_report):
    text = (drafting_report / "report.md").read_text()
    topk_section, sample_section = (section(text, f"Temperature 1, {d}") for d in ("top-k drafts", "sampled drafts"))
    topk, sample = (section_rows(text, f"Temperature 1, {d}") for d in ("top-k drafts", "sampled drafts"))
    first = next(line for line in sample_section.splitlines() if line.startswith("| "))
    header = [c.strip() for c in first.strip("|").split("|")]
    assert header[6:8] == ["TV / token (≤: upper bound)", "KL / token (≤: upper bound)"]
    assert sample["mars@0.9"][6:8] == ["≤ 0.01", "≤ 0.02"] and sample["entropy@1"][7] == "≤ 0.5"
    assert sample["strict"][6:8] == ["0", "0"]  # exact: its run reported no bound (cost_bound_tokens 0)
    assert sample["vanilla"][6:8] == ["–", "–"]
    assert "≤" not in topk_section and "≤" not in section(text, "Temperature 0")
    assert "upper bound" in sample_section and "- **≤** (sampled drafts): an upper bound" in text
    assert "≤" not in topk["mars@0.9"][6] and topk["mars@0.9"][6:8] == ["0.005", "0.01"]


def test_one_t1_panel_draws_both_fronts_and_says_which_costs_are_bounds(drafting_report):
    groups = zoo_sweep.groups(zoo_sweep.load(sorted(drafting_report.parent.glob("summary_t*.json"))))
    panels = zoo_tables.panels(groups)
    assert [(o.temperature, [g.drafting for g in o.groups], panel) for o, panel in panels] == [
        (1.0, ["topk", "sample"], "cost"), (1.0, ["topk", "sample"], "tv"), (0.0, ["topk"], "cost"),
        (0.0, ["topk"], "quality")]
    width, height = png_size(drafting_report / "pareto.png")
    assert 3.5 * height < width < 5 * height  # four panels, not six: the drafting modes share T=1's
    overlay = panels[0][0]
    assert zoo_tables.cost_label(overlay) == "KL(π‖p) per token (nats); sampled drafts: ≤ upper bound"
    assert zoo_tables.cost_label(overlay, "tv") == "TV(π, p) per token; sampled drafts: ≤ upper bound"
    plt = pyplot()
    fig, ax = plt.subplots()
    zoo_tables._panel(ax, overlay, "cost", zoo_tables._style(zoo_tables._rules(groups)))
    steps = [line for line in ax.get_lines() if line.get_drawstyle() == "steps-post"]
    assert [line.get_linestyle() for line in steps] == ["--", ":"]  # top-k's front dashed, sampled's dotted
    for line, front, data in zip(steps, (T1_FRONT, T1S_FRONT), (T1, T1S), strict=True):
        assert sorted(zip(line.get_xdata(), line.get_ydata(), strict=True)) == sorted(
            (kl, speed) for m, (speed, kl) in data.items() if m in front)
    assert "top-k drafts vs sampled drafts" in ax.get_title()
    plt.close(fig)
    labels = [label for label, _ in zoo_tables.legend_entries(groups, panels)]
    assert labels[:6] == ["strict", "mars", "typical", "topm", "entropy", "ears"]
    assert labels[6:] == ["top-k drafts", "sampled drafts (cost ≤: upper bound)", "Pareto front, top-k drafts",
                          "Pareto front, sampled drafts"]


@pytest.mark.parametrize("bound", [0, 1])
def test_the_bound_is_labelled_exactly_when_the_run_reports_one(tmp_path, bound):
    """Sampled drafts alone do not make a figure a bound: cost_bound_tokens > 0 does."""
    file = write(tmp_path / "summary_t1_sampled.json", t1_sampled_summary(bound=bound))
    assert zoo_command.main([str(file), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    (group,) = zoo_sweep.groups(zoo_sweep.load([file]))
    labels = [label for label, _ in zoo_tables.legend_entries([group], zoo_tables.panels([group]))]
    label = zoo_tables.cost_label(zoo_tables.overlays([group])[0])
    rows_ = section_rows(text, "Temperature 1, sampled drafts")
    if bound:
        assert rows_["mars@0.9"][6:8] == ["≤ 0.01", "≤ 0.02"] and label.startswith("≤ KL(π‖p)")
        assert "sampled drafts (cost ≤: upper bound)" in labels and "upper bound" in label
    else:
        assert "≤" not in text and "≤" not in label and "upper bound" not in label
        assert rows_["mars@0.9"][6:8] == ["0.01", "0.02"] and "sampled drafts" in labels
    assert json.loads((tmp_path / "out" / "zoo.json").read_text())["groups"][0]["cost_is_upper_bound"] is bool(bound)


def test_a_zoo_of_top_k_drafts_only_keeps_its_legend(report):
    groups = zoo_sweep.groups(zoo_sweep.load([report.parent / "summary_t0.json", report.parent / "summary_t1.json"]))
    assert {g.drafting for g in groups} == {"topk"}  # summaries from before sampled drafting drafted top-k
    labels = [label for label, _ in zoo_tables.legend_entries(groups, zoo_tables.panels(groups))]
    assert labels == ["strict", "mars", "typical", "topm", "entropy", "ears", "Pareto front"]
    assert "drafts" not in (report / "report.md").read_text().split("## Legend")[0]


# --- scripts/rule_zoo_embedded.sh -------------------------------------------------------------------

def run_script(tmp_path: Path, *args: str, **env_vars: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """The script with a stand-in `python` first on PATH: it records every call but the sweep's
    `eval.zoo --baselines`, which the real interpreter answers. Returns the run and the recorded calls."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(exist_ok=True)
    python, calls = shlex.quote(sys.executable), shlex.quote(str(log))
    fake.write_text(f'#!/usr/bin/env bash\nif [[ " $* " == *" --baselines "* ]]; then exec {python} "$@"; fi\n'
                    f'printf "%q " "$@" >> {calls}\necho >> {calls}\n')
    fake.chmod(0o755)
    inherited = {k: v for k, v in os.environ.items() if k != "DRAFTING"}  # a DRAFTING of the caller's must not leak in
    env = {**inherited, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "NUM_PROMPTS": "3",
           "PYTHONPATH": str(REPO_ROOT), **env_vars}
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "rule_zoo_embedded.sh"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_embedded_script_runs_one_strict_job_per_temperature_then_the_report(tmp_path):
    """Each eval.run call must compose and validate."""
    out = tmp_path / "zoo out"  # a space must survive the shell and Hydra
    done, (t0, t1, report) = run_script(tmp_path, str(out), "seed=7")
    assert done.returncode == 0, done.stderr
    assert report == ["-m", "eval.zoo", str(out / "summary_t0.json"), str(out / "summary_t1.json"), "--out", str(out)]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        for call, temperature in ((t0, 0.0), (t1, 1.0)):
            assert call[:2] == ["-m", "eval.run"] and call[-1] == "seed=7"
            run = validate(compose("config", overrides=call[2:]))
            assert (run.model.name, run.bench.name, run.method.name) == ("embedded", "stdlib_heldout", "strict")
            assert run.baselines == zoo_sweep.baselines(temperature) and run.sampling.temperature == temperature
            assert (run.num_prompts, run.max_new_tokens, run.seed, run.tree.calibrate) == (3, 80, 7, True)
            assert run.out_dir == str(out / "runs")
            assert run.summary_path == str(out / f"summary_t{temperature:g}.json")
    assert "rule_zoo_embedded:" in done.stdout and str(out / "pareto.png") in done.stdout
    assert not any("tree.drafting" in arg for arg in t1)  # unset: the run's own tree.drafting (auto)
    usage, calls = run_script(tmp_path)
    assert usage.returncode == 2 and "usage: scripts/rule_zoo_embedded.sh OUT" in usage.stderr


def test_drafting_both_runs_t1_on_top_k_and_on_sampled_drafts_into_one_report(tmp_path):
    out = tmp_path / "zoo out"
    done, (t0, t1, t1s, report) = run_script(tmp_path, str(out), "seed=7", DRAFTING="both")
    assert done.returncode == 0, done.stderr
    assert report == ["-m", "eval.zoo", str(out / "summary_t0.json"), str(out / "summary_t1.json"),
                      str(out / "summary_t1_sampled.json"), "--out", str(out)]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        runs = [validate(compose("config", overrides=call[2:])) for call in (t0, t1, t1s)]
    assert [(r.sampling.temperature, r.tree.drafting) for r in runs] == [(0.0, "auto"), (1.0, "topk"), (1.0, "sample")]
    assert [r.out_dir for r in runs] == [str(out / "runs"), str(out / "runs"), str(out / "runs-sampled")]
    assert [r.summary_path for r in runs] == [str(out / f"summary_t{n}.json") for n in ("0", "1", "1_sampled")]
    assert runs[1].baselines == runs[2].baselines == zoo_sweep.baselines(1.0) and all(r.seed == 7 for r in runs)
    assert all(r.tree.calibrate and not r.tree.adaptive for r in runs)


@pytest.mark.parametrize("drafting,expect", [("sample", 0), ("topk", 0), ("nonsense", 2)])
def test_drafting_one_mode_sets_it_on_the_t1_job_and_rejects_others(tmp_path, drafting, expect):
    done, calls = run_script(tmp_path, str(tmp_path / "out"), DRAFTING=drafting)
    assert done.returncode == expect, done.stderr
    if expect:
        assert "DRAFTING must be topk, sample or both" in done.stderr and calls == []
        return
    t0, t1, report = calls
    assert f"tree.drafting={drafting}" in t1 and not any("tree.drafting" in arg for arg in t0)
    assert report[2:] == [str(tmp_path / "out" / "summary_t0.json"), str(tmp_path / "out" / "summary_t1.json"),
                          "--out", str(tmp_path / "out")]
