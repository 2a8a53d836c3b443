"""The hot loop's host-synchronisation budget, counted on CPU with `mars.diagnostics.syncs.SyncCounter`: what
would make a GPU wait (reads of device tensors, value-dependent shapes, uploads of host data).

The counter first, one kind of host read at a time; then the budget of a cycle on every path of the
loop (`PATHS`), counted cycle by cycle; then the adaptive tree's growth decisions, which are read
once per tree."""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from accelerate.hooks import attach_align_device_hook_on_blocks
from helpers import OracleHead, count_by_cycle, hf_greedy, random_prompt, split_tree, summation_tolerance, tiny_model

from eagle import Eagle3Head
from eagle.tree import grow_tree
from mars import SpeculativeGenerator
from mars.decoding.adaptive import AdaptiveTree, CycleCosts
from mars.decoding.generate import GenerationOutput
from mars.decoding.settings import TreeShape
from mars.diagnostics.syncs import SyncCounter
from mars.rules import RULES

pytestmark = pytest.mark.usefixtures("single_thread")

BUDGET = 4  # the most syncs any cycle of any path may make (issue #27)


# --- the counter ------------------------------------------------------------------------------------

def test_counter_tells_device_reads_and_uploads_from_host_work():
    weights = torch.randn(4, 4)  # made outside the counter: a "device" tensor, like a parameter
    with SyncCounter() as syncs:
        host = torch.tensor([1, 2, 3])  # host data
        host.tolist(), int(host[0]), bool(host.sum() > 0), repr(host)  # reading host tensors is free
        assert syncs.total == 0
        (weights @ weights).sum().item()  # a device read
        weights[host[:2]]  # a host index used on the device: copied up
        weights[weights > 0]  # boolean indexing: a shape that depends on device values
        torch.tensor([1.0], device=weights.device)  # host data sent to the device
        host.to(weights.device)
        weights.float().cpu().tolist()  # the .cpu() waits; its result is host data
    assert dict(syncs.by_kind) == {"item": 1, "upload": 3, "bool_index": 1, "cpu": 1}


def _print(t: torch.Tensor) -> None:
    print(t, file=io.StringIO())


# Each kind of host read a GPU pays for, done to device tensors (made outside the counter):
# (what, expected by_kind). `d` a float vector, `m` a bool mask over it, `w` a matrix, `h` a host vector.
KINDS: dict[str, tuple[Callable, dict[str, int]]] = {
    "item": (lambda d, m, w, h: d[0].item(), {"item": 1}),
    "bool(t)": (lambda d, m, w, h: bool(d[0] > 0), {"__bool__": 1}),
    "cpu()": (lambda d, m, w, h: d.cpu(), {"cpu": 1}),
    "to('cpu')": (lambda d, m, w, h: d.to("cpu"), {"to_host": 1}),
    "to(device='cpu')": (lambda d, m, w, h: d.to(device="cpu"), {"to_host": 1}),
    "to('cpu', dtype)": (lambda d, m, w, h: d.to("cpu", torch.float64), {"to_host": 1}),
    "to(host tensor)": (lambda d, m, w, h: d.to(h), {"to_host": 1}),
    "host.copy_(t)": (lambda d, m, w, h: h.copy_(d), {"to_host": 1}),
    "host[i] = t": (lambda d, m, w, h: h.__setitem__(0, d[0]), {"to_host": 1}),
    "numpy()": (lambda d, m, w, h: d.numpy(), {"numpy": 1}),
    "np.asarray": (lambda d, m, w, h: np.asarray(d), {"__array__": 1}),
    "str": (lambda d, m, w, h: str(d), {"__repr__": 1}),
    "repr": (lambda d, m, w, h: repr(d), {"__repr__": 1}),
    "print": (lambda d, m, w, h: _print(d), {"__repr__": 1}),
    "f-string": (lambda d, m, w, h: f"{d[0]:.3f}", {"__format__": 1}),
    "x in t": (lambda d, m, w, h: 0.5 in d, {"__contains__": 1}),
    "torch.equal": (lambda d, m, w, h: torch.equal(d, d), {"equal": 1}),
    "allclose": (lambda d, m, w, h: torch.allclose(d, d), {"allclose": 1}),
    "isclose().all() read": (lambda d, m, w, h: bool(torch.isclose(d, d).all()), {"__bool__": 1}),
    "nonzero": (lambda d, m, w, h: m.nonzero(), {"nonzero": 1}),
    "where(c)": (lambda d, m, w, h: torch.where(m), {"where": 1}),
    "argwhere": (lambda d, m, w, h: torch.argwhere(m), {"argwhere": 1}),
    "t[mask]": (lambda d, m, w, h: d[m], {"bool_index": 1}),
    "t[mask] = values": (lambda d, m, w, h: d.clone().__setitem__(m, d.flip(0)[m]),
                         {"bool_index": 1, "bool_assign": 1}),
    "t[mask] = device scalar": (lambda d, m, w, h: d.clone().__setitem__(m, d[0]), {"bool_assign": 1}),
    "index_put_(mask)": (lambda d, m, w, h: d.clone().index_put_((m,), d[:1]), {"bool_assign": 1}),
    "bincount": (lambda d, m, w, h: torch.bincount(m.long()), {"bincount": 1}),
    "repeat_interleave(tensor)": (lambda d, m, w, h: d.repeat_interleave(m.long()), {"repeat_interleave": 1}),
    "tensor(data, device=)": (lambda d, m, w, h: torch.tensor([1, 2], device=d.device), {"upload": 1}),
    "new_tensor": (lambda d, m, w, h: d.new_tensor([1.0, 2.0]), {"upload": 1}),
    "host.to(device)": (lambda d, m, w, h: h.to(d.device), {"upload": 1}),
    "host next to device": (lambda d, m, w, h: d + h, {"upload": 1}),
    "t[list]": (lambda d, m, w, h: d[[1, 2]], {"list_index": 1}),
    "t[list, list]": (lambda d, m, w, h: w[[0, 1], [2, 3]], {"list_index": 2}),
    "t[list] = x": (lambda d, m, w, h: d.clone().__setitem__([1, 2], 0.0), {"list_index": 1}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_counter_counts_each_kind_of_host_read(kind):
    action, expected = KINDS[kind]
    torch.manual_seed(0)
    d, w = torch.randn(4), torch.randn(4, 4)
    m = d > 0
    with SyncCounter() as syncs:
        h = torch.zeros(4)  # host memory
        action(d, m, w, h)
    assert dict(syncs.by_kind) == expected


def test_counter_leaves_free_what_a_gpu_does_not_wait_for():
    torch.manual_seed(0)
    d, other = torch.randn(4), torch.randn(2)
    m = d > 0
    name = "cpu"  # a device name held in a variable, as a run holds its own device
    with SyncCounter() as syncs:
        d.to(d.device), d.to(other), d.to(torch.float64), d.to(device=torch.device(name)), d.to(torch.device("cpu"))
        torch.where(m, d, 0.0), d.masked_fill(m, 0.0), d.masked_scatter(m, other.repeat(2)), d.repeat_interleave(2)
        d.clone()[m] = 0.0  # a number into a mask: torch runs masked_fill_ on the device
        d.new_zeros(3), torch.zeros(2, device=d.device), torch.arange(3, device=d.device)
        d[1:3], d[0], d[None], len(d)
        host = torch.arange(4)  # host data: free to make, read, print and move about the host
        repr(host), host.tolist(), host.to("cpu").sum().item(), torch.zeros(2, device="cpu").tolist()
    assert syncs.total == 0, syncs.by_kind
    with SyncCounter() as syncs:
        moved = d.to("cpu")  # the read is the move: what it made is host data
        moved.tolist(), repr(moved), float(moved.sum())
        _print(d.cpu())
        d.sum().item()  # on a CPU `d.to("cpu")` is `d` itself: still a device tensor for the counter
    assert dict(syncs.by_kind) == {"to_host": 1, "cpu": 1, "item": 1}


def test_a_move_off_another_device_to_the_cpu_is_a_read_however_spelled():
    """On a GPU run the CPU is only the host: `.to(torch.device("cpu"))` of a device tensor is a read.
    A meta tensor stands for a tensor on a GPU here (it has no data, so the copy itself fails)."""
    gpu = torch.empty(4, device="meta")
    with SyncCounter() as syncs:
        for where in (torch.device("cpu"), "cpu"):
            with pytest.raises(NotImplementedError):
                gpu.to(where)
        gpu.to(torch.device("meta"))  # to its own device: free
    assert dict(syncs.by_kind) == {"to_host": 2}
    # Told the run's devices, the counter also knows where host tensors and new data go.
    with SyncCounter(devices=["meta"]) as syncs:
        host = torch.arange(3)
        host.to(torch.device("cpu")).tolist(), torch.tensor([1, 2], device=torch.device("cpu")).tolist()
        assert syncs.total == 0
        host.to(torch.device("meta")), torch.tensor([1, 2], device=torch.device("meta"))
    assert dict(syncs.by_kind) == {"upload": 2}


# --- the budget of a cycle on every path -----------------------------------------------------------

CHEAP_VERIFY = CycleCosts(decode=1.0, draft_level=0.05, verify_nodes=(1, 61), verify_seconds=(1.0, 1.2))
DEAR_VERIFY = CycleCosts(decode=1.0, draft_level=0.2, verify_nodes=(1, 21), verify_seconds=(1.0, 5.0))
TREE = dict(total_tokens=20, depth=4, branching=5)


@dataclass(frozen=True)
class Path:
    """A way through the decoding loop: the generator's settings and the target's preparation.

    budget: this path's own figure per cycle (at most `BUDGET`). adaptive: the policy's cost model,
    fixed so that the test does not depend on this machine's timings (None: no adaptive tree).
    split: the target's layers spread by a placement map (`split_placement`). dtype: the models'.
    expect: what the path must have done, checked on the output (so that it is the path under test).
    """

    name: str
    settings: dict = field(default_factory=dict)
    budget: int = 2
    adaptive: CycleCosts | None = None
    probe_every: int = 16
    oracle: bool = False
    split: bool = False
    dtype: torch.dtype = torch.float32
    temperatures: tuple[float, ...] = (0.0, 1.0)
    expect: Callable[[GenerationOutput], bool] = lambda out: True


# A fixed tree: one read of the verdict, one upload of its path and next token. The adaptive tree adds
# one read of its growth decisions per tree. Exact attention (bf16) builds its plan on the device.
# When sampling, "plain" drafts sampled children (a fixed shape laid out on the device before the loop).
PATHS = [
    Path("plain"),
    Path("top-k drafting", {"drafting": "topk"}, temperatures=(1.0,)),
    Path("sampled drafting, bf16 exact attention", {"exact_attention": True, "drafting": "sample"},
         dtype=torch.bfloat16, temperatures=(1.0,)),
    Path("exact attention, bf16", {"exact_attention": True}, dtype=torch.bfloat16),
    Path("static", {"static": True}),
    Path("adaptive", budget=3, adaptive=CHEAP_VERIFY, oracle=True, expect=lambda out: out.draft_depths.count(4) >= 5),
    Path("adaptive, doubting draft", budget=3, adaptive=CHEAP_VERIFY,  # every tree cut by the draft's confidence
         expect=lambda out: 0 < max(out.draft_depths) < 4),
    Path("adaptive, plain steps", budget=3, adaptive=DEAR_VERIFY, probe_every=2,
         expect=lambda out: 0 in out.draft_depths and max(out.draft_depths) >= 1),
    Path("several devices", split=True),
    Path("compiled", {"static": True, "compile": "default"}, temperatures=(0.0,)),  # compiling takes seconds
]
assert all(path.budget <= BUDGET for path in PATHS)


def split_placement(model):
    """The placement `device_map="auto"` gives a model spread over devices, every part on the CPU: the
    layers split into two groups in `hf_device_map`, and accelerate's hooks on each block moving its
    inputs to the block's device, as `dispatch_model` sets them up for several GPUs. The devices are
    `torch.device` objects (the counter takes the string "cpu" for the host; see `mars.diagnostics.syncs`)."""
    n = model.config.num_hidden_layers
    parts = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(n)), "model.norm", "model.rotary_emb",
             "lm_head"]
    model.hf_device_map = dict.fromkeys(parts, "cpu")
    cpu = torch.device("cpu")
    skip = getattr(model, "_skip_keys_device_placement", None)
    attach_align_device_hook_on_blocks(model, execution_device={"": cpu, **dict.fromkeys(parts, cpu)},
                                       offload={"": False, **dict.fromkeys(parts, False)},
                                       skip_keys=[skip] if isinstance(skip, str) else list(skip or []))
    return model


def syncs_by_cycle(gen: SpeculativeGenerator, prompt: torch.Tensor, monkeypatch, max_new_tokens: int = 64,
                   **kwargs) -> tuple[list[int], dict[str, int], GenerationOutput]:
    """`count_by_cycle` of one `generate` call (seeded when sampling)."""
    rng = torch.Generator().manual_seed(0) if kwargs.get("temperature") else None
    per_cycle, kinds, out = count_by_cycle(
        lambda: gen.generate(prompt, max_new_tokens=max_new_tokens, generator=rng, **kwargs), monkeypatch)
    assert len(per_cycle) == out.num_cycles >= 8
    return per_cycle, kinds, out


def path_generator(path: Path, model, prompt: torch.Tensor) -> SpeculativeGenerator:
    if path.split:
        split_placement(model)
    model.to(path.dtype)
    if path.oracle:
        head = OracleHead(model.config, prompt[0].tolist() + hf_greedy(model, prompt, 80))
    else:
        head = Eagle3Head.for_target(model.config)
    tree, settings = split_tree({**TREE, "adaptive": path.adaptive is not None, **path.settings})
    gen = SpeculativeGenerator(model, head.to(path.dtype), tree, **settings)
    if path.adaptive is not None:
        gen.policy = AdaptiveTree(path.adaptive, TREE["depth"], TREE["branching"], TREE["total_tokens"],
                                  probe_every=path.probe_every)
    return gen


@pytest.mark.parametrize("path,temperature", [(p, t) for p in PATHS for t in p.temperatures],
                         ids=[f"{p.name} T={t}" for p in PATHS for t in p.temperatures])
def test_every_path_keeps_the_budget_in_every_cycle(path, temperature, monkeypatch):
    model = tiny_model("llama")
    torch.manual_seed(1)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    with path_generator(path, model, prompt) as gen:
        per_cycle, kinds, out = syncs_by_cycle(gen, prompt, monkeypatch, rule="mars", temperature=temperature)
    print(f"{path.name} T={temperature}: at most {max(per_cycle)}, {sum(per_cycle) / len(per_cycle):.2f} syncs per "
          f"cycle on average over {len(per_cycle)} cycles {kinds}")
    assert max(per_cycle) <= path.budget, (per_cycle, kinds)
    assert set(kinds) <= {"tolist", "upload", "item"}, kinds  # `item`: the prefill's first token only
    assert path.expect(out), out.draft_depths


def test_a_split_placement_decodes_as_on_one_device():
    """What the several-devices path runs through: the hooks are on every block, the route reads the
    map, and greedy speculation still equals plain decoding."""
    model = tiny_model("llama")
    prompt = random_prompt(random.Random(3), model.config.vocab_size, 9)
    plain = hf_greedy(model, prompt, 24)
    split_placement(model)
    assert all(hasattr(layer, "_hf_hook") for layer in model.model.layers) and len(model.hf_device_map) > 2
    with SpeculativeGenerator(model, Eagle3Head.for_target(model.config), TreeShape(**TREE)) as gen:
        assert gen.generate(prompt, max_new_tokens=24).tokens == plain


# Every built-in rule in each of its forms on the plain path, with a random head; strict and MARS with an
# oracle head too.
BUILT_IN = [name for name, cls in RULES.items() if cls.__module__.startswith("mars.rules.")]
CASES = [(name, t, False) for name in BUILT_IN for t in (0.0, 1.0) if t or RULES[name].greedy_form] + [
    (name, t, True) for name in ("strict", "mars") for t in (0.0, 1.0)]


@pytest.mark.parametrize("rule,temperature,oracle", CASES)
def test_a_cycle_synchronises_at_most_twice(rule, temperature, oracle, monkeypatch):
    path = Path("plain", oracle=oracle)
    model = tiny_model("llama")
    torch.manual_seed(1)
    prompt = random_prompt(random.Random(0), model.config.vocab_size, 12)
    with path_generator(path, model, prompt) as gen:
        per_cycle, kinds, _ = syncs_by_cycle(gen, prompt, monkeypatch, rule=rule, temperature=temperature)
    assert max(per_cycle) <= path.budget, (per_cycle, kinds)
    assert set(kinds) <= {"tolist", "upload", "item"}, kinds


# --- the adaptive tree's growth decisions -----------------------------------------------------------

def test_deferred_growth_decisions_keep_the_tree_of_per_level_ones_in_one_read():
    """`grow_tree` with decisions on the device drafts every level, reads the decisions once and keeps
    the levels before the first refusal: the same tree as stopping at the refusal (one read per
    level), and as drafting only those levels."""
    model = tiny_model("llama")
    torch.manual_seed(2)
    head = Eagle3Head.for_target(model.config)
    features = torch.randn(5, head.config.feature_size)
    hidden, logprobs = head.extend(features, torch.tensor([3, 1, 4, 1, 5]))
    root = torch.tensor([9])  # made outside the counter: on the "device"
    every = 3 + 4 * 3 * 3  # every candidate of 5 levels of 3 is kept: the trees show what was drafted
    masses: list[float] = []
    grow_tree(head, root, hidden, logprobs, 5, 3, every,
              lambda level, scores: masses.append(float(scores.exp().sum())) or True)
    assert masses == sorted(masses, reverse=True)  # a level's best nodes never outweigh the level above's
    threshold = (masses[1] + masses[2]) / 2  # levels 2 and 3 pay, level 4 does not

    def decided(keep_growing):
        with SyncCounter() as syncs:
            tree = grow_tree(head, root, hidden, logprobs, 5, 3, every, keep_growing)
        return tree, dict(syncs.by_kind)

    on_host, host_reads = decided(lambda level, scores: bool(scores.exp().sum() >= threshold))
    deferred, deferred_reads = decided(lambda level, scores: scores.exp().sum() >= threshold)
    assert host_reads == {"__bool__": 3} and deferred_reads == {"tolist": 1}
    shallow = grow_tree(head, root, hidden, logprobs, 3, 3, every)
    assert shallow.size == 1 + 3 + 2 * 3 * 3
    for tree in (on_host, deferred):
        assert tree.levels == 3
        for name in ("tokens", "parents", "depths", "scores", "ancestors"):
            assert torch.equal(getattr(tree, name), getattr(shallow, name)), name


def test_the_policys_device_state_follows_its_host_state_unread():
    """Fed device predictions, the policy keeps its confidence calibration on the device (no read) and
    takes the growth decisions its host arithmetic takes."""
    on_host, on_device = (AdaptiveTree(CHEAP_VERIFY, depth=6, branching=10, total_tokens=60) for _ in range(2))
    cycles = [(3, 2, 1.5), (6, 0, 2.0), (1, 1, 0.0), (4, 4, 0.7), (2, 0, 3.5), (6, 6, 1.2)]
    predicted = [torch.tensor(p) for _, _, p in cycles]  # made outside the counter: on the "device"
    scores = [torch.tensor([0.5, 0.3]).log(), torch.tensor([0.02, 0.01]).log(), torch.tensor([0.1]).log()]
    with SyncCounter() as syncs:
        for (depth, accepted, p), p_device in zip(cycles, predicted, strict=True):
            on_host.observe(depth, accepted, p)
            on_device.observe(depth, accepted, p_device)
        decisions = [on_device.grow_level(2, s, depth=6) for s in scores]
    assert syncs.total == 0, syncs.by_kind
    assert isinstance(on_device.confidence_scale, torch.Tensor) and on_device.survival == on_host.survival
    # float32 on the device, float64 on the host: the scale is a sum of len(cycles) + 1 positive terms
    # (the ratios, each scaled by the memory once per later cycle, and the start), each rounded once per
    # operation: a division, a clamp, a weighting per cycle since.
    rel = summation_tolerance(len(cycles) + 1, 1.0, term_error=len(cycles) + 3)
    assert float(on_device.confidence_scale) == pytest.approx(on_host.confidence_scale, rel=rel)
    on_host_decisions = [bool(on_host.grow_level(2, s, depth=6)) for s in scores]
    assert [bool(d) for d in decisions] == on_host_decisions == [True, False, True]
