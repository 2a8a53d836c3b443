"""The hot loop's host-synchronisation budget, counted on CPU with `mars.syncs.SyncCounter`: what
would make a GPU wait (reads of device tensors, value-dependent shapes, uploads of host data)."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import OracleHead, hf_greedy, random_prompt, tiny_model

from eagle import Eagle3Head
from mars import SpeculativeGenerator
from mars.rules import RULES
from mars.syncs import SyncCounter

pytestmark = pytest.mark.usefixtures("single_thread")

# Steady state per cycle: one read of the verdict, one upload of its path and next token.
BUDGET = 2


def test_counter_tells_device_reads_and_uploads_from_host_work():
    weights = torch.randn(4, 4)  # made outside the counter: a "device" tensor, like a parameter
    with SyncCounter() as syncs:
        host = torch.tensor([1, 2, 3])  # host data
        host.tolist(), int(host[0]), bool(host.sum() > 0)  # reading host tensors is free
        assert syncs.total == 0
        (weights @ weights).sum().item()  # a device read
        weights[host[:2]]  # a host index used on the device: copied up
        weights[weights > 0]  # boolean indexing: a shape that depends on device values
        torch.tensor([1.0], device=weights.device)  # host data sent to the device
        host.to(weights.device)
        weights.float().cpu().tolist()  # the .cpu() waits; its result is host data
    assert dict(syncs.by_kind) == {"item": 1, "upload": 3, "bool_index": 1, "cpu": 1}


def per_cycle(gen: SpeculativeGenerator, prompt: torch.Tensor, **kwargs) -> tuple[float, dict]:
    """Syncs per cycle in the steady state: the difference between a long and a short generation,
    so that the prefill's few reads are not spread over the cycles."""
    counts = []
    for tokens in (24, 72):
        rng = torch.Generator().manual_seed(0) if kwargs.get("temperature") else None
        with SyncCounter() as syncs:
            out = gen.generate(prompt, max_new_tokens=tokens, generator=rng, **kwargs)
        counts.append((syncs.total, out.num_cycles, syncs.by_kind))
    (s0, c0, _), (s1, c1, kinds) = counts
    assert c1 > c0
    return (s1 - s0) / (c1 - c0), dict(kinds)


# Every built-in rule in each of its forms, with a random head; strict and MARS with an oracle head too.
BUILT_IN = [name for name, cls in RULES.items() if cls.__module__.startswith("mars.rules.")]
CASES = [(name, t, False) for name in BUILT_IN for t in (0.0, 1.0) if t or RULES[name].greedy_form] + [
    (name, t, True) for name in ("strict", "mars") for t in (0.0, 1.0)]


@pytest.mark.parametrize("rule,temperature,oracle", CASES)
def test_a_cycle_synchronises_at_most_twice(rule, temperature, oracle):
    model = tiny_model("llama")
    torch.manual_seed(1)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    sequence = prompt[0].tolist() + hf_greedy(model, prompt, 80)
    head = OracleHead(model.config, sequence) if oracle else Eagle3Head.for_target(model.config)
    with SpeculativeGenerator(model, head, total_tokens=20, depth=4, branching=5) as gen:
        syncs, kinds = per_cycle(gen, prompt, rule=rule, temperature=temperature)
    print(f"{rule} T={temperature} {'oracle' if oracle else 'random'} head: {syncs:.2f} syncs per cycle {kinds}")
    assert syncs <= BUDGET, kinds
    assert set(kinds) <= {"tolist", "upload", "item"}, kinds  # `item`: the prefill's first token only


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_shapes_keep_the_budget(temperature):
    """Static mode (eager; compiling would only change the kernels): padding, the fixed-width masks
    and the cache's device-resident length add no synchronisation."""
    model = tiny_model("llama")
    torch.manual_seed(1)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    with SpeculativeGenerator(model, Eagle3Head.for_target(model.config), total_tokens=20, depth=4, branching=5,
                              static=True) as gen:
        syncs, kinds = per_cycle(gen, prompt, rule="mars", temperature=temperature)
    print(f"static T={temperature}: {syncs:.2f} syncs per cycle {kinds}")
    assert syncs <= BUDGET, kinds
    assert set(kinds) <= {"tolist", "upload", "item"}, kinds
