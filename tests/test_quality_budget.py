"""A relaxed rule's parameter chosen by a quality budget (`mars.tuning.quality_budget`, `eval.runner.budgeted`):
the choice on scripted costs, the measurement on a tiny pair, and a run on the stand-in pair that names the value
it chose."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from helpers import random_prompt, save_standin_pair, tiny_generator
from hydra import compose, initialize_config_dir

from eval.config.paths import REPO_ROOT
from eval.runner.job import run
from mars import QualityBudget, SamplingConfig, make_rule
from mars.tuning import quality_budget as qb
from mars.tuning.quality_budget import BUDGET_PROMPTS, GridPoint, choose, choose_value, measure_grid

pytestmark = pytest.mark.usefixtures("single_thread")

GRID = (0.5, 0.7, 0.8, 0.9, 0.95)


def points(regret: dict[float, float], tau: dict[float, float]) -> tuple[GridPoint, ...]:
    return tuple(GridPoint(v, {"logprob_regret": regret[v], "argmax_mismatch": regret[v] / 2}, tau[v], 640)
                 for v in GRID)


# a lower theta relaxes more: it costs more and accepts more
SCRIPTED = points({0.5: 0.30, 0.7: 0.12, 0.8: 0.06, 0.9: 0.02, 0.95: 0.005},
                  {0.5: 3.1, 0.7: 2.8, 0.8: 2.6, 0.9: 2.3, 0.95: 2.1})


def test_the_longest_tau_within_the_margin_of_the_budget_is_chosen_and_a_looser_budget_chooses_faster():
    tight = choose(SCRIPTED, QualityBudget("logprob_regret", 0.05), "theta")  # within 0.025
    loose = choose(SCRIPTED, QualityBudget("logprob_regret", 0.25), "theta")  # within 0.125
    assert (tight.value, loose.value) == (0.9, 0.7)
    assert loose.chosen().tau > tight.chosen().tau and tight.params == {"theta": 0.9}
    # the margin is the room between the calibration prompts' cost and the run's
    assert choose(SCRIPTED, QualityBudget("logprob_regret", 0.07, margin=1.0), "theta").value == 0.8
    # another metric of the same measurement (argmax mismatch is half the regret here)
    assert choose(SCRIPTED, QualityBudget("argmax_mismatch", 0.07), "theta").value == 0.8
    assert "theta = 0.9" in tight.describe("mars") and "2 of 5 values were within" in tight.describe("mars")


def test_where_tau_does_not_fall_with_theta_the_longest_within_is_still_taken():
    """Nothing assumes tau or the cost monotone in the parameter: each value is judged on what it measured."""
    bumpy = points({v: 0.01 for v in GRID}, {0.5: 2.0, 0.7: 2.9, 0.8: 2.2, 0.9: 2.4, 0.95: 2.1})
    assert choose(bumpy, QualityBudget("logprob_regret", 0.05), "theta").value == 0.7


def test_no_value_within_the_budget_is_an_error_naming_the_cheapest_and_the_fix():
    with pytest.raises(ValueError, match=r"cheapest, theta = 0.95, costs 0.005.*loosen the budget"):
        choose(SCRIPTED, QualityBudget("logprob_regret", 0.001), "theta")


def test_an_infinite_kl_is_never_within_a_budget():
    infinite = GridPoint(0.5, {"kl_per_token": 0.001, "kl_infinite_tokens": 3}, 3.0, 640)
    finite = GridPoint(0.9, {"kl_per_token": 0.004, "kl_infinite_tokens": 0}, 2.0, 640)
    assert infinite.cost("kl_per_token") == math.inf
    assert choose((infinite, finite), QualityBudget("kl_per_token", 0.01), "theta").value == 0.9


def test_a_budget_names_what_the_run_measures_and_a_rule_with_a_parameter_to_choose():
    greedy, sampled = SamplingConfig(), SamplingConfig(temperature=1.0)
    with pytest.raises(ValueError, match="a greedy run measures logprob_regret and argmax_mismatch, not kl_per_token"):
        QualityBudget("kl_per_token", 0.01).check("mars", greedy)
    with pytest.raises(ValueError, match="a sampled run measures kl_per_token and tv_per_token"):
        QualityBudget("logprob_regret", 0.01).check("mars", sampled)
    with pytest.raises(ValueError, match="rule 'strict' has no main parameter"):
        QualityBudget("logprob_regret", 0.01).check("strict", greedy)
    assert QualityBudget("kl_per_token", 0.01).check("mars", sampled) == make_rule("mars").budget_grid
    assert QualityBudget("kl_per_token", 0.01, grid=(0.6, 0.9)).check("mars", sampled) == (0.6, 0.9)
    for bad in ({"metric": "bleu", "per_token": 0.1}, {"metric": "kl_per_token", "per_token": 0},
                {"metric": "kl_per_token", "per_token": 0.1, "margin": 1.5}):
        with pytest.raises(ValueError, match="quality_budget"):
            QualityBudget(**bad)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_values_cost_is_what_decoding_at_it_measures_and_the_grid_is_kept(temperature, tmp_path, monkeypatch):
    """On a tiny pair: a point's costs and tau are those of decoding the prompts at its value, seeded alike
    (greedy: argmax mismatch and regret; sampled: TV and KL); the measurement is kept, so another budget reads
    it without decoding; the generator's speculation is left as it was."""
    gen = tiny_generator(0, 1, sharpen=1.0, total_tokens=8, depth=4, branching=2)
    rng = random.Random(0)
    prompts = [random_prompt(rng, 16, 8) for _ in range(3)]
    sampling = SamplingConfig(temperature=temperature)
    gen.speculate = False
    metric = "logprob_regret" if temperature == 0 else "kl_per_token"
    first = choose_value(gen, prompts, "mars", {}, sampling, QualityBudget(metric, 10.0, grid=(0.3, 0.95)), 24,
                         tmp_path)
    assert gen.speculate is False and [p.value for p in first.points] == [0.3, 0.95]
    for point in first.points:
        at = SamplingConfig(temperature=temperature, rule=make_rule("mars", theta=point.value))  # keywords
        gen.speculate = True
        outs = [gen.generate(p, at, max_new_tokens=24,
                             generator=None if at.greedy else torch.Generator().manual_seed(seed))
                for seed, p in enumerate(prompts)]
        gen.speculate = False
        stats = outs[0].stats
        for out in outs[1:]:
            stats.merge(out.stats)
        assert point.costs == stats.cost()
        assert point.tau == pytest.approx(sum(len(o.tokens) - 1 for o in outs) / sum(o.num_cycles for o in outs))
    monkeypatch.setattr(qb, "measure_grid", lambda *a, **k: pytest.fail("the kept measurement was decoded again"))
    another = QualityBudget(metric, 5.0, grid=(0.3, 0.95))
    again = choose_value(gen, prompts, "mars", {}, sampling, another, 24, tmp_path)
    assert again.points == first.points


def test_measure_grid_restores_speculation_when_a_decode_fails():
    gen = tiny_generator(0, 1, sharpen=1.0, total_tokens=8, depth=4, branching=2)
    gen.speculate = False
    with pytest.raises(ValueError):
        measure_grid(gen, [torch.tensor([[1, 2, 3]])], lambda v: SamplingConfig(rule=make_rule("mars", theta=v)),
                     (2.0,), 8)
    assert gen.speculate is False


def test_a_run_with_a_quality_budget_is_named_by_the_value_it_chose(tmp_path, monkeypatch):
    """eval.run with method.quality_budget on the stand-in pair, costs scripted: two budgets choose two thetas,
    each run's directory and summary name its own, the looser one's is the lower (more relaxed) theta, and the
    summary keeps every value measured."""
    standin = save_standin_pair(tmp_path / "standin")
    asked = []

    def scripted(gen, prompts, sampling_at, grid, max_new_tokens):
        asked.append((grid, max_new_tokens, len(prompts)))
        return SCRIPTED
    monkeypatch.setattr(qb, "measure_grid", scripted)
    found = {}
    for per_token in (0.05, 0.25):
        overrides = [f"model.target={standin / 'target'}", f"model.draft={standin / 'draft'}", "model.dtype=float32",
                     "model.exact_attention=false", "num_prompts=2", "max_new_tokens=8", "threads=1",
                     "warmup=false", f"out_dir={tmp_path / 'out'}", "tree=cpu", "model.sampling_draft=null",
                     "method=mars", "baselines=[strict]", "tree.calibration_prompts=model",
                     f"method.quality_budget={{metric: logprob_regret, per_token: {per_token}, grid: {list(GRID)}}}"]
        with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
            summary = run(compose("config", overrides=overrides))
        chosen = summary["settings"]["quality_budget"]
        found[per_token] = chosen["value"]
        name = f"mars@{chosen['value']:g}"
        assert set(summary["methods"]) == {name, "strict"}
        directory = summary["methods"][name]["run_dir"]
        assert f"/{name}-T0-" in directory and f"theta: {chosen['value']}" in (
            tmp_path / "out" / directory.split("/")[-1] / "config.yaml").read_text()
        assert [p["value"] for p in chosen["points"]] == list(GRID)
        assert json.loads(json.dumps(chosen))["per_token"] == per_token
    assert found == {0.05: 0.9, 0.25: 0.7}
    # measured once (the second budget read the kept grid), on BUDGET_PROMPTS calibration prompts of the run's length
    assert asked == [(GRID, 8, BUDGET_PROMPTS)]


def test_the_python_api_chooses_theta_by_a_budget_too(tmp_path, monkeypatch):
    """`tuned(..., rule="mars", quality_budget=...)` on the stand-in pair, costs scripted: the generator's
    `quality_choice` names the theta the budget allows, measured at strict's kernels and tree, and the log says so.
    The calibrations, the choice and the generator returned share one copy of the target (four
    loads where each step loads its own)."""
    from transformers import AutoModelForCausalLM

    from mars import TreeShape, tuned

    standin = save_standin_pair(tmp_path / "standin")
    loads = []
    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: loads.append(kwargs.get("dtype")) or real(*args, **kwargs))
    seen = []
    monkeypatch.setattr(qb, "measure_grid", lambda gen, prompts, sampling_at, grid, tokens:
                        seen.append((gen.tree.label, gen.tree_kernels.dtype, len(prompts), tokens)) or SCRIPTED)
    lines = []
    gen = tuned(standin / "target", standin / "draft", rule="mars", dtype="float32", tree=TreeShape(8, 4, 2),
                prompts=[torch.tensor([[1, 5, 9, 12 + i]]) for i in range(6)], max_new_tokens=128,
                cache_dir=tmp_path / "cache",
                log=lines.append, quality_budget=QualityBudget("logprob_regret", 0.25, grid=GRID))
    with gen:
        assert gen.quality_choice.params == {"theta": 0.7} and gen.tree.label == "8/4/2"
        assert seen == [("8/4/2", "float32", 6, 64)]  # turns of TIMED_TOKENS at most
        out = gen.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=8, rule="mars", **gen.quality_choice.params)
        assert 0 < len(out.tokens) <= 8
    assert any("theta = 0.7" in line for line in lines)
    assert loads == [torch.float32]
