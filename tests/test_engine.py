"""The core engine: strict greedy speculative decoding equals plain greedy decoding, on every architecture."""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from helpers import OracleHead, forward_tolerance, hf_greedy, longest_reduction, make_tree, random_prompt, tiny_model
from packaging.version import Version
from transformers import DynamicCache

from eagle import Eagle1Head, Eagle3Head, grow_tree
from mars import SpeculativeGenerator
from mars.adapter import cache_keyword
from mars.decoding.settings import TreeShape


def test_greedy_equals_hf_generate_on_every_architecture(arch):
    model = tiny_model(arch)
    rng = random.Random(1)
    for head in (Eagle3Head.for_target(model.config), Eagle1Head.for_target(model)):
        gen = SpeculativeGenerator(model, head, TreeShape(12, 4, 3))
        for length in (1, 7, 40):
            prompt = random_prompt(rng, model.config.vocab_size, length)
            expected = hf_greedy(model, prompt, 24)
            assert gen.generate(prompt, max_new_tokens=24).tokens == expected
            assert gen.vanilla(prompt, max_new_tokens=24).tokens == expected


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_hf_generate_over_tree_settings(seed):
    rng = random.Random(seed)
    model = tiny_model("llama", seed=seed, sharpen=1.0 + seed)
    head = Eagle3Head.for_target(model.config)
    for _ in range(4):
        depth, branching, total = rng.randint(1, 8), rng.randint(1, 10), rng.randint(1, 80)
        length, new = rng.choice([1, 2, 17, 120, 300]), rng.randint(1, 40)
        prompt = random_prompt(rng, model.config.vocab_size, length)
        gen = SpeculativeGenerator(model, head, TreeShape(total, depth, branching))
        expected = hf_greedy(model, prompt, new)
        assert gen.generate(prompt, max_new_tokens=new).tokens == expected, (depth, branching, total)


def oracle_generator(model, prompt, new, **tree):
    continuation = hf_greedy(model, prompt, new + 10)
    head = OracleHead(model.config, prompt[0].tolist() + continuation)
    return SpeculativeGenerator(model, head, TreeShape(**tree)), continuation


@pytest.mark.parametrize("depth,branching,total", [(1, 1, 1), (3, 2, 6), (6, 10, 60), (8, 4, 30)])
def test_oracle_draft_is_accepted_in_full(depth, branching, total):
    model = tiny_model("llama")
    prompt = torch.tensor([[5, 9, 2, 33, 7]])
    new = 1 + 5 * (depth + 1)  # the prefill's token, then five full cycles
    gen, continuation = oracle_generator(model, prompt, new, total_tokens=total, depth=depth, branching=branching)
    out = gen.generate(prompt, max_new_tokens=new)
    assert out.tokens == continuation[:new]
    assert out.accept_lengths == [depth] * 5
    assert out.tau == depth + 1


def test_oracle_with_max_new_tokens_landing_mid_path():
    model = tiny_model("qwen3")
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for new in (1, 2, 5, 9, 13):
        gen, continuation = oracle_generator(model, prompt, new, total_tokens=20, depth=5, branching=2)
        out = gen.generate(prompt, max_new_tokens=new)
        assert out.tokens == continuation[:new]
        assert len(out.tokens) == new
        assert 1 + sum(a + 1 for a in out.accept_lengths) == new  # never drafted past the budget


def test_eos_inside_the_accepted_path_stops_exactly_there():
    model = tiny_model("llama")
    prompt = torch.tensor([[11, 12, 13]])
    gen, continuation = oracle_generator(model, prompt, 30, total_tokens=30, depth=6, branching=3)
    for stop_at in (0, 3, 8):  # an index in the continuation whose token we declare EOS
        eos = continuation[stop_at]
        first = continuation.index(eos)
        out = gen.generate(prompt, max_new_tokens=30, eos_token_id=eos)
        assert out.tokens == continuation[: first + 1]
        assert out.stopped_by == "eos"
        assert out.tokens == hf_greedy(model, prompt, 30, eos_token_id=eos)


def plain_decode_cache(model, tokens: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([tokens]), use_cache=True, **{cache_keyword(model): cache})
    return cache


def test_forwards_name_the_cache_as_the_installed_transformers_does():
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns until
    its removal in 5.40); 5.0-5.23 know only `past_key_values`. pytest.ini makes that warning an
    error, so every forward of the suite (the adapter's included) passes the name the model takes."""
    model = tiny_model("llama")
    name = cache_keyword(model)
    assert name == ("cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values")
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        if name == "cache":
            with pytest.raises(FutureWarning, match="past_key_values"):
                model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True)
        cache = DynamicCache(config=model.config)
        model(ids, use_cache=True, **{name: cache})
    assert cache.get_seq_length() == 3


def test_kv_cache_after_each_cycle_equals_plain_decoding():
    model = tiny_model("mistral")
    prompt = torch.tensor([[8, 6, 7, 5, 3, 0, 9]])
    gen, continuation = oracle_generator(model, prompt, 40, total_tokens=10, depth=3, branching=2)
    random_head = Eagle3Head.for_target(model.config)
    for head in (gen.head, random_head):
        gen.head = head
        cycles = []
        real_keep = gen.target.keep_path

        def recording_keep(path, index=None, _real=real_keep, cycles=cycles):
            _real(path, index)
            cycles.append([(layer.keys.clone(), layer.values.clone()) for layer in gen.target.cache.layers])

        gen.target.keep_path = recording_keep
        out = gen.generate(prompt, max_new_tokens=25)
        gen.target.keep_path = real_keep
        assert out.tokens == continuation[:25]
        emitted = 1
        assert len(cycles) == out.num_cycles - 1  # the last cycle finishes the output and keeps nothing
        for accepted, kv in zip(out.accept_lengths[:-1], cycles, strict=True):
            emitted += accepted + 1
            # Plain decoding of the same tokens: the cache holds everything but the newest token.
            reference = plain_decode_cache(model, prompt[0].tolist() + out.tokens[: emitted - 1])
            # Tree forwards and one-token steps reduce in different kernels: layer l's cache entries went
            # through l layers and their own projection, up to rounding (forward_tolerance).
            terms = longest_reduction(model, prompt.shape[1] + emitted)
            for layer, ((keys, values), ref_layer) in enumerate(zip(kv, reference.layers, strict=True)):
                for got, ref in ((keys, ref_layer.keys), (values, ref_layer.values)):
                    atol = forward_tolerance(layer + 1, terms, ref.abs().max().item())
                    torch.testing.assert_close(got, ref, atol=atol, rtol=0)


def test_tree_is_a_valid_eagle2_tree():
    model = tiny_model("llama")
    head = Eagle3Head.for_target(model.config)
    prompt = torch.arange(1, 9)
    features = torch.randn(8, head.config.feature_size)
    hidden, logprobs = head.extend(features, prompt)
    tree = grow_tree(head, 42, hidden, logprobs, depth=4, branching=3, total_tokens=15)
    assert tree.size == 16 and tree.tokens[0] == 42
    assert head.cache.total == head.cache.length == 8  # tentative nodes dropped
    assert int(tree.depths.max()) <= 4
    for i in range(1, tree.size):
        parent = int(tree.parents[i])
        assert tree.depths[i] == tree.depths[parent] + 1
        # A child's score is its parent's plus a log-probability <= 0 (log_softmax's normaliser is at least
        # the max), and rounding is monotone: never above the parent's, on any CPU.
        assert tree.scores[i] <= tree.scores[parent]
        assert tree.ancestors[i, parent] and tree.ancestors[i, i]
    # Siblings are distinct and ordered by draft probability.
    for kids in tree.children:
        assert len({int(tree.tokens[c]) for c in kids}) == len(kids)
        assert all(tree.scores[a] >= tree.scores[b] for a, b in zip(kids[:-1], kids[1:], strict=True))
    assert len(tree.children[0]) <= 3


def test_bf16_target_runs_and_matches_its_own_vanilla():
    model = tiny_model("llama").to(torch.bfloat16)
    head = Eagle3Head.for_target(model.config).to(torch.bfloat16)
    gen = SpeculativeGenerator(model, head, TreeShape(16, 4, 4))
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    out = gen.generate(prompt, max_new_tokens=20)
    assert len(out.tokens) == 20
    assert out.tokens[0] == gen.vanilla(prompt, max_new_tokens=20).tokens[0]  # same prefill


@pytest.mark.parametrize("prefix", [0, 5, 62, 64, 130])
def test_exact_plan_lists_each_nodes_prefix_and_ancestors_in_cache_order(prefix):
    from mars.adapter.exact import EXACT_BUCKET, bucket, exact_plan

    parents = [-1, 0, 0, 1, 1, 2, 3]
    tree = make_tree(parents, [1] * 7)
    plan = exact_plan(prefix, tree.depths, tree.ancestors, tree.levels)
    widths = [entries.shape[1] for _, entries, _ in plan]
    # One group per width a row needs (prefix 62: the deeper nodes spill into a second bucket).
    assert widths == sorted({bucket(prefix + d + 1) for d in tree.depths.tolist()})
    assert all(w % EXACT_BUCKET == 0 for w in widths) and plan[0][0] is None
    for node in range(7):
        chain = []
        at = node
        while at >= 0:
            chain.append(prefix + at)
            at = parents[at]
        visible = list(range(prefix)) + chain[::-1]
        count, width = len(visible), bucket(len(visible))
        groups = [g for g, (select, entries, _) in enumerate(plan)
                  if entries.shape[1] == width and (select is None or bool(select[node]))]
        # The node is taken from the group of its own width, and from no later group.
        later = [g for g, (select, _, _) in enumerate(plan) if g > groups[-1] and bool(select[node])]
        assert len(groups) == 1 and later == []
        _, entries, pad = plan[groups[0]]
        assert entries[node, :count].tolist() == visible
        assert bool((entries[node, count:] == 0).all())  # padding points at entry 0, masked out
        assert bool((pad[node, 0, :count] == 0).all()) and bool(torch.isinf(pad[node, 0, count:]).all())


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_exact_attention_equals_hf_generate_in_fp32(arch):
    model = tiny_model(arch)
    rng = random.Random(3)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config),
                               TreeShape(12, 4, 3), exact_attention=True)
    for length in (1, 7, 70):
        prompt = random_prompt(rng, model.config.vocab_size, length)
        assert gen.generate(prompt, max_new_tokens=24).tokens == hf_greedy(model, prompt, 24)
    continuation = hf_greedy(model, prompt, 40)
    oracle = OracleHead(model.config, prompt[0].tolist() + continuation)
    gen = SpeculativeGenerator(model, oracle, TreeShape(12, 4, 3), exact_attention=True)
    out = gen.generate(
        prompt, max_new_tokens=30)
    assert out.tokens == continuation[:30] and out.accept_lengths[0] == 4


def test_exact_attention_makes_bf16_verification_bitwise_equal_to_plain_decoding():
    """In bf16, tree verification with masked attention differs from plain decoding in rounding;
    exact attention gives every row the same computation as plain decoding, so outputs are identical."""
    model = tiny_model("llama", sharpen=1.0).to(torch.bfloat16)
    rng = random.Random(4)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config).to(torch.bfloat16),
                               TreeShape(16, 4, 4), exact_attention=True)
    for _ in range(6):
        prompt = random_prompt(rng, model.config.vocab_size, rng.randrange(1, 120))
        plain = gen.vanilla(prompt, max_new_tokens=40).tokens
        # A draft that proposes plain decoding's own continuation: long accepted paths, deep tree rows.
        oracle = OracleHead(model.config, prompt[0].tolist() + plain + [0] * 20)
        spec = SpeculativeGenerator(model, oracle.to(torch.bfloat16), TreeShape(16, 4, 4),
                                    exact_attention=True).generate(prompt, max_new_tokens=40)
        assert spec.tokens == plain
        assert sum(spec.accept_lengths) >= 20
        assert gen.generate(prompt, max_new_tokens=40).tokens == plain


def test_exact_attention_refuses_sliding_window_models():
    model = tiny_model("mistral", sliding_window=16)
    with pytest.raises(NotImplementedError, match="sliding window"):
        SpeculativeGenerator(model, Eagle3Head.for_target(model.config), exact_attention=True)


def test_feature_hooks_capture_what_output_hidden_states_gives_and_leave_no_hooks(arch):
    """The draft's taps (a layer's input, the final normed state) through hooks, as transformers'
    `hidden_states` gives them; the hooks exist only inside `tapped()` (a generator's calls)."""
    from mars.adapter import TargetModel

    model = tiny_model(arch)
    n = model.config.num_hidden_layers
    hooks = lambda: [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]  # noqa: E731
    target = TargetModel(model, [0, 2, n])
    prompt = random_prompt(random.Random(3), model.config.vocab_size, 11)[0]
    _, by_output = target.prefill(prompt, capacity=32)  # no hooks of ours: output_hidden_states
    before = hooks()  # transformers installs its own recording hooks at the first such call
    with target.tapped():
        assert target.taps is not None
        _, by_hooks = target.prefill(prompt, capacity=32)
    assert target.taps is None
    assert torch.equal(by_hooks, by_output) and by_hooks.shape == (11, 3 * model.config.hidden_size)
    assert hooks() == before


def test_exact_plan_rows_lists_each_rows_prefix_and_ancestors_in_its_own_keys():
    """Batched: row b's nodes see row b's first lengths[b] entries and their ancestors at `start` + node, in
    the keys of row b laid end to end with the others' (row b's at b * (start + n))."""
    from mars.adapter.exact import bucket, exact_plan_rows

    parents = [-1, 0, 0, 1, 1, 2, 3]
    tree = make_tree(parents, [1] * 7)
    lengths, start, n = [5, 62, 30], 62, 7
    plan = exact_plan_rows(torch.tensor(lengths), (min(lengths), max(lengths)), start,
                           tree.depths.expand(3, -1), tree.ancestors.expand(3, -1, -1), tree.levels)
    for b, length in enumerate(lengths):
        for node in range(n):
            chain, at = [], node
            while at >= 0:
                chain.append(start + at)
                at = parents[at]
            visible = [b * (start + n) + c for c in list(range(length)) + chain[::-1]]
            width = bucket(len(visible))
            row = b * n + node
            groups = [g for g, (select, entries, _) in enumerate(plan)
                      if entries.shape[1] == width and (select is None or bool(select[row]))]
            later = [g for g, (select, _, _) in enumerate(plan) if g > groups[-1] and bool(select[row])]
            assert len(groups) == 1 and later == []
            _, entries, pad = plan[groups[0]]
            assert entries[row, : len(visible)].tolist() == visible
            shown = len(visible)
            assert bool(torch.isinf(pad[row, 0, shown:]).all()) and bool((pad[row, 0, :shown] == 0).all())
