"""How to decode fastest on this machine and model, found by timing, cached per machine and model.

Two questions decide a run's speed, and the answers differ by machine more than any rule of thumb
can say:
- the kernels: precision (bf16 / float32), exact attention and prepacked linears. On an AVX-512
  BF16 CPU, bf16 verification is 1.3x slower than float32 with torch's own kernels and the fastest
  of all on prepacked weights; without bf16 instructions a 21-token bf16 forward costs ~6 decodes
  against ~1.7 in float32 (`../shared/notes/cpu-performance.md`).
- the draft tree: a 21-node verification costs ~1.3 decodes with bf16 matrix instructions, ~1.7 in
  float32 without them, about one on a GPU; sampled decoding accepts less than greedy.

`calibrate` answers both at once, on a few calibration prompts (never the benchmark's): every pair of
kernels and tree is a candidate, since which precision wins depends on how many rows a verification
multiplies (with AMX, 64 bf16 rows cost 1.8 single rows, 64 float32 rows 11). Kernels whose strict
greedy output differs from their own plain greedy decoding on the first prompts are not timed (the
correctness every strict run promises). The rest are timed by successive halving within a budget
(default 2 minutes): round by round on twice as many prompts (the first, every candidate on one
prompt, at half the tokens), interleaved with plain decoding,
candidates that lose clearly are dropped and the time left goes to the close ones (`Halving`).
Candidates of one precision share one loaded model; every precision's models are held at once where
they fit in memory, one precision at a time otherwise. The record keeps every figure and which
candidates were dropped when, and is cached under `cache_dir` by a key of the machine, the models,
the candidates and the decoding (greedy or sampled, and the rule: each method can have its tree), so a
machine calibrates once (not by the budget, which only bounds how long).

The tree and the kernels change only how fast verification runs: strict verification stays exact
(greedy) and lossless (sampling) with any of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from eagle.precision import cpu_name, needs_exact_attention, resolve_dtype
from mars.adapter.kernels import packed_copy_fits, packs
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape
from mars.verification.sampling import SamplingConfig

Load = Callable[[str], tuple[torch.nn.Module, torch.nn.Module]]  # dtype name -> (target, draft head) in it


def default_cache() -> Path:
    """Where calibrations are kept: $MARS_CACHE_DIR/trees, default ~/.cache/mars-spec/trees."""
    # Imported here, not at the top: `import mars` would otherwise load the module that
    # `python -m mars.adapter.sources` runs as a script, which makes runpy warn.
    from mars.adapter.sources import cache_root

    return cache_root() / "trees"


# From a narrow chain-like tree to EAGLE-2's GPU default; the adaptive policy (mars.decoding.adaptive) as the
# candidate that can fall back to plain decoding steps where no fixed tree pays.
# Chains first: on a CPU a verification's cost grows with every row, and a chain of 5-7 drafts
# beats any tree there (embedded pair, bf16, AVX-512: 6/6/1 383 tok/s, 8/4/2 332, 20/4/5 258);
# wider trees pay where extra rows are nearly free (a GPU, a larger model).
CANDIDATES = tuple(TreeShape(*shape, drafting="topk") for shape in (
    (4, 4, 1), (6, 6, 1), (8, 8, 1), (8, 4, 2), (12, 4, 3), (16, 4, 4), (20, 4, 5), (24, 5, 5),
    (32, 5, 6), (32, 6, 6), (48, 6, 8), (60, 6, 10), (20, 6, 5, True)))
# At temperature > 0, sampled children (eagle.sampled_trees.sample_tree): a first draw is accepted far more
# often than any later sibling, so deep chains and narrow trees, deeper than top-k trees go.
SAMPLED_CANDIDATES = tuple(TreeShape(*shape, drafting="sample") for shape in (
    (4, 4, 1), (6, 6, 1), (8, 8, 1), (8, 6, 2), (8, 8, 2), (12, 6, 3), (12, 8, 3), (16, 8, 4), (20, 6, 5)))


def tree_candidates(sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """The trees a calibration times, in the order of their prior (the first timed first, should the
    budget run out): top-k trees when greedy; when sampling, those of `drafting` ("topk", "sample", or
    both for "auto", sampled first: a first draw is accepted far more often than a top-k sibling)."""
    if not sampled or drafting == "topk":
        return CANDIDATES
    return SAMPLED_CANDIDATES if drafting == "sample" else SAMPLED_CANDIDATES + CANDIDATES


def batchable(tree: TreeShape) -> bool:
    """Whether batched decoding can draft this tree: fixed trees (no adaptive tree, for now)."""
    return not tree.adaptive


def fixed_candidates(tree: TreeShape, sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """A configured tree's shape in the drafting modes a run may use (both, for "auto" when sampling)."""
    topk = replace(tree, drafting="topk")
    if not sampled or tree.adaptive or drafting == "topk":
        return (topk,)
    return (topk.sampled(),) if drafting == "sample" else (topk.sampled(), topk)


def kernel_candidates(device: str | torch.device, dtype: str = "auto", exact_attention: bool | None = None,
                      prepack: bool | None = None, parameters: int | None = None) -> list[Kernels]:
    """The kernel combinations to time on `device`, after the run's explicit settings (None / "auto": free).

    CPU: float32 and bf16; exact attention where the precision needs it to reproduce plain decoding
    (bf16: `eagle.precision.needs_exact_attention`) unless set; prepacked linears on and off where
    oneDNN packs that precision here (`mars.adapter.kernels.packs`) and a packed copy of the target's
    `parameters` weights fits in memory (`mars.adapter.kernels.packed_copy_fits`), unless set. Other devices:
    one candidate, the precision of `eagle.precision.resolve_dtype` and no prepacking (nothing on a GPU is timed:
    float32 is never the faster there, and `mars.adapter.kernels` packs CPU weights only).
    """
    on_cpu = torch.device(device).type == "cpu"
    if dtype != "auto":
        dtypes = [dtype]
    elif on_cpu:
        dtypes = ["float32", "bfloat16"]
    else:
        dtypes = [resolve_dtype("auto", device).name]
    found = []
    for name in dtypes:
        exact = needs_exact_attention(getattr(torch, name)) if exact_attention is None else exact_attention
        size = (parameters or 0) * getattr(torch, name).itemsize
        can_pack = on_cpu and packs(getattr(torch, name)) and packed_copy_fits(size)
        for packed in ([prepack] if prepack is not None else [True, False] if can_pack else [False]):
            found.append(Kernels(name, exact, packed))
    return found


def fingerprint(target: torch.nn.Module, head: torch.nn.Module) -> dict:
    """What the fastest settings depend on besides the candidates: the machine, torch and the models."""
    device = next(target.parameters()).device
    with torch.no_grad():  # a cheap checksum of the weights, the same in any precision they are loaded in
        weights = [float(p.float().sum()) for p in (target.get_output_embeddings().weight, *head.parameters())]
    return {
        "cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "target": getattr(target.config, "_name_or_path", ""),
        "target_config": target.config.to_json_string(use_diff=False), "draft_config": head.config.to_json(),
        "weights": [round(w, 2) for w in weights],
    }


def prompt_digest(prompts: list[torch.Tensor]) -> str:
    """The calibration prompts' token ids, hashed: a calibration on other prompts is another record."""
    digest = hashlib.sha256()
    for ids in prompts:
        digest.update(ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def cache_path(key: dict, cache_dir: Path) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return Path(cache_dir) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


@contextmanager
def generators(target, head, kernels: list[Kernels], tree: TreeShape) -> Iterator[dict[Kernels, SpeculativeGenerator]]:
    """One generator per kernel candidate on the same model (closed in reverse order, so the model
    gets its own attention implementation back)."""
    with ExitStack() as stack:
        yield {k: stack.enter_context(SpeculativeGenerator(target, head, tree, exact_attention=k.exact_attention,
                                                           prepack=k.prepack)) for k in kernels}


def batches_of(prompts: list[torch.Tensor], batch: int) -> list[list[torch.Tensor]]:
    """The prompts in groups of `batch` (1: one each); too few prompts for a whole group are cycled."""
    if batch == 1:
        return [[p] for p in prompts]
    count = max(len(prompts), batch)
    cycled = [prompts[i % len(prompts)] for i in range(count - count % batch)]
    return [cycled[i: i + batch] for i in range(0, len(cycled), batch)]


def decode(gen: SpeculativeGenerator, plain: bool, group: list[torch.Tensor], sampling: SamplingConfig,
           max_new_tokens: int, rng: torch.Generator | None) -> tuple[list[list[int]], float]:
    """Each prompt's tokens and the call's seconds: plain decoding or strict speculation of the prompts of
    `group`, decoded together (`vanilla` / `generate`)."""
    outs = (gen.vanilla if plain else gen.generate)(group, sampling, max_new_tokens=max_new_tokens, generator=rng)
    return [o.tokens for o in outs], max(o.seconds for o in outs)


@dataclass
class Arm:
    """One candidate being timed: plain decoding (`tree` None) or strict speculation at `tree`, with
    `kernels`; what it decoded so far, and when it was dropped (None: still in)."""

    kernels: Kernels
    tree: TreeShape | None
    tokens: int = 0
    seconds: float = 0.0
    units: int = 0  # prompts (or batches of prompts) timed
    dropped: dict | None = None

    @property
    def label(self) -> str:
        return f"{self.kernels.label} {self.tree.label if self.tree else 'plain'}"

    @property
    def speed(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


# Successive halving: after each round, the candidates slower than the best by more than
# SLACK / sqrt(prompts timed) are dropped, and at most half of them (rounded up) go on; each round
# times twice as many prompts as the one before. One prompt of 64 tokens times a candidate to a
# few percent on an idle machine; a candidate 20% slower after one prompt, 10% after four, loses clearly.
SLACK = 0.2
DEFAULT_BUDGET = 120.0  # seconds for the calibrations of a run on 2 cores, loading the models included


class Halving:
    """Times `arms` on units of prompts by successive halving until `deadline` (see SLACK).

    Round by round, on each unit every kernel's plain decoding and then every arm still in decode in
    turn, tree by tree with the kernels interleaved (drift of the machine's speed falls on all alike);
    plain decoding is timed on every unit. A round that would overrun the deadline is cut to the units
    that fit (by the round before's seconds per unit); none fit: the fastest so far wins. Should even
    the first round overrun it, the arms not timed yet are dropped untimed (the candidates come in the
    order of their prior: chains and small trees first). `progress` shows what is being timed."""

    def __init__(self, gens: dict[Kernels, SpeculativeGenerator], arms: list[Arm], units: list[list[torch.Tensor]],
                 sampling: SamplingConfig, max_new_tokens: int, deadline: float, max_units: int, log, progress: bool):
        self.gens, self.arms, self.units, self.sampling = gens, arms, units, sampling
        self.max_new_tokens, self.deadline, self.max_units = max_new_tokens, deadline, max_units
        self.plains = {k: Arm(k, None) for k in gens}
        self.prior = {t: i for i, t in enumerate(dict.fromkeys(a.tree for a in arms))}  # the candidates' order
        self.log, self.progress, self.rounds = log, progress, []

    def alive(self) -> list[Arm]:
        return [a for a in self.arms if a.dropped is None]

    def _decode(self, arm: Arm, unit: list[torch.Tensor], seed: int, tokens: int, bar) -> None:
        gen = self.gens[arm.kernels]
        bar.set_postfix_str(arm.label)
        rng = None if self.sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)
        if arm.tree is not None:
            gen.use_tree(arm.tree)
        out, took = decode(gen, arm.tree is None, unit, self.sampling, tokens, rng)
        arm.tokens += sum(map(len, out))
        arm.seconds += took
        arm.units += 1
        bar.update(1)

    def _round(self, r: int, units: list[tuple[int, list[torch.Tensor]]], alive: list[Arm], started: float) -> bool:
        """Time `alive` on `units`; False if the deadline came first (the arms not timed yet are dropped)."""
        from tqdm import tqdm

        kernels = list(dict.fromkeys(a.kernels for a in alive))
        total = len(units) * (len(alive) + len(kernels))
        # The first round, every candidate on one prompt, only has to find the clear losers: half the tokens.
        tokens = max(8, self.max_new_tokens // 2) if r == 0 else self.max_new_tokens
        with tqdm(total=total, desc=f"calibrating: round {r + 1}, {len(alive)} candidates x {len(units)} prompts",
                  unit="run", disable=not self.progress, leave=False, dynamic_ncols=True) as bar:
            for index, unit in units:
                turn = kernels[index % len(kernels):] + kernels[:index % len(kernels)]
                order = sorted(alive, key=lambda a: (self.prior[a.tree], turn.index(a.kernels)))
                for k in turn:
                    self._decode(self.plains[k], unit, index, tokens, bar)
                for arm in order:
                    if time.perf_counter() > self.deadline and arm.units == 0 and any(a.units for a in alive):
                        untimed = [a for a in alive if a.units == 0]
                        for a in untimed:
                            a.dropped = {"round": r + 1, "prompts": 0, "tokens_per_s": None,
                                         "reason": NOT_TIMED,
                                         "elapsed_s": round(time.perf_counter() - started, 1)}
                        self.log(f"calibration budget spent in round {r + 1}: {len(untimed)} candidates not timed")
                        return False
                    self._decode(arm, unit, index, tokens, bar)
        return True

    def run(self, started: float) -> Arm:
        seen, size, r = 0, 1, 0
        while True:
            alive = self.alive()
            if r:  # fit the round into what is left of the budget
                kernels = dict.fromkeys(a.kernels for a in alive)
                per_unit = sum(a.seconds / a.units for a in [*alive, *(self.plains[k] for k in kernels)])
                left = self.deadline - time.perf_counter()
                size = min(size, int(left / per_unit)) if per_unit else size
                if size < 1:
                    self.log(f"calibration budget spent: {len(alive)} candidates left, the fastest so far wins")
                    break
            units = [(seen + i, self.units[(seen + i) % len(self.units)]) for i in range(size)]
            complete = self._round(r, units, alive, started)
            seen += size
            alive = self.alive()
            best = max(alive, key=lambda a: a.speed)
            slack = SLACK / math.sqrt(seen)
            ranked = sorted(alive, key=lambda a: a.speed, reverse=True)[: math.ceil(len(alive) / 2)]
            keep = {id(a) for a in ranked if a.speed >= (1 - slack) * best.speed}
            elapsed = round(time.perf_counter() - started, 1)
            for arm in alive:
                if id(arm) not in keep:
                    arm.dropped = {"round": r + 1, "prompts": seen, "tokens_per_s": round(arm.speed, 2),
                                   "best_tokens_per_s": round(best.speed, 2), "elapsed_s": elapsed}
            self.rounds.append({"round": r + 1, "prompts": size, "candidates": len(alive),
                                "kept": len(keep), "elapsed_s": elapsed})
            self.log(f"calibration round {r + 1}: {len(alive)} candidates x {size} prompts, kept {len(keep)} "
                     f"(best {best.label} {best.speed:.1f} tok/s), {elapsed:.0f} s")
            if not complete or len(keep) == 1 or seen >= self.max_units:
                break
            size, r = size * 2, r + 1
        return max(self.alive(), key=lambda a: a.speed)


NOT_TIMED = "not timed within the budget"  # a dropped candidate's reason when the budget ran out before it


def untimed(record: dict) -> int:
    """How many of a calibration record's candidates the budget left untimed."""
    return sum(1 for d in record["dropped"].values() if d.get("reason") == NOT_TIMED)


class Budget:
    """A calibration budget (seconds) shared by several calibrations in turn (a run's, or `mars.tuned`'s:
    strict's, then each rule's), each its weight's share of what is left (weights: the candidates each
    times); one that ends early (cached) leaves its share to the rest."""

    def __init__(self, seconds: float, weights: list[int]):
        self.deadline, self.weights = time.perf_counter() + seconds, list(weights)

    def next(self) -> float:
        weight = self.weights.pop(0)
        left = max(0.0, self.deadline - time.perf_counter())
        return left * weight / (weight + sum(self.weights)) if weight else left


def check_kernels(gens: dict[Kernels, SpeculativeGenerator], tree: TreeShape, units: list[list[torch.Tensor]],
                  max_new_tokens: int) -> dict[Kernels, bool]:
    """Whether strict greedy output at `tree` equals plain greedy output with each kernel candidate on
    `units` (the correctness every strict run promises); untimed (it is also the warm-up)."""
    greedy = SamplingConfig()
    identical = {}
    for k, gen in gens.items():
        gen.use_tree(tree)
        identical[k] = all(decode(gen, True, unit, greedy, max_new_tokens, None)[0]
                           == decode(gen, False, unit, greedy, max_new_tokens, None)[0] for unit in units)
    return identical


def _dtypes(kernels: list[Kernels]) -> list[str]:
    """The precisions of `kernels`, in order, each once."""
    return list(dict.fromkeys(k.dtype for k in kernels))


def calibrate(load: Load, kernels: list[Kernels], prompts: list[torch.Tensor], sampling: SamplingConfig,
              trees: tuple[TreeShape, ...] | None = CANDIDATES, fixed_tree: TreeShape | None = None,
              max_new_tokens: int = 64, rounds: int = 1, cache_dir: Path | None = None, log=print,
              drafting: str = "auto", batch: int = 1,
              exclusive: Callable[[], AbstractContextManager] = nullcontext, budget: float = DEFAULT_BUDGET,
              progress: bool = True) -> dict:
    """The fastest kernels and tree here, chosen together (see the module docstring).

    load(dtype name) gives the target and its draft head in that precision. Every (kernels, tree) pair
    is a candidate: precision and tree are searched jointly (a wide bf16 tree can beat the float32
    chain on a CPU with bf16 matrix instructions). trees=None: the tree is `fixed_tree`, in each
    drafting mode `drafting` allows (`fixed_candidates`). `sampling` is the decoding the candidates are
    timed with, its rule included (a relaxed rule lengthens deep chains more than wide trees: each
    method can have its tree). Candidates are timed by successive halving (`Halving`) within `budget`
    seconds, at most `rounds` passes over the prompts each; kernels whose strict greedy output differs
    from their plain greedy output on the first prompts are not timed (unless none reproduces it).

    Returns the record {"kernels", "tree", "kernel_candidates": {kernels label: {"plain", "trees":
    {tree label: tok/s when last timed}, "identical"}}, "tokens_per_s": the chosen kernels' trees and
    plain decoding, "speedup_over_plain", "fastest_plain", "dropped": {candidate: when and at what
    speed}, "rounds", "seconds", "budget_s", "cache", "cached", ...}. cache_dir: default
    `default_cache()`. batch: the batch size the run decodes at (`generate` of a list): candidates are
    timed on batches of that many prompts (the best tree shrinks as the batch grows). exclusive: held
    while timing (not on a cache hit), e.g. a machine-wide lock that keeps other jobs from timing at
    once (eval.runner.locks).
    """
    if not kernels:
        raise ValueError("no kernel candidates to calibrate")
    if batch > 1:  # what batched decoding runs (`SpeculativeGenerator.check_batching`): no adaptive tree
        if trees:
            trees = tuple(t for t in trees if batchable(t)) or (TreeShape(6, 6, 1),)
        if fixed_tree is not None and not batchable(fixed_tree):
            raise ValueError(f"tree {fixed_tree.label} cannot decode a batch: batched decoding drafts fixed "
                             "trees (no adaptive tree)")
    if trees is None and fixed_tree is None:
        raise ValueError("give the candidate trees, or the fixed tree to time the kernels at")
    sampled = not sampling.greedy
    shapes = tuple(dict.fromkeys(trees if trees else fixed_candidates(fixed_tree, sampled, drafting)))
    started = time.perf_counter()  # the budget counts loading too
    held: dict[str, tuple] = {}
    first = held.setdefault(kernels[0].dtype, load(kernels[0].dtype))
    key = {**fingerprint(*first), "kernels": [k.label for k in kernels], "sampled": sampled,
           "rule": {"name": sampling.rule.name, **sampling.rule.params()},
           "trees": [t.label for t in shapes], "drafting": drafting, **({"batch": batch} if batch > 1 else {}),
           "max_new_tokens": max_new_tokens, "prompts": len(prompts), "prompt_ids": prompt_digest(prompts),
           "rounds": rounds}
    path = cache_path(key, cache_dir or default_cache())
    if path.exists():
        return {**json.loads(path.read_text()), "cache": str(path), "cached": True}
    weights = sum(p.numel() for model in first for p in model.parameters())
    dtypes = _dtypes(kernels)
    hold_all = packed_copy_fits(2 * weights * sum(getattr(torch, d).itemsize for d in dtypes))
    # Every precision's models at once where they fit, timed interleaved; else one precision at a time,
    # each with its share of the budget, and the winners compared.
    groups = [dtypes] if hold_all else [[d] for d in dtypes]
    units = batches_of(prompts, batch)
    log(f"calibrating for this machine and model: {len(kernels)} kernel candidates "
        f"({', '.join(k.label for k in kernels)}) x {len(shapes)} trees on {len(prompts)} prompts "
        f"({'sampled' if sampled else 'greedy'}, rule {sampling.rule.name}), by successive halving within "
        f"{budget:.0f} s; cached afterwards")
    identical: dict[Kernels, bool] = {}
    winners, plains, everything = [], {}, []
    rounds_record = []
    with exclusive():  # no other job of ours times meanwhile
        for g, group in enumerate(groups):
            with ExitStack() as stack:
                gens = {}
                for dtype in group:
                    if dtype not in held:
                        if not hold_all:
                            held.clear()
                        held[dtype] = load(dtype)
                    mine = [k for k in kernels if k.dtype == dtype]
                    made = stack.enter_context(generators(*held[dtype], mine, shapes[0]))
                    gens.update(made)
                identical.update(check_kernels(gens, shapes[0], units[:2], 16))
                exact = {k: gen for k, gen in gens.items() if identical[k]} or gens
                arms = [Arm(k, t) for k in exact for t in shapes]
                # The whole budget when every precision is held; else each its share, in turn.
                deadline = started + budget * sum(len(x) for x in groups[: g + 1]) / len(dtypes)
                halving = Halving(exact, arms, units, sampling, max_new_tokens, deadline, len(units) * rounds, log,
                                  progress)
                winners.append(halving.run(started))
                plains.update(halving.plains)
                everything += arms
                rounds_record += [{**r, "group": g} for r in halving.rounds] if len(groups) > 1 else halving.rounds
    held.clear()
    best = max(winners, key=lambda a: a.speed)
    timed_plain = {k.label: a.speed for k, a in plains.items() if a.units}
    fastest_plain = max(timed_plain, key=timed_plain.get)
    chosen = [a for a in everything if a.kernels == best.kernels]
    result = {"kernels": asdict(best.kernels), "tree": asdict(best.tree),
              "kernels_reproduce_plain": any(identical.values()),  # False: none did; the fastest was taken anyway
              "kernel_candidates": {k.label: {"plain": round(plains[k].speed, 2) if k in plains else None,
                                              "trees": {a.tree.label: round(a.speed, 2) for a in everything
                                                        if a.kernels == k and a.units},
                                              # None: not checked, the budget ran out before its precision
                                              "identical": identical.get(k)} for k in kernels},
              "tokens_per_s": {**{a.tree.label: round(a.speed, 2) for a in chosen if a.units},
                               "plain": round(plains[best.kernels].speed, 2)},
              "speedup_over_plain": round(best.speed / plains[best.kernels].speed, 3),
              "fastest_plain": {"kernels": fastest_plain, "tokens_per_s": round(timed_plain[fastest_plain], 2)},
              "dropped": {a.label: a.dropped for a in everything if a.dropped},
              "timed_prompts": {a.label: a.units for a in everything},
              "rounds": rounds_record, "seconds": round(time.perf_counter() - started, 1), "budget_s": budget,
              "prompts": len(prompts), "max_new_tokens": max_new_tokens, "sampled": sampled,
              "rule": key["rule"], "batch": batch, "machine": key["cpu"], "capability": key["capability"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    log(f"calibrated in {result['seconds']:.0f} s: {best.label}, {best.speed:.1f} tok/s, "
        f"{result['speedup_over_plain']:.2f}x plain decoding ({len(result['dropped'])} candidates dropped)")
    return {**result, "cache": str(path), "cached": False}
