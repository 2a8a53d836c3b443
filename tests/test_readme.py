"""The README's engine example runs as written (here on the CPU; the same code picks a GPU when one
is present) and does what its comments say."""

from __future__ import annotations

import re

import pytest
import torch

from eval.config.paths import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")


def engine_examples() -> list[str]:
    """The section's code blocks: the measured settings (`tuned`), then the constructor by hand."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Using the engine"):]
    return re.findall(r"```python\n(.*?)```", section, re.S)[:2]


def run_example(code: str, monkeypatch) -> dict:
    monkeypatch.chdir(REPO_ROOT)  # it names the embedded pair by relative path
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the project's own README
    return scope


def test_the_engine_example_with_measured_settings_runs_as_written(monkeypatch):
    """`tuned` measures (here within 10 s per calibration instead of the default 2 minutes, on the embedded pair)
    and the generator it returns decodes with what was measured."""
    from mars.tuning import tuned as tuning

    real = tuning.calibrate
    monkeypatch.setattr(tuning, "calibrate", lambda *args, **kwargs: real(*args, **{**kwargs, "budget": 10.0}))
    scope = run_example(engine_examples()[0], monkeypatch)
    gen, out, base = scope["gen"], scope["out"], scope["base"]  # the last MARS sample and plain decoding
    assert len(base.tokens) == len(out.tokens) == 128 and out.num_cycles < 128
    assert set(gen.calibration) == {"strict", "mars"} and gen.calibration["mars"]["rule"]["theta"] == 0.9
    assert gen.target.model.dtype == getattr(torch, gen.calibration["strict"]["kernels"]["dtype"])
    assert gen.tree.total_tokens == gen.calibration["mars"]["tree"]["total_tokens"]


@pytest.mark.parametrize("bf16_cpu", [True, False], ids=["bf16-capable CPU", "AVX2-only CPU"])
def test_the_engine_example_by_hand_runs_as_written(monkeypatch, bf16_cpu):
    """On either CPU class, whichever this one is: `resolve_dtype("auto")` in the example follows the
    CPU's bf16 support, so both of its precisions run here."""
    from eagle import precision

    monkeypatch.setattr(precision, "cpu_bf16_matmul", lambda: (bf16_cpu, "as the test says"))
    scope = run_example(engine_examples()[1], monkeypatch)
    out, base = scope["out"], scope["base"]
    assert scope["dtype"] == (torch.bfloat16 if bf16_cpu else torch.float32)
    assert len(base.tokens) == len(out.tokens) == 128 and out.num_cycles < 128


def test_the_example_rule_runs_and_relaxes_only_where_it_says(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("**A rule of your own**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    plugin = tmp_path / "confident.py"
    plugin.write_text(code)
    from eval.config.methods import load_plugins
    from mars.rules import RULES, make_rule

    if "confident" not in RULES:  # imported once per session (the registry refuses a second class)
        load_plugins(str(plugin))
    from helpers import tiny_generator

    gen = tiny_generator(2, 3, sharpen=0.5, total_tokens=10, depth=3, branching=3)
    prompt = torch.tensor([[1, 2, 3, 4]])
    assert make_rule("confident", mass=0.7).display == "confident@0.7"
    relaxed = gen.generate(prompt, max_new_tokens=30, rule="confident", mass=0.0)
    never = gen.generate(prompt, max_new_tokens=30, rule="confident", mass=1.0)
    assert never.tokens == gen.vanilla(prompt, max_new_tokens=30).tokens and never.relaxed_tokens == 0
    assert relaxed.stats.relax_allowed > 0
