"""Batched speculative decoding (`generate` of a list of prompts): every row decodes as it would alone.

Rows of different prompt lengths accept different numbers of tokens per cycle and leave the batch at
different times; strict greedy output of every row equals plain greedy decoding of its prompt alone,
on every architecture; strict sampling emits each row's target distribution (chi-square over the rows
of one batch; end to end, with sampled and top-k drafts, in `tests/test_lossless.py`); a rule at its
never-relaxing parameters is strict draw for draw; the host reads and uploads once per cycle whatever
the batch size.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from helpers import (
    OracleHead,
    chi_square_pvalue,
    count_by_cycle,
    emitted,
    hf_greedy,
    make_tree,
    random_prompt,
    split_tree,
    tiny_model,
)
from helpers import tree_outcome_distribution as outcome_distribution

from eagle import Eagle3Head
from eagle.tree import DraftTree
from mars import RULES, SpeculativeGenerator
from mars.decoding.settings import TreeShape
from mars.verification.sampling import SamplingConfig
from mars.verification.verify import accept_rows

pytestmark = pytest.mark.usefixtures("single_thread")

TREE = dict(total_tokens=12, depth=4, branching=3)
LENGTHS = (5, 11, 3, 17)  # prompts of different lengths: ragged from the prefill on


def prompts_for(model, lengths=LENGTHS, seed: int = 0) -> list[torch.Tensor]:
    rng = random.Random(seed)
    return [random_prompt(rng, model.config.vocab_size, n) for n in lengths]


def oracle_generator(model, prompts, max_new_tokens: int, acceptance: float = 0.7, **settings):
    """A generator whose head drafts each row's own greedy continuation, right `acceptance` of the time:
    rows accept different numbers of tokens in a cycle."""
    sequences = [p[0].tolist() + hf_greedy(model, p, max_new_tokens + TREE["depth"] + 2) for p in prompts]
    head = OracleHead(model.config, acceptance=acceptance, sequences=sequences)
    tree, others = split_tree({**TREE, **settings})
    return SpeculativeGenerator(model, head, tree, **others)


def test_strict_greedy_rows_equal_plain_decoding_of_each_prompt_alone(arch):
    model = tiny_model(arch)
    prompts = prompts_for(model)
    gen = oracle_generator(model, prompts, 24)
    outs = gen.generate(prompts, max_new_tokens=24)
    assert [o.tokens for o in outs] == [hf_greedy(model, p, 24) for p in prompts]
    assert all(o.tau > 1.5 for o in outs), [o.tau for o in outs]  # drafts were accepted ...
    assert len({tuple(o.accept_lengths) for o in outs}) > 1  # ... in different numbers per row


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_rows_with_exact_attention_equal_plain_decoding_alone(arch):
    """bf16 with exact attention (each row over exactly its visible keys, `exact_plan_rows`): every row equals
    plain greedy decoding of its prompt alone with the same adapter, as at batch 1."""
    model = tiny_model(arch).to(torch.bfloat16)
    prompts = prompts_for(model)
    gen = oracle_generator(model, prompts, 24, exact_attention=True)
    gen.head.to(torch.bfloat16)
    outs = gen.generate(prompts, max_new_tokens=24)
    assert [o.tokens for o in outs] == [gen.vanilla(p, max_new_tokens=24).tokens for p in prompts]
    assert [o.tokens for o in gen.vanilla(prompts, max_new_tokens=24)] == [o.tokens for o in outs]
    assert all(o.tau > 1.5 for o in outs)


def test_rows_that_stop_early_leave_the_batch_and_the_rest_decode_on():
    model = tiny_model("llama")
    prompts = prompts_for(model, (6, 9, 4, 13, 7, 5), seed=3)
    alone = [hf_greedy(model, p, 30) for p in prompts]
    stop = Counter(t for tokens in alone for t in tokens[2:20]).most_common(1)[0][0]  # ends some rows early
    expected = [hf_greedy(model, p, 30, eos_token_id=stop) for p in prompts]
    assert len({len(e) for e in expected}) > 2
    gen = oracle_generator(model, prompts, 30)
    outs = gen.generate(prompts, max_new_tokens=30, eos_token_id=stop)
    assert [o.tokens for o in outs] == expected
    assert [o.stopped_by for o in outs] == ["eos" if len(e) < 30 else "length" for e in expected]
    assert outs[min(range(6), key=lambda i: len(expected[i]))].seconds < max(o.seconds for o in outs)


def test_batched_vanilla_equals_plain_decoding_of_each_prompt_alone():
    model = tiny_model("qwen3")
    prompts = prompts_for(model)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE))
    outs = gen.vanilla(prompts, max_new_tokens=20)
    assert [o.tokens for o in outs] == [hf_greedy(model, p, 20) for p in prompts]
    assert [o.num_cycles for o in outs] == [19] * 4


def test_a_prompt_given_several_times_is_prefilled_once_and_each_row_decodes_as_it_alone(monkeypatch):
    """k answers to one question (pass@k, a statistical test's draws): the rows of one prompt tensor given k
    times copy its one prefill (a copy of it is prefilled on its own: values are never compared, a host read),
    and each row still decodes exactly as the prompt alone, beside another prompt."""
    model = tiny_model("llama")
    a, b = prompts_for(model, (7, 12), seed=5)
    prompts = [a, b, a, a.clone(), a]
    gen = oracle_generator(model, prompts, 20)
    target = type(gen.target)
    real, lengths = target.prefill, []
    monkeypatch.setattr(target, "prefill",
                        lambda self, ids, capacity: lengths.append(ids.numel()) or real(self, ids, capacity))
    outs = gen.generate(prompts, max_new_tokens=20)
    assert sorted(lengths) == [7, 7, 12]
    assert [o.tokens for o in outs] == [hf_greedy(model, p, 20) for p in prompts]
    assert len({tuple(o.accept_lengths) for o in outs}) > 1  # the copies decode on their own
    lengths.clear()
    assert [o.tokens for o in gen.vanilla(prompts, max_new_tokens=20)] == [o.tokens for o in outs]
    assert sorted(lengths) == [7, 7, 12]


def test_a_batch_of_one_equals_generate():
    model = tiny_model("llama")
    prompt = prompts_for(model)[1]
    gen = oracle_generator(model, [prompt], 24)
    one = gen.generate([prompt], max_new_tokens=24)[0]
    gen.head.sequence = gen.head.sequences[0]
    alone = gen.generate(prompt, max_new_tokens=24)
    assert (one.tokens, one.accept_lengths) == (alone.tokens, alone.accept_lengths)


@pytest.mark.parametrize("name,temperature", [(n, t) for n, cls in RULES.items() if n != "strict"
                                                for t in (0.0, 1.0) if t or cls.greedy_form])
def test_a_rule_that_never_relaxes_is_strict_on_a_batch_draw_for_draw(name, temperature):
    model = tiny_model("llama", sharpen=1.5)
    prompts = prompts_for(model)
    gen = oracle_generator(model, prompts, 20, acceptance=0.8)

    def run(rule, **params):
        rng = torch.Generator().manual_seed(7)
        outs = gen.generate(prompts, max_new_tokens=20, temperature=temperature, generator=rng, rule=rule,
                                  **params)
        return [(o.tokens, o.accept_lengths) for o in outs]

    assert run(name, **RULES[name].never_relaxes) == run("strict")


def test_mars_relaxes_on_a_batch_where_the_target_is_unsure():
    model = tiny_model("llama", sharpen=1.0)
    prompts = prompts_for(model)
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE))
    outs = gen.generate(prompts, max_new_tokens=24, rule="mars", theta=0.5)
    assert sum(o.relaxed_tokens for o in outs) > 0


def forest_of(trees: list[DraftTree]) -> DraftTree:
    stack = lambda f: torch.stack([f(t) for t in trees])  # noqa: E731
    return DraftTree.forest(stack(lambda t: t.tokens), stack(lambda t: t.parents), stack(lambda t: t.depths),
                            stack(lambda t: t.scores), max(t.levels for t in trees))


def test_strict_sampling_emits_each_rows_target_distribution():
    """Chi-square over the rows of one batch: each row's tree and target distribution differ."""
    torch.manual_seed(0)
    vocab = 5
    trees = [make_tree([-1, 0, 0, 1, 1, 3], [0, 1, 2, 3, 4, 1]), make_tree([-1, 0, 1, 2, 0, 4], [2, 0, 1, 3, 4, 0]),
             make_tree([-1, 0, 0, 0, 1, 2], [1, 3, 0, 2, 4, 4])]
    processed = torch.randn(len(trees), 6, vocab) * 1.5
    forest, cfg = forest_of(trees), SamplingConfig(temperature=1.0)
    counts = [Counter() for _ in trees]
    rng = torch.Generator().manual_seed(1)
    for _ in range(4000):
        for b, verdict in enumerate(accept_rows(processed.flatten(0, 1), forest, cfg, rng)):
            counts[b][emitted(verdict, trees[b])] += 1
    for b, tree in enumerate(trees):
        assert chi_square_pvalue(counts[b], outcome_distribution(processed[b], tree)) > 1e-3


@pytest.mark.parametrize("temperature,dtype", [(0.0, torch.float32), (1.0, torch.float32), (0.0, torch.bfloat16)])
def test_a_cycle_reads_and_uploads_once_whatever_the_batch_size(temperature, dtype, monkeypatch):
    """bf16: with exact attention, whose plan is built on the device from the rows' lengths."""
    model = tiny_model("llama").to(dtype)
    seen = {}
    for batch in (4, 16):
        prompts = prompts_for(model, [3 + (5 * i) % 14 for i in range(batch)], seed=batch)
        gen = oracle_generator(model, prompts, 32, exact_attention=dtype == torch.bfloat16)
        gen.head.to(dtype)
        rng = torch.Generator().manual_seed(0) if temperature else None
        per_cycle, kinds, outs = count_by_cycle(lambda gen=gen, prompts=prompts, rng=rng: gen.generate(
            prompts, max_new_tokens=32, rule="mars", temperature=temperature, generator=rng), monkeypatch)
        assert len(per_cycle) == max(o.num_cycles for o in outs) >= 8
        assert max(per_cycle) <= 2, (batch, per_cycle, kinds)
        assert set(kinds) <= {"tolist", "upload"}, kinds
        seen[batch] = max(per_cycle)
    assert seen[4] == seen[16] == 2


def test_bad_batches_are_refused_with_the_fix():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE))
    with pytest.raises(ValueError, match="several prompts as a list of LongTensors"):
        gen.generate(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="non-empty list"):
        gen.generate([])
    with pytest.raises(ValueError, match=r"shape \[T\] or \[1, T\]"):
        gen.generate([torch.ones(2, 4, dtype=torch.long)])
    with pytest.raises(ValueError, match="adaptive=False"):
        SpeculativeGenerator(model, gen.head, TreeShape(**TREE, adaptive=True)).generate(prompts_for(model))
    with pytest.raises(ValueError, match="static=False"):
        SpeculativeGenerator(model, gen.head, TreeShape(**TREE), static=True).generate(prompts_for(model))
