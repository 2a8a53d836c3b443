"""The measurement scripts of experiments/ run end to end at a tiny size (the embedded pair, a few tokens)
and write what their docstrings say. Their figures come from full-size runs (docs/); here only that each
script still runs on today's engine and that the properties it reports hold where they must (strict greedy
equal to plain decoding, canonical HumanEval solutions passing)."""

from __future__ import annotations

import importlib.util
import json
import runpy
import subprocess
import sys

import pytest
import torch

from eval.config.paths import REPO_ROOT, bench_dir

EXPERIMENTS = REPO_ROOT / "experiments"

pytestmark = pytest.mark.usefixtures("single_thread")


def run_script(name: str, *args: str, monkeypatch) -> None:
    """`python experiments/<name>.py ARGS` in this process (no second torch import), from the repository root."""
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, "argv", [str(EXPERIMENTS / f"{name}.py"), *args])
    runpy.run_path(str(EXPERIMENTS / f"{name}.py"), run_name="__main__")


def test_topk_mass_measures_a_mass_that_grows_with_k(tmp_path, monkeypatch):
    out = tmp_path / "mass.json"
    run_script("topk_mass", str(out), "--prompts", "1", "--tokens", "4", "--ks", "1", "4", monkeypatch=monkeypatch)
    report = json.loads(out.read_text())
    one, four = report["top_k_mass"]["1"]["mean_mass"], report["top_k_mass"]["4"]["mean_mass"]
    assert report["positions"] == 4 and 0 < one <= four <= 1


def test_static_speed_reproduces_plain_greedy_on_every_path(monkeypatch, capsys):
    run_script("static_speed", "--prompts", "1", "--tokens", "8", "--compile", "none", "--max-cache-len", "256",
               monkeypatch=monkeypatch)
    rows = [line for line in capsys.readouterr().out.splitlines() if "equal to plain greedy" in line]
    assert len(rows) == 3 and all(line.endswith("equal to plain greedy 1/1") for line in rows)


def test_precision_check_times_each_setting_and_checks_strict_against_plain(tmp_path, monkeypatch):
    out = tmp_path / "precision.json"
    run_script("precision_check", str(out), "--prompts", "1", "--tokens", "4", "--plain", "generate@float32",
               "tree=cpu", "model.dtype=float32", monkeypatch=monkeypatch)
    report = json.loads(out.read_text())
    assert {s["dtype"] for s in report["settings"].values()} == {"float32", "bfloat16"}
    assert report["identical"] == {"default": True, "bfloat16": True, "float32": True}
    assert {"strict[default]", "vanilla[bfloat16]", "generate@float32"} <= set(report["tokens_per_s"])


def test_batch_check_keeps_every_row_equal_to_its_prompt_alone(tmp_path, monkeypatch):
    """...and with --record writes the measurement record docs/batching.md renders, one row per batch size."""
    from eval.reporting import measurements, pages

    out = tmp_path / "batch.json"
    monkeypatch.setattr(measurements, "RECORDS", tmp_path / "records")
    run_script("batch_check", str(out), "--prompts", "2", "--tokens", "4", "--batches", "1,2", "--plain",
               "generate@float32", "--record", "tree=cpu", "model.dtype=float32", monkeypatch=monkeypatch)
    batches = json.loads(out.read_text())["batches"]
    assert set(batches) == {"1", "2"}
    for row in batches.values():
        assert row["identical_to_alone"] == "2/2" and row["settings"]["tree"]["total_tokens"] == 20
        assert {"generate@float32", "vanilla", "strict", "mars@0.9"} == set(row["tokens_per_s"])
    (record,) = measurements.load_all(tmp_path / "records")
    assert record.kind == "batch-check" and "settings" not in record.figures["batches"]["2"]
    assert record.command.startswith("python experiments/batch_check.py OUT.json --prompts 2"), record.command
    rows = [line for line in pages.batch_table(record, "r.json") if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all("| 20/4/5 |" in r and "| 2/2 |" in r for r in rows), rows


def test_cycle_costs_times_each_phase_of_a_cycle(tmp_path, monkeypatch):
    out = tmp_path / "cycles.json"
    run_script("cycle_costs", str(out), "--model", "embedded", "--trees", "4/2/2", "--tokens", "6",
               monkeypatch=monkeypatch)
    report = json.loads(out.read_text())
    tree = report["trees"]["4/2/2"]
    assert report["generate_ms_per_token"] > 0 and tree["cycles"] >= 1 and tree["ms_per_cycle"] > 0
    assert {"draft", "tree_forward", "accept"} <= set(tree["phases_ms"])
    plains = report["plain_ms_per_token"]  # beside generate: our vanilla at float32's fastest plain kernels
    assert "generate" in plains and any(label.startswith("vanilla float32") for label in plains)
    assert tree["tau_to_match_fastest"] == pytest.approx(tree["ms_per_cycle"] / min(plains.values()), rel=0.02)


def test_real_model_checks_find_strict_greedy_identical_and_test_sampling(tmp_path, monkeypatch):
    """On the embedded pair instead of SmolLM2 (whose first load converts a GGUF for ~45 s), sampling after a
    code prompt, where the code model's first tokens fall in few cells."""
    out = tmp_path / "real.json"
    run_script("real_model_checks", str(out), "--model", "embedded", "--skip", "load", "--identity", "1",
               "--tokens", "6", "--samples", "60", "--mass", "0.02", "--chi2-prompt", "def add(a, b):",
               monkeypatch=monkeypatch)
    report = json.loads(out.read_text())
    assert report["identity"]["identical"] == 1 and report["identity"]["prompts"] == 1
    assert [(c["method"], c["drafting"]) for c in report["chi2"]] == [
        ("strict", "topk"), ("strict", "sample"), ("vanilla", None)]
    assert all(c["samples"] == 60 and c["cells_before_pooling"] > 1 and 0 <= c["p_value"] <= 1 for c in report["chi2"])


def test_llamacpp_anchor_names_its_optional_extra_or_times_llama_cpp(tmp_path, monkeypatch):
    out = tmp_path / "anchor.json"
    args = (str(out), "--prompts", "1", "--tokens", "2", "--threads", "1")
    if importlib.util.find_spec("llama_cpp") is None:  # an optional extra of this script only
        with pytest.raises(SystemExit, match="pip install llama-cpp-python"):
            run_script("llamacpp_anchor", *args, monkeypatch=monkeypatch)
    else:
        run_script("llamacpp_anchor", *args, monkeypatch=monkeypatch)
        assert json.loads(out.read_text())["end_to_end_tokens_per_s"] > 0


def test_sandbox_canonical_solutions_pass_in_the_sandbox(monkeypatch, capsys):
    from eval.scoring import sandbox

    run_script("sandbox_canonical", sandbox.isolation(), str(bench_dir()), "--limit", "3", "--costs", "2",
               monkeypatch=monkeypatch)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 3 and report["pass@1"] == 1.0 and report["failed"] == []


@pytest.mark.timeout(280)
def test_sweep_contention_runs_the_sweep_in_parallel_and_alone(tmp_path, monkeypatch):
    """One θ instead of the script's two (one job per sweep: half the processes to start)."""
    run_script("sweep_contention", str(tmp_path), "--repeats", "1", "num_prompts=1", "max_new_tokens=4",
               "baselines=[vanilla]", "method.theta=0.9", monkeypatch=monkeypatch)
    rows = json.loads((tmp_path / "contention.json").read_text())["repeats"][0]
    assert set(rows) == {"mars@0.9", "vanilla"}
    assert all(r["parallel_tokens_per_s"] > 0 and r["alone_tokens_per_s"] > 0 for r in rows.values())


def test_bf16_exactness_probes_the_shapes_and_checks_strict_against_plain(tmp_path, monkeypatch):
    from compute.kernels import packs

    out = tmp_path / "bf16.json"
    args = ("bf16_exactness", str(out), "--model", "embedded", "--prompts", "1", "--tokens", "8")
    if not packs(torch.bfloat16):  # bf16 is never chosen here: the script says why and writes nothing
        with pytest.raises(SystemExit, match="AVX-512 BF16"):
            run_script(*args, monkeypatch=monkeypatch)
        return
    run_script(*args, monkeypatch=monkeypatch)
    report = json.loads(out.read_text())
    assert report["strict_vs_plain"]["fixed"]["identical"] == 1
    assert all(isinstance(s["lone_row_differs"], bool) for s in report["shapes"].values())


def test_ab_runs_times_both_commits_in_abba_order_from_clean_clones(tmp_path, monkeypatch):
    """Each pass runs in a clone at its commit from an empty cache, in the order A1 B1 B2 A2; a finished pass is
    not run again; the record holds per pass the summary's figures and the calibration seconds of its log."""
    from eval.reporting import measurements

    repo = tmp_path / "repo"
    repo.mkdir()

    def commit(speed: int) -> None:
        (repo / "speed.txt").write_text(f"{speed}\n")
        for cmd in (["add", "speed.txt"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
            subprocess.run(["git", "-C", str(repo), *cmd], check=True)

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit(10)
    commit(12)
    # the command: records its pass in order, checks its cache is empty, prints one calibration of two methods
    # (3 s in all) and writes a summary
    program = ("import json, os, sys; assert not os.listdir(os.environ['MARS_CACHE_DIR']); "
               "open(sys.argv[2], 'a').write(open('speed.txt').read()); "
               "print('calibrated strict in 3 s', 'calibrated mars in 3 s', sep=chr(10)); "
               "v = float(open('speed.txt').read()); json.dump({'methods': {'strict': {'tokens_per_s': v}}}, "
               "open(sys.argv[1], 'w'))")
    order = tmp_path / "order.txt"
    monkeypatch.setattr(measurements, "RECORDS", tmp_path / "records")
    args = [str(tmp_path / "ab"), "--a", "HEAD~1", "--b", "HEAD", "--repo", str(repo), "--kind", "ab-smoke",
            "--what", "a smoke test", "--", sys.executable, "-c", program, "OUT", str(order)]
    run_script("ab_runs", *args, monkeypatch=monkeypatch)
    assert order.read_text().split() == ["10", "12", "12", "10"]
    (record,) = measurements.load_all(tmp_path / "records")
    assert record.figures["b_over_a_tokens_per_s"] == {"strict": 1.2}
    assert [r["calibration_s"] for r in record.figures["runs"].values()] == [3.0] * 4
    run_script("ab_runs", *args[:7], *args[11:], monkeypatch=monkeypatch)  # every pass finished: none reruns
    assert order.read_text().split() == ["10", "12", "12", "10"]
