"""The engine's API: one meaning per name, one sampling config, imports that run one way, explicit
device hops, a model handed back as it was given, and tau counted over emitted tokens only."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import OracleHead, hf_greedy, tiny_generator, tiny_model

from eagle import Eagle3Head
from eagle.config import eos_token_ids
from mars import SamplingConfig, SpeculativeGenerator, VerifyStats, make_rule
from mars.adapter import DeviceRoute, module_device, route_devices
from mars.decoding.settings import TreeShape
from mars.verification.sampling import resolve_sampling

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("compute", "eagle", "mars", "eval")
ALLOWED = {"eval": {"eval", "mars", "eagle", "compute"}, "mars": {"mars", "eagle", "compute"},
           "eagle": {"eagle", "compute"}, "compute": {"compute"}}
# eval's layers, top first: a module imports its own layer and those below it. The top layer is the
# commands (eval/*.py: python -m eval.run, eval.score, ...); every package below them has one place.
EVAL_LAYERS = ("", "runner", "reporting", "benchmarks", "scoring", "rundirs", "config")
# mars's rooms, top first, the same way: the package's face (mars/__init__.py) over measured settings, the
# diagnostics, the loop, verification, its books, the rules and the target adapter at the ground.
MARS_LAYERS = ("", "tuning", "diagnostics", "decoding", "verification", "accounting", "rules", "adapter")

pytestmark = pytest.mark.usefixtures("single_thread")


# --- names ------------------------------------------------------------------------------------

def test_mars_verify_is_the_module():
    import mars
    import mars.verification.verify as v  # the attribute of the package, which a function named `verify` would shadow

    assert isinstance(v, types.ModuleType) and v.__name__ == "mars.verification.verify"
    assert mars.verification.verify is v
    assert all(callable(getattr(v, name, None)) for name in ("accept_greedy", "accept_sampling", "accept"))


def test_the_tree_is_one_argument_that_checks_its_own_settings():
    """`SpeculativeGenerator(tree=TreeShape(...))`: loose tree arguments are refused naming the fix, and
    every rule about a tree (sizes, drafting modes, adaptive with sampled drafts) is the TreeShape's."""
    model = tiny_model("llama")
    head = Eagle3Head.for_target(model.config)
    with pytest.raises(TypeError, match=r"tree=TreeShape\(total_tokens=.*not branching, depth"):
        SpeculativeGenerator(model, head, depth=3, branching=2)
    with pytest.raises(TypeError, match="must be a mars.decoding.settings.TreeShape"):
        SpeculativeGenerator(model, head, (8, 3, 2))
    sizes = dict(total_tokens=8, depth=3, branching=2)
    for bad, match in ((dict(depth=0), "tree.depth must be an integer >= 1"),
                       (dict(branching=True), "tree.branching must be an integer"),
                       (dict(total_tokens=2.5), "tree.total_tokens must be an integer"),
                       (dict(drafting="beam"), "tree.drafting must be one of auto, topk, sample"),
                       (dict(adaptive=True, drafting="sample"), "adaptive tree")):
        with pytest.raises(ValueError, match=match):
            TreeShape(**{**sizes, **bad})
    assert (TreeShape(**sizes).drafts(sampled=True), TreeShape(**sizes).drafts(sampled=False)) == ("sample", "topk")
    assert TreeShape(**sizes, adaptive=True).drafts(sampled=True) == "topk"
    assert TreeShape(**sizes, drafting="topk").resolved(sampled=True).drafting == "topk"
    gen = SpeculativeGenerator(model, head, TreeShape(**sizes, adaptive=True))
    with pytest.raises(ValueError, match="adaptive=False"):
        gen.generate([torch.tensor([4, 8, 15]), torch.tensor([16, 23])], max_new_tokens=4)
    gen.use_tree(TreeShape(**sizes))
    assert len(gen.generate([torch.tensor([4, 8, 15]), torch.tensor([16, 23])], max_new_tokens=4)) == 2


# --- one sampling config ----------------------------------------------------------------------

def test_sampling_config_is_keyword_only():
    with pytest.raises(TypeError):
        SamplingConfig(1.0)  # positional: refused
    assert resolve_sampling(temperature=1.0, rule="mars").rule == make_rule("mars")


def test_generate_takes_a_config_or_keyword_overrides_alike():
    gen = tiny_generator(2, 3, sharpen=2.0, total_tokens=10, depth=3, branching=3)
    prompt = torch.tensor([[1, 2, 3, 4]])
    cfg = resolve_sampling(temperature=0.8, top_p=0.9, rule="mars", theta=0.5, margin="prob_ratio")
    by_config = gen.generate(prompt, cfg, max_new_tokens=20, generator=torch.Generator().manual_seed(7))
    by_kwargs = gen.generate(prompt, max_new_tokens=20, generator=torch.Generator().manual_seed(7), temperature=0.8,
                             top_p=0.9, rule="mars", theta=0.5, margin="prob_ratio")
    assert by_config.tokens == by_kwargs.tokens and by_config.accept_lengths == by_kwargs.accept_lengths
    # Overrides replace the config's fields: a config at temperature 0.8 overridden to greedy is greedy.
    greedy = gen.generate(prompt, cfg, max_new_tokens=20, temperature=0.0, rule="strict")
    assert greedy.tokens == gen.vanilla(prompt, max_new_tokens=20).tokens
    plain = gen.vanilla(prompt, cfg, max_new_tokens=20, generator=torch.Generator().manual_seed(1))
    assert plain.tokens == gen.vanilla(prompt, max_new_tokens=20, generator=torch.Generator().manual_seed(1),
                                       temperature=0.8, top_p=0.9).tokens
    with pytest.raises(TypeError, match="valid: temperature, top_p"):
        gen.generate(prompt, temprature=1.0)
    with pytest.raises(TypeError, match="SamplingConfig"):
        gen.generate(prompt, 64)  # the old positional max_new_tokens


# --- imports run one way ----------------------------------------------------------------------

def project_imports() -> dict[str, set[str]]:
    """{module: project modules it imports, at module level or inside functions}."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in paths}
        graph[module] = {m for m in found if m.split(".")[0] in PACKAGES}
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """A cycle of the directed graph `edges` as a list of nodes (first == last), or []."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        if m in stack:
            return stack[stack.index(m):] + [m]
        if m in done:
            return []
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if cycle := visit(n):
                return cycle
        stack.pop()
        done.add(m)
        return []

    for m in sorted(edges):
        if cycle := visit(m):
            return cycle
    return []


def test_imports_run_from_eval_to_mars_to_eagle_to_compute():
    upward = [(module, imported) for module, imports in project_imports().items() for imported in imports
              if imported.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert upward == []


def layer(module: str, layers: tuple[str, ...]) -> int:
    """The index in `layers` of a module's sub-package (eval.runner.job -> runner; eval.run, a module at the
    package's root, -> "")."""
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in layers) else ""
    return layers.index(package)


def upward_imports(package: str, layers: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, imported) where a module of `package` imports one of a layer above its own."""
    return [(module, imported) for module, imports in project_imports().items() if module.startswith(package + ".")
            for imported in imports if imported.startswith(package + ".")
            and layer(imported, layers) < layer(module, layers)]


def sub_packages(package: str) -> set[str]:
    return {p.name for p in (REPO / package).iterdir() if (p / "__init__.py").exists()}


def test_eval_imports_run_from_commands_down_to_config():
    assert sub_packages("eval") == set(EVAL_LAYERS) - {""}  # a new package gets a place in the order
    assert upward_imports("eval", EVAL_LAYERS) == []
    assert layer("eval.run", EVAL_LAYERS) == 0 and layer("eval.runner.job", EVAL_LAYERS) == 1
    assert layer("eval.config", EVAL_LAYERS) == 6


def test_mars_rooms_import_only_the_rooms_below_them():
    """Every module of mars lives in a room named for what it holds, and imports only its own room's modules
    and the rooms below it: nothing but the package's face stands at mars's root."""
    assert sub_packages("mars") == set(MARS_LAYERS) - {""}
    assert {p.name for p in (REPO / "mars").glob("*.py")} == {"__init__.py"}
    assert upward_imports("mars", MARS_LAYERS) == []
    assert layer("mars.decoding.generate", MARS_LAYERS) < layer("mars.verification.verify", MARS_LAYERS)


def test_project_modules_import_no_cycle():
    graph = project_imports()
    # A submodule importing its own package's __init__ (which re-exports it) is Python's normal layout,
    # and a script module importing itself by name (eval.run's __main__ block, for launchers) is no cycle.
    edges = {m: {i for i in imports if i in graph and i != m and not m.startswith(i + ".")}
             for m, imports in graph.items()}
    assert find_cycle(edges) == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself


def test_the_import_check_would_catch_an_upward_import(tmp_path, monkeypatch):
    """The check itself: a fake eagle module importing mars is reported."""
    fake = tmp_path / "eagle"
    fake.mkdir()
    (fake / "bad.py").write_text("from mars import SpeculativeGenerator\n")
    for package in ("mars", "eval"):
        (tmp_path / package).mkdir()
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError):
        test_imports_run_from_eval_to_mars_to_eagle_to_compute()


# --- helpers, once ------------------------------------------------------------------------------

def test_eos_ids_come_from_one_function():
    model = tiny_model("llama")
    model.generation_config.eos_token_id = [2, 7]

    class Tok:
        eos_token_id = 9

    assert eos_token_ids(model, Tok()) == {2, 7, 9}
    assert eos_token_ids(model) == {2, 7}
    assert eos_token_ids(eos_token_id=5) == {5} and eos_token_ids(eos_token_id=[5, 6]) == {5, 6}
    assert eos_token_ids() == frozenset()


def test_verify_stats_round_trip_through_json_keeps_every_count():
    gen = tiny_generator(5, 6, sharpen=2.0, total_tokens=12, depth=4, branching=4)
    out = gen.generate(torch.tensor([[7, 0, 11, 4, 9]]), max_new_tokens=30, rule="mars")
    stats = out.stats
    stats.gates.append(float("inf"))  # a non-finite margin, as at a position filtered to one token
    stats.counters.update(nonfinite=1, negative_logit=2)
    stats.sampled, stats.tv_sum, stats.kl_sum, stats.kl_infinite = 3, 0.25, 0.5, 1
    back = VerifyStats.from_json(stats.to_json())
    assert back.counters == stats.counters
    assert back.attempts == stats.attempts and back.accepts == stats.accepts and back.relaxed == stats.relaxed
    assert back.positions == stats.positions and back.relax_allowed == stats.relax_allowed
    assert back.gates == pytest.approx([m for m in stats.gates if m != float("inf")], abs=1e-4)
    assert back.summary()["nonfinite_positions"] == stats.counters["nonfinite"]
    assert back.cost() == stats.cost() and back.cost()["kl_per_token"] == pytest.approx(0.25)


# --- tau ----------------------------------------------------------------------------------------

def test_tau_counts_only_emitted_tokens_when_eos_ends_a_path_early():
    model = tiny_model("llama")
    prompt = torch.tensor([[11, 12, 13]])
    continuation = hf_greedy(model, prompt, 40)
    oracle = OracleHead(model.config, prompt[0].tolist() + continuation)
    gen = SpeculativeGenerator(model, oracle, TreeShape(30, 6, 3))
    # The oracle's paths are accepted whole (6 drafted + 1 bonus per cycle). An EOS at index 10 falls
    # inside the second cycle's path (drafted 8..13, bonus 14): that cycle emits 3 drafted tokens only.
    eos = continuation[10]
    assert continuation.index(eos) == 10
    out = gen.generate(prompt, max_new_tokens=40, eos_token_id=eos)
    assert out.tokens == continuation[:11] and out.stopped_by == "eos"
    assert out.accept_lengths == [6, 3]
    assert out.tau == (len(out.tokens) - 1) / out.num_cycles == 5.0  # 7 + 3 tokens in 2 cycles, not 7 + 4


# --- devices --------------------------------------------------------------------------------------

def test_device_routing_reads_the_models_device_map():
    model = tiny_model("llama")
    assert route_devices(model) == DeviceRoute(inputs=torch.device("cpu"), logits=torch.device("cpu"))
    # A model sharded over two GPUs by `device_map="auto"` records where each module went.
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1,
                           "model.layers.3": 1, "model.layers.4": 1, "model.layers.5": 1, "model.norm": 1,
                           "model.rotary_emb": 1, "lm_head": 1}
    assert route_devices(model) == DeviceRoute(inputs=torch.device("cuda:0"), logits=torch.device("cuda:1"))
    assert module_device(model, "model.layers.3.mlp") == torch.device("cuda:1")
    model.hf_device_map = {"": "cpu"}  # everything on one device
    assert route_devices(model).logits == torch.device("cpu")


def test_a_generator_on_another_device_than_the_logits_is_refused():
    gen = tiny_generator(0, 1, sharpen=2.0, total_tokens=6, depth=2, branching=2)
    gen.target.devices = DeviceRoute(inputs=torch.device("cpu"), logits=torch.device("cuda:1"))
    with pytest.raises(ValueError, match="torch.Generator\\(device='cuda:1'\\)"):
        gen.generate(torch.tensor([[1, 2]]), temperature=1.0, generator=torch.Generator())


# --- nothing done to the caller's model behind its back -------------------------------------------

def test_exact_attention_leaves_other_uses_of_the_model_alone_and_close_restores_it():
    model = tiny_model("llama")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [0, 0, 0, 2, 7, 1, 8, 2]])
    padding = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]])  # a left-padded batch
    before = model.config._attn_implementation
    with torch.inference_mode():
        reference = model(ids, attention_mask=padding).logits
    prompt = torch.tensor([[2, 7, 1, 8]])
    with SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(8, 3, 2),
                              exact_attention=True) as gen:
        assert model.config._attn_implementation == "mars_exact"
        with torch.inference_mode():
            assert torch.equal(model(ids, attention_mask=padding).logits, reference)  # no plan: plain SDPA
        assert gen.generate(prompt, max_new_tokens=16).tokens == hf_greedy(model, prompt, 16)
    assert model.config._attn_implementation == before
    with pytest.raises(RuntimeError, match="no longer 'mars_exact'"):
        gen.generate(prompt, max_new_tokens=4)


def test_tuned_gives_an_importing_researcher_the_settings_a_run_measures(tmp_path):
    """mars.tuned: precision, kernels and tree measured (strict's jointly, then the rule's own tree at strict's
    kernels), cached, and a generator built with them that decodes as its verdict says: strict greedy output is
    plain greedy decoding's at the trees' kernels, or, where no tree paid, the plain decoding the verdict names."""
    from helpers import save_standin_pair

    from mars import tuned

    pair = save_standin_pair(tmp_path / "pair")
    prompts = [torch.tensor([[1, 5 + i, 9, 33, 7, 12]]) for i in range(4)]  # calibration's least is 3
    args = (pair / "target", pair / "draft")
    # 6 s for the calibrations, short turns: what this test reads (kernels, tree, cache) needs no long finals
    common = {"prompts": prompts, "cache_dir": tmp_path / "cache", "budget": 6.0, "max_new_tokens": 12,
              "log": lambda _: None}
    gen = tuned(*args, rule="mars", theta=0.9, **common)
    strict, relaxed = gen.calibration["strict"], gen.calibration["mars"]
    assert not strict.cached and not relaxed.cached and relaxed.rule["theta"] == 0.9
    # the trees verify at strict's kernels, plain decoding runs at the fastest plain kernels calibration raced
    assert relaxed.kernels == strict.kernels
    assert (gen.tree_kernels, gen.plain_kernels) == (strict.kernels, strict.plain_kernels)
    assert (gen.prepack, gen.target.model.dtype) == (strict.kernels.prepack, strict.kernels.torch_dtype)
    assert gen.tree == relaxed.tree and gen.speculate == gen.speculation["mars"].speculate
    again = tuned(*args, **common)  # strict alone: its calibration is cached, nothing is timed
    assert again.calibration["strict"].cached and set(again.calibration) == {"strict"}
    assert again.tree == strict.tree and again.speculate == strict.speculate
    with again:
        out = again.generate(prompts[0], max_new_tokens=12)
        if again.speculate:  # strict greedy: plain greedy decoding at the trees' kernels, token for token
            assert out.tokens == again.vanilla(prompts[0], max_new_tokens=12, tree_kernels=True).tokens
        elif again.plain_decoding is None:  # off, decoding with our vanilla
            assert out.tokens == again.vanilla(prompts[0], max_new_tokens=12).tokens
        else:  # off, decoding with model.generate
            assert again.plain_decoding.label == again.speculation["strict"].plain
            assert out.tokens == again.plain_decoding.decode([prompts[0][0].tolist()], SamplingConfig(), 12,
                                                             [], 0)[0].tokens
    fixed = tuned(*args, tree="paper", dtype="float32", **common)  # a named tree, a fixed precision: nothing to time
    assert fixed.tree == TreeShape(49, 7, 10, drafting="topk") and "strict" in fixed.calibration
    with pytest.raises(ValueError, match="tree must be 'auto'"):
        tuned(*args, tree="huge", **common)
