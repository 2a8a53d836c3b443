"""Every verification rule of the zoo: its exact emitted distribution against what it emits, its
never-relaxing setting against strict, and its costs in scenarios where they are known in closed form."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from helpers import (
    chi_square_pvalue,
    emitted,
    kl_tolerance,
    make_tree,
    probability_error,
    save_standin_pair,
    summation_tolerance,
    tiny_generator,
    tv_tolerance,
)

import mars.rules
from mars.accounting.cost import acceptance_probabilities, emitted_distribution, fallback_distribution
from mars.rules import BUILT_IN, RULES, Relaxation, Rule, TargetView, make_rule, register
from mars.verification.sampling import process_logits, resolve_sampling
from mars.verification.verify import accept, children

pytestmark = pytest.mark.usefixtures("single_thread")

V = 6
TREE = ([-1, 0, 0, 0, 1, 1, 2], [5, 0, 2, 4, 1, 3, 5])  # (parents, tokens), siblings in draft order
# Every built-in rule at the settings it declares (`Rule.relaxing`, `Rule.never_relaxes`), so that a
# newly registered rule is tested here without an edit; one that declares nothing fails
# test_every_built_in_rule_declares_the_settings_its_tests_run (the lists below then skip it).
RELAXING = [(name, params) for name in BUILT_IN for params in RULES[name].relaxing or ()]
# The exact distribution is checked where each rule relaxes; a rule that never does (strict) at its one setting.
EXACT = [(name, params) for name in BUILT_IN
         for params in RULES[name].relaxing or (RULES[name].never_relaxes,) if params is not None]


def ids(cases: list[tuple[str, dict]]) -> list[str]:
    return [f"{name}-{params}" for name, params in cases]


def node_logits(tree, seed: int, shift: float = 3.0) -> torch.Tensor:
    """Random rows (positive, for the logit ratio), each node's drafted children favoured."""
    logits = torch.randn(tree.size, V, generator=torch.Generator().manual_seed(seed)) + shift
    for node, kids in enumerate(tree.children):
        logits[node, tree.tokens[kids]] += 1.0
    return logits


def view_of(processed: torch.Tensor, tree, greedy: bool = False) -> TargetView:
    return TargetView(processed, tree.tokens, children(tree), greedy)


def test_every_rule_file_registers_its_rule_and_unknown_names_are_refused():
    """BUILT_IN (what every per-rule list here derives from) holds a rule from each rule file of mars/rules
    (all but the machinery every rule builds on: base, rejection): a rule file that __init__ forgets to
    import would otherwise go untested."""
    machinery = {"__init__", "base", "rejection"}
    files = {path.stem for path in Path(mars.rules.__file__).parent.glob("*.py")} - machinery
    assert {RULES[name].__module__.rpartition(".")[2] for name in BUILT_IN} == files
    assert all(RULES[name].__module__.startswith("mars.rules.") for name in BUILT_IN)
    with pytest.raises(ValueError, match="unknown rule 'lossy'; registered rules: "):
        make_rule("lossy")
    with pytest.raises(TypeError, match=r"rule 'typical' has no parameter\(s\) \['theta'\]; its parameters: epsilon"):
        make_rule("typical", theta=0.5)


def outcome_distribution(view: TargetView, relax: Relaxation, tree) -> dict[tuple[int, ...], float]:
    """P(a verdict emits these tokens) under the rule's description: children are tried in draft
    order, one accepted outright with certainty, the others with the strict trial loosened by the
    rule's tolerance, and after every rejection `fallback_distribution` is drawn."""
    a = acceptance_probabilities(view, relax)
    fallback = fallback_distribution(view, relax, torch.arange(tree.size))
    tokens, kids = tree.tokens.tolist(), tree.children
    out: Counter = Counter()

    def walk(node: int, prefix: tuple[int, ...], prob: float) -> None:
        for c in kids[node]:
            accepted = 1.0 if relax.outright[node, c] else a[node, c].item()
            walk(c, prefix + (tokens[c],), prob * accepted)
            prob *= 1.0 - accepted
        for x, fx in enumerate(fallback[node].tolist()):
            if fx > 0 and prob > 0:
                out[prefix + (x,)] += prob * fx

    walk(0, (), 1.0)
    return dict(out)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_rule_declares_the_settings_its_tests_run(name):
    cls = RULES[name]
    where = f"{cls.__module__}.{cls.__qualname__}"
    assert isinstance(cls.never_relaxes, dict), (
        f"{where} declares no never_relaxes: set `never_relaxes: ClassVar[dict] = {{...}}` to parameters at "
        "which it relaxes nowhere ({} if its defaults never do; see mars.rules.base.Rule)")
    assert isinstance(cls.relaxing, tuple) and all(isinstance(p, dict) for p in cls.relaxing), (
        f"{where} declares no relaxing settings: set `relaxing: ClassVar[tuple[dict, ...]] = ({{...}},)` to "
        "parameter sets at which it relaxes (see mars.rules.base.Rule)")
    for params in (cls.never_relaxes, *cls.relaxing):
        make_rule(name, **params)  # the declared parameters exist and are in range
    assert cls.relaxing or make_rule(name, **cls.never_relaxes).lossless, (
        f"{where} declares relaxing=(): only a lossless rule (strict) may; name the parameter sets at which it relaxes")


@pytest.mark.parametrize("name,params", EXACT, ids=ids(EXACT))
def test_exact_distribution_matches_what_the_rule_emits(name, params):
    """Chi-square of the verdicts' emitted tokens against the rule's exact outcome distribution; the
    first token's marginal is the exact pi of `mars.accounting.cost` at the root."""
    tree = make_tree(*TREE)
    cfg = resolve_sampling(temperature=1.0, rule=name, **params)
    processed = process_logits(node_logits(tree, seed=3), cfg)
    view = view_of(processed, tree)
    relax = cfg.rule.relax(view)
    outcomes = outcome_distribution(view, relax, tree)
    pi = emitted_distribution(view, relax, torch.tensor([0]))[0]
    first = Counter()
    for seq, prob in outcomes.items():
        first[seq[0]] += prob
    assert [first[x] for x in range(V)] == pytest.approx(pi.tolist(), abs=1e-6)
    generator = torch.Generator().manual_seed(11)
    counts = Counter(emitted(accept(processed, tree, cfg, generator), tree) for _ in range(3000))
    assert chi_square_pvalue(counts, outcomes) > 1e-3


@pytest.mark.parametrize("name,params", RELAXING, ids=ids(RELAXING))
def test_each_rule_relaxes_at_its_relaxing_setting_and_reports_the_cost(name, params):
    """The scenario of the test above moves the distribution (so the chi-square test tests a relaxation),
    and the verdict's first step carries TV and KL of exactly that pi."""
    tree = make_tree(*TREE)
    cfg = resolve_sampling(temperature=1.0, rule=name, **params)
    processed = process_logits(node_logits(tree, seed=3), cfg)
    view = view_of(processed, tree)
    pi = emitted_distribution(view, cfg.rule.relax(view), torch.tensor([0]))[0]
    p = processed[0].softmax(-1)
    tv = 0.5 * (pi - p).abs().sum().item()
    kl = sum(a * math.log(a / b) for a, b in zip(pi.tolist(), p.tolist(), strict=True) if a > 0)
    assert tv > 0.01
    step = accept(processed, tree, cfg, torch.Generator().manual_seed(0)).steps[0]
    # The step's TV and KL are float32 sums over V (kl_tolerance, tv_tolerance); the test's KL is float64.
    assert step.tv == pytest.approx(tv, abs=tv_tolerance(V)) and step.kl == pytest.approx(kl, abs=kl_tolerance(V, kl))


def test_strict_emits_p_exactly_and_costs_nothing():
    tree = make_tree(*TREE)
    cfg = resolve_sampling(temperature=0.7, top_p=0.9)
    processed = process_logits(node_logits(tree, seed=5), cfg)
    view = view_of(processed, tree)
    pi = emitted_distribution(view, Relaxation.none(view), torch.arange(tree.size))
    # pi(x) adds at most 2 terms (the child x's acceptance, the fallback's mass on x), each a product of
    # ratios of p and residuals renormalised once per child before it: off by a probability's error per child.
    widest = max(len(kids) for kids in tree.children)
    rtol = summation_tolerance(2, 1.0, term_error=widest * probability_error(V))
    torch.testing.assert_close(pi, view.probs, atol=0, rtol=rtol)
    for seed in range(20):
        v = accept(processed, tree, cfg, torch.Generator().manual_seed(seed))
        assert all(s.tv == 0.0 and s.kl == 0.0 and not s.relaxed for s in v.steps)


FORMS = [(name, t) for name in BUILT_IN for t in (0.0, 1.0)
         if (t or RULES[name].greedy_form) and RULES[name].never_relaxes is not None]


@pytest.mark.parametrize("name,temperature", FORMS)
def test_every_rule_at_its_never_relaxing_setting_is_strict(name, temperature):
    rule = make_rule(name, **RULES[name].never_relaxes)
    for seed in range(12):
        parents = [-1, 0, 0, 1, 1, 2, 3, 4][: 3 + seed % 6]
        tree = make_tree(parents, [(7 * i + seed) % V for i in range(len(parents))])
        logits = node_logits(tree, seed, shift=0.0)
        never = resolve_sampling(temperature=temperature, rule=rule)
        strict = resolve_sampling(temperature=temperature)
        g_never, g_strict = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        a = accept(process_logits(logits, never), tree, never, g_never)
        b = accept(process_logits(logits, strict), tree, strict, g_strict)
        assert (a.path, a.next_token, a.tokens) == (b.path, b.next_token, b.tokens)
        assert not any(s.relaxed or s.relax_allowed or s.tv or s.kl or s.mismatch for s in a.steps)
        assert torch.equal(g_never.get_state(), g_strict.get_state())


def test_mars_sampling_cost_is_that_of_a_certain_top2_token():
    """Where MARS accepts its top-2 child c outright, pi is a point mass: TV = 1 - p(c), KL = -log p(c)."""
    tree = make_tree([-1, 0], [5, 1])
    logits = torch.tensor([[3.0, 2.9, 0.5, 0.4, 0.3, 0.2], [0.0] * 6])
    cfg = resolve_sampling(temperature=1.0, rule="mars")
    v = accept(process_logits(logits, cfg), tree, cfg, torch.Generator().manual_seed(0))
    p1 = logits[0].softmax(-1)[1].item()
    assert v.path == [0, 1] and v.steps[0].relaxed
    kl = -math.log(p1)
    assert v.steps[0].tv == pytest.approx(1 - p1, abs=tv_tolerance(logits.shape[1]))
    assert v.steps[0].kl == pytest.approx(kl, abs=kl_tolerance(logits.shape[1], kl))
    assert v.steps[1].tv == 0.0  # a leaf emits from p


def test_greedy_cost_counts_a_non_argmax_token_and_its_regret():
    tree = make_tree([-1, 0], [5, 1])
    logits = torch.tensor([[3.0, 2.9, 0.5, 0.4, 0.3, 0.2], [0.0, 0.0, 9.0, 0.0, 0.0, 0.0]])
    v = accept(logits, tree, resolve_sampling(rule="mars"))
    assert v.path == [0, 1] and [s.mismatch for s in v.steps] == [True, False]
    assert v.steps[0].regret == pytest.approx(3.0 - 2.9, abs=1e-5) and v.steps[1].regret == 0.0


def test_kl_is_infinite_where_the_rule_emits_a_token_outside_the_support():
    """EARS' tolerance accepts a child the top-k filter removed (u < 0 + beta (1 - max p)): pi puts
    mass where p has none, and the stats count such tokens apart from the finite KL."""
    tree = make_tree([-1, 0], [5, 4])
    logits = torch.tensor([[2.0, 1.9, 1.8, 0.0, -9.0, 0.0], [0.0] * 6])
    cfg = resolve_sampling(temperature=1.0, top_k=3, rule="ears", beta=1.0)
    processed = process_logits(logits, cfg)
    kls = [accept(processed, tree, cfg, torch.Generator().manual_seed(s)).steps[0].kl for s in range(30)]
    assert all(math.isinf(k) for k in kls)  # pi puts mass on token 4, which p excludes
    out = tiny_generator(1, 2, sharpen=1.0, total_tokens=6, depth=2, branching=3).generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=12, generator=torch.Generator().manual_seed(0), temperature=1.0,
        top_k=3, rule="ears", beta=1.0)
    cost = out.stats.cost()
    assert cost["tv_per_token"] > 0 and cost["argmax_mismatch"] is None and cost["logprob_regret"] is None
    assert out.stats.sampled == out.stats.positions


@register
@dataclass(frozen=True)
class AlwaysFirst(Rule):
    """A test-only rule: accept the first drafted child wherever the target's top-1 is below `floor`."""

    name: ClassVar[str] = "test_always_first"
    never_relaxes: ClassVar[dict] = {"floor": 0.0}
    floor: float = 0.5

    def relax(self, view: TargetView) -> Relaxation:
        gate = view.pmax < self.floor
        first = view.kids & (view.kids.long().cumsum(dim=1) == 1)
        return Relaxation(first & gate[:, None], view.pmax, gate)


def test_a_rule_defined_outside_mars_runs_through_the_engine():
    gen = tiny_generator(2, 3, sharpen=0.5, total_tokens=10, depth=3, branching=3)
    prompt = torch.tensor([[1, 2, 3, 4]])
    relaxed = gen.generate(prompt, max_new_tokens=30, rule="test_always_first", floor=1.0)
    assert relaxed.relaxed_tokens > 0 and relaxed.stats.cost()["argmax_mismatch"] > 0
    never = gen.generate(prompt, max_new_tokens=30, rule="test_always_first", floor=0.0)
    assert never.tokens == gen.vanilla(prompt, max_new_tokens=30).tokens and never.relaxed_tokens == 0
    with pytest.raises(ValueError, match="already registered"):
        register(type("Other", (AlwaysFirst,), {"__qualname__": "Other"}))


def test_a_rule_defined_outside_mars_runs_through_eval_run(tmp_path):
    """`method=<rule>` with its parameters as a typed group, for a rule this file registered: the
    run directory and the summary's method are named from the rule's parameters."""
    from hydra import compose, initialize_config_dir

    from eval.config.paths import REPO_ROOT
    from eval.config.schema import register as register_configs
    from eval.runner.job import run

    register_configs()  # the Hydra schemas of rules registered since eval.config was imported
    standin = save_standin_pair(tmp_path / "standin")
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=[
            f"model.target={standin / 'target'}", f"model.draft={standin / 'draft'}", "model.dtype=float32",
            "model.exact_attention=false", "num_prompts=2", "max_new_tokens=8", "threads=1", "warmup=false",
            f"out_dir={tmp_path / 'out'}", "tree=cpu", "method=test_always_first", "method.floor=1.0",
            "baselines=[vanilla,strict]"])
    summary = run(cfg)
    figures = summary["methods"]["test_always_first[floor=1]"]
    assert figures["rule"] == {"name": "test_always_first", "floor": 1.0}
    assert figures["relaxed_frac"] > 0 and figures["argmax_mismatch"] > 0 and figures["logprob_regret"] > 0
    assert summary["methods"]["strict"]["argmax_mismatch"] == 0.0
    assert Path(figures["run_dir"]).name.startswith("test_always_first[floor=1]-T0-")


def test_plugins_register_rules_from_a_file(tmp_path):
    from eval.config.methods import load_plugins

    plugin = tmp_path / "confident.py"
    plugin.write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\n"
        "from mars.rules import Relaxation, Rule, register\n\n"
        "@register\n@dataclass(frozen=True)\nclass Confident(Rule):\n"
        "    name: ClassVar[str] = 'test_confident'\n\n"
        "    def relax(self, view):\n        return Relaxation.none(view)\n")
    load_plugins(str(plugin))
    assert "test_confident" in RULES
    with pytest.raises(FileNotFoundError, match="MARS_PLUGINS names"):
        load_plugins(str(tmp_path / "missing.py"))
