"""scripts/gpu_check.py on tiny shapes on the CPU: what it reports is what the loop does."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from eval.config.paths import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")
SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_check_reports_syncs_phases_and_speed(dtype):
    """Both precisions, pinned ("auto" would pick by the CPU): bf16 verifies with exact attention,
    whose plan is built on the device, so it keeps the plain path's budget."""
    result = load_script().check("tiny", None, dtype, 0.9, prompts=2, prompt_len=32, tokens=40, tree=(20, 4, 5))
    assert result["device"] == "cpu" and result["dtype"] == f"torch.{dtype}"
    assert result["strict_equals_vanilla"] == "2/2"
    assert all(s["per_cycle"] <= 2.5 for s in result["syncs_per_cycle"].values())  # 2, + the prefill's few
    assert result["tau"]["strict"] > 2.0  # the synthetic draft is right 90% of the time
    assert {"draft", "tree_forward", "accept"} <= set(result["ms_per_cycle_by_phase"])
    assert set(result["tokens_per_s"]) == {"generate", "vanilla", "strict", "mars@0.9"}


def test_tiny_batches_report_throughput_latency_and_syncs_per_batch_size():
    result = load_script().check("tiny", None, "float32", 0.9, prompts=1, prompt_len=32, tokens=24, tree=(8, 4, 2),
                                 batches=(1, 4))
    four = result["batches"]["4"]
    assert set(result["batches"]) == {"4"} and four["strict_equals_vanilla"] == "4/4"
    assert all(s["per_cycle"] <= 2.5 for s in four["syncs_per_cycle"].values())  # per cycle of the whole batch
    assert four["tau"]["strict"] > 2.0 and set(four["tokens_per_s"]) == {"generate", "vanilla", "strict", "mars@0.9"}
    assert 0 < four["latency_s"]["strict"]["mean"] <= four["latency_s"]["strict"]["p90"]


def test_help_names_what_it_measures_on_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--help"])
    with pytest.raises(SystemExit) as done:
        load_script().main()
    assert done.value.code == 0
    text = capsys.readouterr().out
    for what in ("synchronisations per cycle", "phase", "peak device memory", "model.generate", "Llama-3.1-8B"):
        assert what in text
