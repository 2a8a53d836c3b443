"""Quality recovery with what it rests on (eval.scoring.recovery), against strict in a job
(eval.runner.job.against_strict), and in the report (both drafting modes side by side, the recovery table)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from test_report import fake_summary, write_run

from eval.config.paths import bench_dir
from eval.report import main
from eval.reporting.summaries import SAMPLED_DRAFTS, load_runs, merge_runs, method_order
from eval.reporting.tables import recovery_cell
from eval.runner.job import against_strict, score_quality
from eval.scoring.recovery import agreement, paired_recovery


def test_identical_scores_recover_fully_with_a_point_interval():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    r = paired_recovery(scores, scores)
    assert (r["recovery"], r["low"], r["high"], r["n"], r["nonzero"]) == (1.0, 1.0, 1.0, 6, 4)
    assert r["undefined"] is None


def test_a_uniform_loss_is_recovered_exactly():
    strict = [random.Random(1).uniform(10, 40) for _ in range(25)]
    r = paired_recovery([0.5 * s for s in strict], strict)
    assert r["recovery"] == pytest.approx(0.5)
    assert r["low"] == pytest.approx(0.5) and r["high"] == pytest.approx(0.5)


def test_the_interval_is_the_bootstrap_percentiles_and_narrows_with_n():
    """Against an independent computation of the paired percentile bootstrap with the same draws."""
    rng = random.Random(7)
    strict = [float(rng.random() < 0.6) for _ in range(30)]
    method = [s if rng.random() < 0.8 else 1 - s for s in strict]
    r = paired_recovery(method, strict, resamples=500, seed=3)
    draws, ratios = random.Random(3), []
    for _ in range(500):
        picks = [draws.randrange(30) for _ in range(30)]
        ratios.append(sum(method[i] for i in picks) / sum(strict[i] for i in picks))
    ratios.sort()
    assert (r["low"], r["high"]) == (ratios[12], ratios[486])
    assert r["low"] < r["recovery"] < r["high"]
    narrow = paired_recovery(method * 4, strict * 4, resamples=500, seed=3)  # the same answers 4x: ~half as wide
    assert narrow["recovery"] == pytest.approx(r["recovery"])
    assert narrow["high"] - narrow["low"] < 0.7 * (r["high"] - r["low"])


def test_zero_strict_score_is_no_recovery_not_zero_over_zero():
    r = paired_recovery([0.0, 1.0, 0.0], [0.0, 0.0, 0.0])
    assert r["recovery"] is None and r["low"] is None and r["undefined"] == "strict scores 0 on all 3 questions"
    assert r["nonzero"] == 1
    assert paired_recovery([], [])["undefined"] == "no question answered by both"


def test_a_score_about_zero_is_left_out_of_recovery_and_says_so():
    """Strict solved 1 of 20 (a 135M model on GSM8K): under a tenth of the questions, so there is no recovery,
    and the reason says why; at 2 of 20 there is one."""
    strict = [1.0] + [0.0] * 19
    r = paired_recovery(strict, strict)
    assert r["recovery"] is None and r["nonzero"] == 1 and (r["low"], r["high"]) == (None, None)
    assert r["undefined"] == ("strict scores above 0 on 1 of 20 questions, under 10%: a score about 0, left out of "
                              "recovery")
    assert paired_recovery(strict[:1] * 2 + [0.0] * 18, strict[:1] * 2 + [0.0] * 18)["recovery"] == 1.0


def test_a_recovery_resting_on_few_questions_has_no_interval():
    """Strict solved 2 of 20: over a tenth of the resamples have no strict success, so no interval is given
    (it would hide that the ratio rests on two questions)."""
    strict = [1.0, 1.0] + [0.0] * 18
    r = paired_recovery(strict, strict)
    assert r["recovery"] == 1.0 and r["nonzero"] == 2 and (r["low"], r["high"]) == (None, None)


def test_unpaired_figures_are_refused():
    with pytest.raises(ValueError, match="one strict figure per question"):
        paired_recovery([1.0], [1.0, 0.0])


def test_agreement_with_strict_per_turn():
    a = agreement([["the cat sat", "b"], ["x y"]], [["the cat sat", "c"], ["x  y\n"]])
    assert a["n"] == 2 and a["exact_match_vs_strict"] == pytest.approx(2 / 3)
    assert 66 < a["rougeL_vs_strict"] < 67  # 100, 0, 100


def record(qid: int, text: str) -> dict:
    return {"question_id": qid, "choices": [{"turns": [text]}]}


def test_a_job_pairs_each_method_with_strict_by_question():
    strict = [record(q, f"answer {q}") for q in range(4)]
    mars = [record(q, f"answer {q}" if q != 2 else "something else") for q in (3, 2, 1, 0)]  # another order
    each = {"strict": {str(q): {"correct": q in (0, 1, 2)} for q in range(4)},
            "mars": {str(q): {"correct": q in (0, 1)} for q in range(4)}}
    figures = {"strict": {}, "mars": {"quality_recovery": 2 / 3}}
    against_strict("correct", {"strict": strict, "mars": mars}, each, figures)
    ci = figures["mars"]["quality_recovery_ci"]
    assert (ci["n"], ci["nonzero"], ci["figure"]) == (4, 3, "correct")
    assert ci["recovery"] == pytest.approx(2 / 3)
    assert figures["mars"]["agreement_vs_strict"]["exact_match_vs_strict"] == 0.75
    assert "quality_recovery_ci" not in figures["strict"]
    against_strict(None, {"strict": strict, "mars": mars}, each, figures := {"strict": {}, "mars": {}})
    assert "quality_recovery_ci" not in figures["mars"] and "agreement_vs_strict" in figures["mars"]


def test_the_method_a_set_is_scored_against_gets_no_recovery():
    """MT-bench at T = 1 is scored against vanilla's answers: vanilla scores 100 by construction, so a ratio of
    it to strict's score (an independent sample) would mean nothing; the others keep theirs."""
    run = SimpleNamespace(bench=SimpleNamespace(name="mt_bench", data_dir=bench_dir(), source="local"),
                          sampling=SimpleNamespace(temperature=1.0))
    texts = {"vanilla": "the cat sat on the mat", "strict": "a cat sat on a mat", "mars@0.9": "the cat sat there"}
    records = {m: [{"question_id": q, "choices": [{"turns": [f"{t} {q}", "more"]}]} for q in (81, 82, 83)]
               for m, t in texts.items()}
    figures = {m: {} for m in records}
    assert score_quality(run, records, figures) == "rougeL_vs_vanilla"
    assert figures["vanilla"]["quality"]["rougeL_vs_vanilla"] == 100.0
    assert "quality_recovery" not in figures["vanilla"]
    assert figures["vanilla"]["quality_recovery_ci"]["undefined"] == "every method is scored against vanilla's answers"
    assert "agreement_vs_strict" in figures["vanilla"]
    mars = figures["mars@0.9"]
    assert mars["quality_recovery"] == pytest.approx(
        mars["quality"]["rougeL_vs_vanilla"] / figures["strict"]["quality"]["rougeL_vs_vanilla"])
    assert mars["quality_recovery_ci"]["n"] == 3 and mars["quality_recovery_ci"]["undefined"] is None


def t1_run(drafting: str) -> dict:
    """A T=1 run of strict and MARS drafting `drafting`, with vanilla and model.generate as baselines."""
    data = fake_summary("model-a", "humaneval", 1.0, ["generate", "vanilla", "strict", "mars@0.9"])
    label = "20/4/5" + (" sampled" if drafting == "sample" else "")
    for m in ("generate", "vanilla"):  # shared: the same answers directory in both runs, as a sweep's baselines
        data["methods"][m]["run_dir"] = f"/runs/{m}"
    for m in ("strict", "mars@0.9"):
        data["methods"][m]["tree"] = label
    data["methods"]["mars@0.9"]["quality_recovery_ci"] = {
        "n": 12, "nonzero": 7, "recovery": 0.9, "low": 0.7, "high": 1.1, "level": 0.95, "undefined": None,
        "figure": "passed"}
    data["methods"]["mars@0.9"]["agreement_vs_strict"] = {"rougeL_vs_strict": 41.6, "n": 12}
    if drafting == "sample":  # another run: different answers, so another strict quality
        data["methods"]["strict"]["quality"]["pass@1"] *= 0.5
        del data["methods"]["mars@0.9"]["quality_recovery"]  # to be filled in from this run's strict
    return data


def test_both_drafting_modes_at_one_temperature_are_rows_of_their_own(tmp_path):
    write_run(tmp_path / "topk", t1_run("topk"))
    write_run(tmp_path / "sample", t1_run("sample"))
    entries = {e.method: e for e in merge_runs(load_runs([tmp_path]))}
    sampled = "mars@0.9" + SAMPLED_DRAFTS
    assert {"strict", "mars@0.9", "strict" + SAMPLED_DRAFTS, sampled, "vanilla", "generate"} <= set(entries)
    # A sampled-draft method's recovery is against strict on sampled drafts.
    strict_sampled = entries["strict" + SAMPLED_DRAFTS]
    assert entries[sampled].value("quality_recovery") == pytest.approx(
        entries[sampled].value("quality") / strict_sampled.value("quality"))
    assert strict_sampled.value("quality_recovery") == 1.0
    order = sorted(entries, key=lambda m: method_order(m, entries[m].theta))
    assert order == ["generate", "vanilla", "strict", "mars@0.9", "strict" + SAMPLED_DRAFTS, sampled]
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| model-a | mars@0.9 (sampled drafts) |" in md
    assert "0.90 [0.70, 1.10] 7/12 · agree 42" in md


def test_the_recovery_cell_says_why_there_is_none():
    (entry,) = [e for e in merge_runs([{**t1_run("topk"), "run_dir": "/x"}]) if e.method == "mars@0.9"]
    entry.fig["quality_recovery_ci"] = {"n": 5, "nonzero": 0, "recovery": None, "low": None, "high": None,
                                        "undefined": "strict scores 0 on all 5 questions"}
    entry.fig["loglik"] = -1.2345
    assert recovery_cell(entry) == "none: strict scores 0 on all 5 questions · agree 42 · ll -1.234"
    entry.fig["quality_recovery_ci"] = {"n": 20, "nonzero": 1, "recovery": 1.0, "low": None, "high": None}
    assert recovery_cell(entry).startswith("1.00 [interval unknown] 1/20")
