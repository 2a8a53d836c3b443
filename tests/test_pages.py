"""The pages stay true: tables rendered from measurement records (eval.reporting.pages), no dated section in a
page body, nothing executable under docs/."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from eval.config.paths import REPO_ROOT
from eval.reporting import measurements as M
from eval.reporting import pages as P

# a heading that dates itself or counts work periods ("(2026-11-29, seventeenth session)", "(later)"): history
# belongs in benchmarks/records/
ORDINAL = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|\w*tieth|later"
DATED = re.compile(rf"^#+ .*(\b20\d\d-\d\d-\d\d\b|\bsession\b|\([^)]*\b({ORDINAL})\b[^)]*\))", re.I | re.M)


def test_nothing_executable_lives_under_docs():
    found = [p.relative_to(REPO_ROOT) for p in (REPO_ROOT / "docs").rglob("*") if p.suffix in (".py", ".sh")]
    assert not found, f"scripts belong in experiments/ (with a smoke test) or scripts/: {found}"


def test_no_page_has_a_dated_section_heading():
    dated = {str(page.relative_to(REPO_ROOT)): [m.group(0) for m in DATED.finditer(page.read_text())]
             for page in P.pages()}
    assert not {k: v for k, v in dated.items() if v}, "dated history goes to benchmarks/records/earlier/"


def test_every_rendered_table_is_what_its_record_renders():
    assert P.stale() == [], "run: python -m eval.reporting.pages"


def a_shown_figure(figures: dict) -> tuple[dict, str]:
    """A figure every renderer of a record with these figures shows: the dict holding it, and its key."""
    if "methods" in figures:  # an eval.run summary's record
        return next(iter(figures["methods"].values())), "tokens_per_s"
    if "batches" in figures:  # batch-check
        return next(iter(figures["batches"].values()))["fastest_plain"], "tokens_per_s"
    return next(iter(figures["runs"].values())), "calibration_s"  # calibration-check


def test_a_changed_figure_fails_the_check_until_the_pages_are_rendered_again(tmp_path):
    root, records = tmp_path / "repo", tmp_path / "repo" / "benchmarks" / "records"
    shutil.copytree(REPO_ROOT / "docs", root / "docs")
    shutil.copy(REPO_ROOT / "README.md", root / "README.md")
    used = {m.group(2).split()[1] for page in P.pages() for m in P.BLOCK.finditer(page.read_text())}
    assert used, "no page renders a table"
    for record in M.load_all():
        target = records / Path(record.path).relative_to(M.RECORDS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(record.to_dict()))
    assert P.stale(root, records) == []
    kind = sorted(used)[0]
    record = M.newest(M.load_all(records), kind)
    path = Path(record.path)
    data = json.loads(path.read_text())
    holder, key = a_shown_figure(data["figures"])
    holder[key] *= 1.5
    path.write_text(json.dumps(data))
    assert P.stale(root, records), f"a changed {key} in {record.path} went unseen"
    assert P.stale(root, records, write=True)
    assert P.stale(root, records) == []


def record(**changes) -> M.Measurement:
    fields = dict(kind="embedded-benchmark", what="x", command="python -m eval.run", commit="abc1234",
                  date="2026-12-01", machine={"cpu": "c", "capability": "AVX2", "cores": 2, "class": "avx2"},
                  versions={"torch": "2.13.0"}, figures={"methods": {}})
    return M.Measurement(**{**fields, **changes})


def test_the_newest_record_of_a_kind_and_class_is_rendered():
    older, newer = record(date="2026-11-30", path="a"), record(date="2026-12-01", path="b")
    other = record(date="2026-12-02", machine={**newer.machine, "class": "xeon-amx"}, path="c")
    assert M.newest([newer, older, other], "embedded-benchmark", "avx2") is newer
    assert M.newest([newer, older, other], "embedded-benchmark") is other
    with pytest.raises(LookupError, match="no measurement record of kind 'smollm2-mt-bench' on avx2"):
        M.newest([older], "smollm2-mt-bench", "avx2")
    # a minute given sorts after its day alone and after an earlier minute, whatever the files' names
    morning, noon = record(date="2026-12-01T09:05", path="z"), record(date="2026-12-01T12:40", path="a")
    assert M.newest([noon, newer, morning], "embedded-benchmark", "avx2") is noon


def test_a_record_of_another_format_or_missing_a_field_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="schema None, not 1"):
        M.Measurement.from_dict({"runs": {}}, "old.json")
    data = record().to_dict()
    del data["command"]
    with pytest.raises(ValueError, match="missing command"):
        M.Measurement.from_dict(data, "x.json")
    out = M.write(record(), tmp_path / "r.json")
    assert M.Measurement.from_dict(json.loads(out.read_text())) == record()
    with pytest.raises(FileExistsError, match="never overwritten"):
        M.write(record(), out)


def test_the_quality_line_states_whether_each_interval_tells_a_loss_from_none():
    """The README's quality sentence: MARS θ = 0.9's recovery per temperature and benchmark with a score, and what
    its interval tells; a benchmark without a score (MT-bench) stays out."""
    def mars(recovery, low, high):
        return {"n": 80, "tau": 2.4, "metric": "rougeL", "recovery": recovery, "low": low, "high": high}
    temperatures = {"0": {"alpaca": {"strict": {"tau": 2.0}, "mars@0.9": mars(0.95, 0.90, 0.99)},
                          "sum": {"strict": {"tau": 2.1}, "mars@0.9": mars(1.01, 0.97, 1.05)},
                          "mt_bench": {"strict": {"tau": 2.2}, "mars@0.9": {"n": 80, "tau": 2.5, "recovery": None}}}}
    (line,) = P.quality_line(record(kind="smollm2-quality-table", figures={"temperatures": temperatures}), "r.json")
    assert "alpaca at T = 0 0.950 [0.900, 0.990] of strict's rougeL over 80 questions (a loss; τ 2.40" in line
    assert "sum at T = 0 1.010 [0.970, 1.050] of strict's rougeL over 80 questions (its interval holds 1;" in line
    assert "mt_bench" not in line
    assert "AVX2" in line  # one machine: the record's own is named
    mixed = {"temperatures": temperatures, "answered_on": ["alpaca: Zen 4 (`AVX512`) at abc", "sum: Xeon at def"]}
    (line,) = P.quality_line(record(kind="smollm2-quality-table", figures=mixed), "r.json")
    assert "answers from 2 machines or commits, which the record names (its own: c, `AVX2`);" in line
    assert "Answered on more than one machine: alpaca: Zen 4" in "\n".join(P.quality_table(
        record(kind="smollm2-quality-table", figures=mixed), "r.json"))


def test_the_quality_tables_speed_names_the_tree_a_method_was_calibrated_to_or_that_it_was_off():
    """The speed phase's speed is the one a user gets: at each method's calibrated tree, or plain decoding where no
    tree beat it; the cell says which, so a 1.00x reads as speculation off, not as a tree that gained nothing."""
    rows = {"strict": {"n": 80, "speed": 1.0, "speed_n": 24, "speed_tree": "8/4/2", "speculation": "off"},
            "mars@0.9": {"n": 80, "speed": 1.43, "speed_n": 24, "speed_tree": "8/4/2", "speculation": "on"},
            "generate": {"n": None, "speed": 0.75, "speed_n": 24}}
    table = "\n".join(P.quality_table(record(kind="smollm2-quality-table",
                                             figures={"temperatures": {"0": {"sum": rows}}}), "r.json"))
    assert "| sum | strict | 80 | 1.00× (24; off: plain decoding) |" in table
    assert "| sum | mars@0.9 | 80 | 1.43× (24; 8/4/2) |" in table and "| sum | generate | - | 0.75× (24) |" in table


def test_a_budget_runs_record_shows_the_theta_chosen_and_its_cost_where_it_was_used(tmp_path):
    """`quality_table.budget_of` reads a budgeted run's summary: the budget, θ, the grid's costs on the calibration
    prompts, and the run's own cost; the table says whether that cost kept within the budget."""
    from eval.reporting.quality_table import budget_of

    points = [{"value": v, "costs": {"logprob_regret": c}, "tau": t, "tokens": 768}
              for v, c, t in ((0.9, 0.08, 2.3), (0.95, 0.03, 2.2), (0.98, 0.01, 2.1))]
    fig = {"questions": 24, "logprob_regret": 0.045, "tau": 2.25, "speedup_vs_fastest_paired": 1.3,
           "speedup_vs_fastest_paired_n": 24, "tree": "8/4/2", "speculation": "on"}
    summary = {"settings": {"method": {"kind": "mars", "theta": 0.95}, "bench": "alpaca",
                            "quality_budget": {"parameter": "theta", "value": 0.95, "metric": "logprob_regret",
                                               "per_token": 0.08, "margin": 0.5, "points": points}},
               "methods": {"mars@0.95": fig, "strict": {"questions": 24},
                           "mars@0.9": {**fig, "tau": 2.4, "speedup_vs_fastest_paired": 1.4, "logprob_regret": 0.09}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    budget = budget_of(tmp_path / "summary.json")
    assert (budget["value"], budget["cost"], budget["grid"]["0.9"]["cost"]) == (0.95, 0.045, 0.08)
    tight = {**budget, "per_token": 0.04}  # the same run against a budget it overspent
    lines = P.quality_budgets(record(kind="q", figures={"budgets": [budget, tight]}), "r.json")
    assert "| logprob_regret 0.08 | 0.95 | 0.030 (≤ 0.040) | 0.9: 0.080, 0.95: 0.030, 0.98: 0.010 | 24 | 0.045 | yes" \
        in lines[4] and "| 1.30× (24; 8/4/2) |" in lines[4]
    assert "| 0.045 | no |" in lines[5]
    assert set(budget["beside"]) == {"mars@0.9"}  # the same rule at another θ in the same run; strict is not
    assert ("In the run of budget 0.08, mars@0.9 answered beside mars@0.95, question by question: 1.40× against "
            "1.30×") in lines[7]


def test_a_record_built_on_an_earlier_one_keeps_its_budgets_and_provenance(tmp_path):
    """`quality_table --quality-from`: a benchmark answered later joins an earlier record without losing the earlier
    record's budget runs or its lines on which machine answered what; a line given again is not repeated."""
    from eval.reporting.quality_table import main

    budget = {"bench": "alpaca", "metric": "logprob_regret", "per_token": 0.08, "value": 0.98}
    earlier = {"temperatures": {"0": {"alpaca": {"strict": {"n": 80, "tau": 2.0}}}},
               "answered_on": ["alpaca: Zen 4 at abc"], "budgets": [budget]}
    (tmp_path / "earlier.json").write_text(json.dumps({"figures": earlier}))
    (tmp_path / "out").mkdir()
    main([str(tmp_path / "out"), "--command", "c", "--what", "w", "--commit", "x", "--record",
          str(tmp_path / "r.json"), "--quality-from", str(tmp_path / "earlier.json"),
          "--answered-on", "alpaca: Zen 4 at abc", "--answered-on", "mt_bench: Xeon at def"])
    figures = json.loads((tmp_path / "r.json").read_text())["figures"]
    assert figures["temperatures"] == earlier["temperatures"] and figures["budgets"] == [budget]
    assert figures["answered_on"] == ["alpaca: Zen 4 at abc", "mt_bench: Xeon at def"]


def test_a_quality_phase_answered_in_batches_keeps_the_methods_names_and_says_its_batch(tmp_path):
    """`quality_table.figures_of`: a quality phase that answered 8 questions at a time (batch_size=8, a throughput
    device) gives the rows of strict and MARS under their own names, so that the table and the README's line find
    them, with the batch size beside n; the same method at two batch sizes in one phase is refused, naming both."""
    from eval.reporting.quality_table import figures_of

    def run(name: str, size: int) -> None:
        fig = {"questions": 80, "tau": 2.4, "batch_size": size, "quality": {"rougeL": 18.0}, "loglik": -0.7}
        summary = {"settings": {"model": "smollm2", "bench": "alpaca", "temperature": 1.0},
                   "methods": {"strict": fig, "mars@0.9": fig}}
        (tmp_path / "quality" / name).mkdir(parents=True)
        (tmp_path / "quality" / name / "summary.json").write_text(json.dumps(summary))

    run("b8", 8)
    rows = figures_of(tmp_path)["temperatures"]["1"]["alpaca"]
    assert set(rows) == {"strict", "mars@0.9"} and rows["mars@0.9"]["batch"] == 8
    table = "\n".join(P.quality_table(record(kind="q", figures={"temperatures": {"1": {"alpaca": rows}}}), "r.json"))
    assert "| alpaca | mars@0.9 | 80 (B=8) |" in table
    run("b1", 1)
    with pytest.raises(ValueError, match="holds (strict|mars@0.9) at T = 1 on alpaca twice") as refused:
        figures_of(tmp_path)
    assert all(str(tmp_path / "quality" / d) in str(refused.value) for d in ("b1", "b8"))
