"""How to decode fastest on this machine and model, found by timing, cached per machine and model.

Two questions decide a run's speed, and the answers differ by machine more than any rule of thumb
can say:
- the kernels: precision (bf16 / float32), exact attention, prepacked linears and oneDNN on or off. On an
  AVX-512 BF16 CPU, bf16 verification is 1.3x slower than float32 with torch's own kernels and the fastest
  of all on prepacked weights; without bf16 instructions a 21-token bf16 forward costs ~6 decodes
  against ~1.7 in float32 (`../shared/notes/cpu-performance.md`). The fastest one-row products can be
  another kernel's: there, plain bf16 decoding of SmolLM2 ran 1.3x faster with torch's own products
  (oneDNN off) than packed, whose few-row products win a tree's forward; so plain decoding (our vanilla,
  and a method whose speculation is off) runs at the fastest plain kernels of the tree's precision
  (`plain_kernels_of`), while the tree keeps its own.
- the draft tree: a 21-node verification costs ~1.3 decodes with bf16 matrix instructions, ~1.7 in
  float32 without them, about one on a GPU; sampled decoding accepts less than greedy.

`calibrate` answers both at once, on a few calibration prompts (never one the run answers): every pair of
kernels and tree is a candidate, since which precision wins depends on how many rows a verification
multiplies (with AMX, 64 bf16 rows cost 1.8 single rows, 64 float32 rows 11). Kernels whose strict
greedy output differs from their own plain greedy decoding on the first prompts are not timed (the
correctness every strict run promises). The rest are timed by successive halving within a budget
(default 2 minutes): round by round on twice as many prompts (the first, every candidate on one
prompt, at half the tokens), interleaved with the plain configurations,
candidates that lose clearly are dropped and the time left goes to the close ones (`Halving`): the faster
half, and any tied with the fastest, on more prompts. The winner's prediction rests on prompts of its own:
the last PREDICTION_UNITS (at most half of them), which the search never times (the prompts that chose a
winner flatter it), timed past the budget where need be: the budget bounds the search, and a prediction from
one or two prompts is noise.
Candidates of one precision share one loaded model; every precision's models are held at once where
they fit in memory, one precision at a time otherwise. The record keeps every figure and which
candidates were dropped when, and is cached under `cache_dir` by a key of the machine, the models,
the candidates and the decoding (greedy or sampled, and the rule: each method can have its tree), so a
machine calibrates once (not by the budget, which only bounds how long).

Every candidate is judged against the fastest plain decoding timed beside it, the `reference` of the
record: our vanilla at every kernel candidate (whether or not its tree verification reproduces plain
decoding: plain decoding at those kernels is plain decoding), transformers' `model.generate` in every
precision loaded, and the caller's `references` (`model.generate` under the AVX2 limits in a worker
process, `mars.decoding.reference`), the configurations a run's `speedup_vs_fastest` divides by.
`speedup_over_reference` is the best candidate's speed over it; `speedup_over_plain`, over our vanilla at
the same kernels, is kept for continuity. Where the best tree is slower than the reference
(`speculation_of`), the run's default settings do not speculate for that method: it decodes plainly, with
our vanilla at the fastest kernels for plain decoding (`decoding_kernels`), and the run says so.

The tree and the kernels change only how fast verification runs: strict verification stays exact
(greedy) and lossless (sampling) with any of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch

from eagle.files import write_atomic
from eagle.kernels import packed_copy_fits, packs
from eagle.precision import cpu_name, needs_exact_attention, resolve_dtype
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.reference import hf_generate_batch, rows_of
from mars.decoding.settings import Kernels, Speculation, TreeShape
from mars.verification.sampling import SamplingConfig

Load = Callable[[str], tuple[torch.nn.Module, torch.nn.Module]]  # dtype name -> (target, draft head) in it
# How a plain configuration is timed: (a unit of prompts, the sampling, new tokens, seed) -> (tokens, seconds).
Timer = Callable[[list[torch.Tensor], SamplingConfig, int, int], tuple[int, float]]


class Reference(Protocol):
    """A plain configuration the caller has the calibration time beside ours (e.g. `model.generate` in a
    worker process under the AVX2 limits, `mars.decoding.reference.LimitedGenerate`): `label` names it in the
    record (and in the cache key), `time` is its `Timer`."""

    label: str

    def time(self, unit: list[torch.Tensor], sampling: SamplingConfig, max_new_tokens: int,
             seed: int) -> tuple[int, float]: ...


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
    oneDNN packs that precision here (`eagle.kernels.packs`) and a packed copy of the target's
    `parameters` weights fits in memory (`eagle.kernels.packed_copy_fits`), unless set; and in bf16 /
    fp16, torch's own products with oneDNN off ("aten"), unless prepacking was asked for. Other devices:
    one candidate, the precision of `eagle.precision.resolve_dtype` and no prepacking (nothing on a GPU is timed:
    float32 is never the faster there, and `eagle.kernels` packs CPU weights only).
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
        if on_cpu and name != "float32" and prepack is not True and torch.backends.mkldnn.is_available():
            # torch's own half-precision products, oneDNN off: a plain decoding candidate above all (one row
            # streams faster than packed on the AVX-512 EPYC); without exact attention, unless it was set,
            # which a lone row does not need. Its trees are timed only if they reproduce its plain decoding.
            found.append(Kernels(name, exact if exact_attention is not None else False, False, onednn=False))
    return found


def fingerprint(target: torch.nn.Module, head: torch.nn.Module) -> dict:
    """What the fastest settings depend on besides the candidates: the machine, torch and the models. The
    models by their configurations and weights (`weights_digest`), never by the path they were loaded from: one
    model reached by two paths (a cache directory linked elsewhere, a converted GGUF under another
    MARS_CACHE_DIR) is one record, a retrained layer under the same path another."""
    device = next(target.parameters()).device
    return {
        "cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "torch": torch.__version__,
        "target_config": json.dumps(without_paths(target.config.to_dict()), sort_keys=True, default=str),
        "draft_config": head.config.to_json(),
        "weights": [weights_digest(target), weights_digest(head)],
    }


def without_paths(config: dict) -> dict:
    """A configuration's dict without the path it was loaded from (`_name_or_path`), at any depth: a composite
    model's sub-configurations (a multimodal model's `text_config`) carry their own."""
    return {k: without_paths(v) if isinstance(v, dict) else v for k, v in config.items() if k != "_name_or_path"}


def weights_digest(model: torch.nn.Module, samples: int = 4096) -> str:
    """Every parameter's name, shape and the sum of at most `samples` evenly spaced entries, hashed: a
    checksum that any retrained or replaced tensor moves, cheap at any size (one small strided read per tensor,
    where a full sum would read every weight of a 235B model). Meta parameters (offloaded) count by name and shape."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}".encode())
            if not p.is_meta and p.numel():
                flat = p.detach().reshape(-1)
                total = float(flat[:: max(1, flat.numel() // samples)].float().sum())
                digest.update(f"{total:.6g}".encode())
    return digest.hexdigest()[:16]


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
                                                           prepack=k.prepack, onednn=k.onednn)) for k in kernels}


# The units calibration times at most: the search's and the prediction's (PREDICTION_UNITS). At batch B it
# takes the first UNITS * B prompts, so a batched run's prediction rests on as many batches as B = 1's on
# prompts (at B = 4 from 3 batches, +-11%, it could not tell 4/4/1's 1.13x from plain decoding); the
# repository's calibration file holds UNITS * 4 prompts, so a larger batch gets fewer (B = 16: 6, 3 held out).
UNITS = 24


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


Unit = tuple[int, int]  # a timed unit of prompts: (the halving's group, the unit's index in it)


@dataclass
class Timed:
    """What a configuration decoded while timed, and when it was dropped (None: still in)."""

    tokens: int = field(default=0, kw_only=True)
    seconds: float = field(default=0.0, kw_only=True)
    units: int = field(default=0, kw_only=True)  # prompts (or batches of prompts) timed
    dropped: dict | None = field(default=None, kw_only=True)
    per_unit: dict[Unit, tuple[int, float]] = field(default_factory=dict, kw_only=True)  # -> (tokens, seconds)

    @property
    def speed(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add(self, tokens: int, seconds: float, unit: Unit | None = None) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.units += 1
        if unit is not None and seconds > 0:
            self.per_unit[unit] = (tokens, seconds)

    def on(self, units: Sequence[Unit]) -> Timed | None:
        """What was timed on `units` alone (None unless all of them were timed)."""
        if not units or any(u not in self.per_unit for u in units):
            return None
        return Timed(tokens=sum(self.per_unit[u][0] for u in units), seconds=sum(self.per_unit[u][1] for u in units),
                     units=len(units), per_unit={u: self.per_unit[u] for u in units})


def paired_spread(arm: Timed, plain: Timed) -> dict | None:
    """How much `arm`'s speedup over `plain` varies from prompt to prompt: the standard error of the mean
    log ratio over the units both decoded (the same prompt at the same length), {"log_se", "prompts"}; None
    on fewer than two. Speculation's gain follows each prompt's acceptance, plain decoding's speed hardly."""
    def rate(t: Timed, u: Unit) -> float:
        return t.per_unit[u][0] / t.per_unit[u][1]
    logs = [math.log(rate(arm, u) / rate(plain, u)) for u in arm.per_unit.keys() & plain.per_unit.keys()]
    if len(logs) < 2:
        return None
    mean = sum(logs) / len(logs)
    variance = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)
    return {"log_se": round(math.sqrt(variance / len(logs)), 4), "prompts": len(logs)}


@dataclass
class Arm(Timed):
    """One candidate being timed: strict speculation at `tree` with `kernels`."""

    kernels: Kernels
    tree: TreeShape
    tied: dict | None = None  # as a halving's winner: the arms tied with it for fastest, where more than one
    # as a halving's winner: the units its prediction rests on, the prompts the search never timed (`Halving.confirm`)
    predicted_on: list[Unit] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.kernels.label} {self.tree.label}"

    @property
    def predicted(self) -> Timed:
        """What was timed on the prompts its prediction rests on (all it was timed on, before it was chosen)."""
        return self.on(self.predicted_on) or self


@dataclass
class PlainArm(Timed):
    """One plain configuration being timed: our vanilla at `kernels` ("vanilla <kernels>"), or `model.generate`
    (`kernels` None: "generate@<dtype>" in this process, or a caller's `Reference`), timed by `time`."""

    label: str
    time: Timer
    kernels: Kernels | None = None
    warm: bool = False  # run once untimed (a first call pays one-time costs: a worker's first kernels, allocations)

    def warm_up(self, unit: list[torch.Tensor], sampling: SamplingConfig) -> None:
        """One short untimed call, as the candidates get theirs (`check_kernels`), once per configuration."""
        if not self.warm:
            self.time(unit, sampling, 8, 0)
            self.warm = True


def vanilla_arm(kernels: Kernels, gen: SpeculativeGenerator) -> PlainArm:
    """Our plain decoding at `kernels` (`decode`), seeded as the candidates are."""
    def time_it(unit: list[torch.Tensor], sampling: SamplingConfig, tokens: int, seed: int) -> tuple[int, float]:
        rng = None if sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)
        out, took = decode(gen, True, unit, sampling, tokens, rng)
        return sum(map(len, out)), took
    return PlainArm(f"vanilla {kernels.label}", time_it, kernels)


def generate_arm(model: torch.nn.Module, dtype: str, attention: str) -> PlainArm:
    """transformers' `model.generate` on `model` (in `dtype`), with the model's own attention implementation
    `attention` while it decodes: the generators on it switch it for tree attention, which plain decoding
    with `generate` is not (untimed switches, `mars.adapter.model.TargetModel`)."""
    def time_it(unit: list[torch.Tensor], sampling: SamplingConfig, tokens: int, seed: int) -> tuple[int, float]:
        current = model.config._attn_implementation
        model.set_attn_implementation(attention)
        try:
            outs = hf_generate_batch(model, rows_of(unit), sampling, tokens, [], seed)
        finally:
            model.set_attn_implementation(current)
        return sum(len(o.tokens) for o in outs), max(o.seconds for o in outs)
    return PlainArm(f"generate@{dtype}", time_it)


def retired(*args) -> tuple[int, float]:
    """The timer of a plain configuration whose precision's group is done (its model let go)."""
    raise RuntimeError("this plain configuration's model was let go: its precision's timing is over")


# Successive halving: after each round, the candidates slower than the best by more than
# SLACK / sqrt(prompts timed) are dropped, and at most half of them (rounded up) go on; each round
# times twice as many prompts as the one before. One prompt of 64 tokens times a candidate to a
# few percent on an idle machine; a candidate 20% slower after one prompt, 10% after four, loses clearly.
SLACK = 0.2
TIE = 0.5  # arms left within TIE * SLACK / sqrt(prompts timed) of the fastest are a tie (`Halving.chosen`)


DEFAULT_BUDGET = 120.0  # seconds for a run's calibrations on 2 cores (loading the models included) ...
BUDGET_TOKENS = 64  # ... at turns of up to this many tokens; longer turns get more (`budget_for`)
# The winner's prediction rests on this many prompts of its own (the last ones, at most half of them, never
# timed by the search), timed past the budget if need be. Speculation's gain varies from prompt to prompt (the log
# of strict's speedup over plain decoding had a standard deviation of 0.23 over the embedded pair's 64 held-out
# prompts), so a prediction from 2 prompts is +/- 16%: on an AVX2-only EPYC strict's joint search spent its budget
# after 2 prompts, predicted 1.81x and ran at 1.50x (2026-11-28). Eight make it +/- 8%.
PREDICTION_UNITS = 8


def budget_for(max_new_tokens: int) -> float:
    """The default calibration budget for turns of `max_new_tokens`: DEFAULT_BUDGET, grown in step with longer
    turns. Candidates are timed at the run's length, so a fixed budget buys fewer rounds the longer the turns:
    at 128 tokens 120 s left strict's joint search (65 candidates on the embedded pair) two rounds of one prompt
    each, a verdict of +/- 24% that ran 30% below its prediction (AVX-512 EPYC, 2026-11-27)."""
    return DEFAULT_BUDGET * max(1.0, max_new_tokens / BUDGET_TOKENS)


def tie_band(units: int) -> float:
    """The relative gap within which two speeds timed on `units` prompts (or batches) are a tie."""
    return TIE * SLACK / math.sqrt(max(units, 1))


class Halving:
    """Times `arms` on units of prompts by successive halving until `deadline` (see SLACK).

    Round by round, on each unit the plain configurations (`plains`: our vanilla at each kernel candidate,
    `model.generate`) and then every arm still in decode in turn, tree by tree with the kernels interleaved
    (drift of the machine's speed falls on all alike). Plain decoding at the kernels of an arm still in is
    timed on every unit; any other plain configuration only while it may still be the fastest plain
    decoding (the reference the trees are judged against), dropped by the same slack as the arms. A round
    that would overrun the deadline is cut to the units that fit (by the round before's seconds per unit);
    none fit: the fastest so far wins. Should even the first round overrun it, the arms not timed yet are
    dropped untimed (the candidates come in the order of their prior: chains and small trees first). Besides
    the faster half, the arms tied with the fastest (`chosen`'s band) go on, on more prompts, so that a
    tie is settled by more prompts while the budget lasts; the search ends when one arm is left. The winner is
    then timed, with the plain configurations still in, on the prompts held out for its prediction (`confirm`),
    past the budget: the budget bounds the search, not the prediction. `progress` shows what is being timed."""

    def __init__(self, gens: dict[Kernels, SpeculativeGenerator], arms: list[Arm], plains: list[PlainArm],
                 units: list[list[torch.Tensor]], sampling: SamplingConfig, max_new_tokens: int, deadline: float,
                 rounds: int, log, progress: bool, group: int = 0):
        # The last units are the prediction's (`held_out`), never timed by the search, which cycles over the rest,
        # at most `rounds` times.
        self.held_out = min(PREDICTION_UNITS, len(units) // 2)
        self.search = units[: len(units) - self.held_out]
        self.gens, self.arms, self.plains, self.units, self.sampling = gens, arms, plains, units, sampling
        self.group = group  # the precisions' group this halving times (a reference is timed in several)
        self.max_new_tokens, self.deadline = max_new_tokens, deadline
        self.max_units = rounds * len(self.search)
        self.prior = {t: i for i, t in enumerate(dict.fromkeys(a.tree for a in arms))}  # the candidates' order
        self.log, self.progress, self.rounds = log, progress, []
        self.prediction_s = 0.0  # spent in `confirm`, past the deadline: not taken from later calibrations' shares

    def _next_units(self, seen: int, count: int) -> list[tuple[int, list[torch.Tensor]]]:
        """The search's `count` units after the `seen` already timed, with their indices (its prompts cycle)."""
        return [(seen + i, self.search[(seen + i) % len(self.search)]) for i in range(count)]

    def alive(self) -> list[Arm]:
        return [a for a in self.arms if a.dropped is None]

    def timed_plains(self, alive: list[Arm]) -> list[PlainArm]:
        """The plain configurations this round times: those of the arms' kernels, and those still in."""
        kernels = {a.kernels for a in alive}
        return [p for p in self.plains if p.dropped is None or p.kernels in kernels]

    def _speculate(self, arm: Arm, unit: list[torch.Tensor], seed: int, tokens: int) -> tuple[int, float]:
        gen = self.gens[arm.kernels]
        rng = None if self.sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)
        gen.use_tree(arm.tree)
        out, took = decode(gen, False, unit, self.sampling, tokens, rng)
        return sum(map(len, out)), took

    def _round(self, r: int, units: list[tuple[int, list[torch.Tensor]]], alive: list[Arm], started: float) -> bool:
        """Time `alive` on `units`; False if the deadline came first (the arms not timed yet are dropped)."""
        from tqdm import tqdm

        kernels = list(dict.fromkeys(a.kernels for a in alive))
        plains = self.timed_plains(alive)
        total = len(units) * (len(alive) + len(plains))
        # The first round, every candidate on one prompt, only has to find the clear losers: half the tokens.
        tokens = max(8, self.max_new_tokens // 2) if r == 0 else self.max_new_tokens
        with tqdm(total=total, desc=f"calibrating: round {r + 1}, {len(alive)} candidates x {len(units)} prompts",
                  unit="run", disable=not self.progress, leave=False, dynamic_ncols=True) as bar:
            for index, unit in units:
                turn = kernels[index % len(kernels):] + kernels[:index % len(kernels)]
                order = sorted(alive, key=lambda a: (self.prior[a.tree], turn.index(a.kernels)))
                for plain in plains[index % len(plains):] + plains[:index % len(plains)]:
                    bar.set_postfix_str(plain.label)
                    plain.add(*plain.time(unit, self.sampling, tokens, index), (self.group, index))
                    bar.update(1)
                for arm in order:
                    if time.perf_counter() > self.deadline and arm.units == 0 and any(a.units for a in alive):
                        untimed = [a for a in alive if a.units == 0]
                        for a in untimed:
                            a.dropped = {"round": r + 1, "prompts": 0, "tokens_per_s": None,
                                         "reason": NOT_TIMED,
                                         "elapsed_s": round(time.perf_counter() - started, 1)}
                        self.log(f"calibration budget spent in round {r + 1}: {len(untimed)} candidates not timed")
                        return False
                    bar.set_postfix_str(arm.label)
                    arm.add(*self._speculate(arm, unit, index, tokens), (self.group, index))
                    bar.update(1)
        return True

    def _drop_plains(self, r: int, seen: int, alive: list[Arm], slack: float, elapsed: float) -> None:
        """Plain configurations that can no longer be the fastest (slower than it by more than `slack`) stop
        being timed, unless an arm still in runs at their kernels (its speedup over plain decoding needs them)."""
        kernels = {a.kernels for a in alive}
        timed = [p for p in self.plains if p.units and p.dropped is None]
        if not timed:
            return
        fastest = max(p.speed for p in timed)
        for p in timed:
            if p.kernels not in kernels and p.speed < (1 - slack) * fastest:
                p.dropped = {"round": r + 1, "prompts": seen, "tokens_per_s": round(p.speed, 2),
                             "fastest_plain_tokens_per_s": round(fastest, 2), "elapsed_s": elapsed}

    def run(self, started: float) -> Arm:
        seen, size, r = 0, 1, 0
        while True:
            alive = self.alive()
            if r:  # fit the round into what is left of the budget
                per_unit = sum(a.seconds / a.units for a in [*alive, *self.timed_plains(alive)] if a.units)
                left = self.deadline - time.perf_counter()
                size = min(size, int(left / per_unit)) if per_unit else size
                if size < 1:
                    self.log(f"calibration budget spent: {len(alive)} candidates left, the fastest so far wins")
                    break
            units = self._next_units(seen, size)
            complete = self._round(r, units, alive, started)
            seen += size
            alive = self.alive()
            best = max(alive, key=lambda a: a.speed)
            slack = SLACK / math.sqrt(seen)
            ranked = sorted(alive, key=lambda a: a.speed, reverse=True)[: math.ceil(len(alive) / 2)]
            keep = {id(a) for a in ranked if a.speed >= (1 - slack) * best.speed}
            # Arms tied with the best (`chosen`'s band) go on past the half: halving two of them settles the tie by
            # a prompt's noise (the embedded pair's MARS dropped 8/8/1 at 0.3% behind 6/6/1 after 7 timed prompts,
            # 34-52 s into a 76-132 s budget, and ran 6% slower at 6/6/1 on the 64 held-out prompts).
            keep |= {id(a) for a in alive if a.speed >= (1 - TIE * slack) * best.speed}
            elapsed = round(time.perf_counter() - started, 1)
            for arm in alive:
                if id(arm) not in keep:
                    arm.dropped = {"round": r + 1, "prompts": seen, "tokens_per_s": round(arm.speed, 2),
                                   "best_tokens_per_s": round(best.speed, 2), "elapsed_s": elapsed}
            self._drop_plains(r, seen, self.alive(), slack, elapsed)
            self.rounds.append({"round": r + 1, "prompts": size, "candidates": len(alive),
                                "kept": len(keep), "elapsed_s": elapsed})
            self.log(f"calibration round {r + 1}: {len(alive)} candidates x {size} prompts, kept {len(keep)} "
                     f"(best {best.label} {best.speed:.1f} tok/s), {elapsed:.0f} s")
            # A lone survivor has won: its prediction is timed on the held-out prompts (`confirm`), not on more of
            # the search's, and what is left of the budget goes to the calibrations after this one (`Budget`).
            if not complete or seen >= self.max_units or len(keep) == 1:
                break
            size, r = size * 2, r + 1
        winner = self.chosen(seen)
        self.confirm(winner, seen, started)
        return winner

    def confirm(self, winner: Arm, seen: int, started: float) -> None:
        """Time `winner` and the plain configurations still in on the prediction's own units (`held_out`: the last
        PREDICTION_UNITS, at most half of them), whatever the deadline: its predicted speedup, what the run reports
        beside the measured one and what decides whether the method speculates, rests on those alone. The units
        that chose it would flatter it: the fastest of many candidates on a few prompts was also the luckiest there
        (a winner's curse; SmolLM2's strict won 33 candidates' first round on one prompt, was predicted at 1.11x
        the fastest plain decoding and ran at 0.98x). Every calibration of a run (strict's, each rule's) predicts
        on the same prompts, so a rule's carried reference (`reference_of`) compares plain decoding on the same
        prompts too. On a single unit there is nothing to hold out: the prediction is the search's figure."""
        if not self.held_out:
            winner.predicted_on = list(winner.per_unit)
            return
        self.log(f"calibration: timing the winner {winner.label} on the {self.held_out} prompts kept for its "
                 f"prediction (the search timed {len(self.search)})")
        units = [(seen + j, unit) for j, unit in enumerate(self.units[len(self.search):])]
        r = len(self.rounds)  # a round after the search's (at the run's length: only the first is at half)
        began = time.perf_counter()
        self._round(r, units, [winner], started)
        self.prediction_s = time.perf_counter() - began
        self.rounds.append({"round": r + 1, "prompts": self.held_out, "candidates": 1, "kept": 1,
                            "for": "prediction", "elapsed_s": round(time.perf_counter() - started, 1)})
        winner.predicted_on = [(self.group, i) for i, _ in units]

    def chosen(self, seen: int) -> Arm:
        """The winner among the arms left after `seen` units: the fastest, unless others left are within a tie
        of it (TIE of the slack that drops a clear loser), then of those the one with the cheapest cycle
        (fewest rows verified, then fewest draft steps): the one-standard-error rule of model selection. A
        smaller tree loses less when the run's prompts accept less than calibration's (SmolLM2, MARS θ = 0.9:
        6/6/1 led 4/4/1 by 4% on three roleplay turns and ran at 0.93x the fastest plain decoding on MT-bench's
        writing, where 4/4/1 had run at 1.18x)."""
        alive = self.alive()
        best = max(alive, key=lambda a: a.speed)
        tie = tie_band(seen)
        ties = [a for a in alive if a.speed >= (1 - tie) * best.speed]
        winner = min(ties, key=lambda a: (a.tree.adaptive, a.tree.total_tokens, a.tree.depth, -a.speed))
        winner.tied = {"candidates": [a.label for a in ties], "within": round(tie, 4)} if len(ties) > 1 else None
        return winner


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

    def extend(self, record: dict) -> None:
        """Give back what a calibration spent past its share on its winner's prediction (`Halving.confirm`), so
        that the calibrations after it keep theirs."""
        if not record.get("cached"):
            self.deadline += record.get("prediction_s", 0.0)


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
              progress: bool = True, references: Sequence[Reference] = ()) -> dict:
    """The fastest kernels and tree here, chosen together (see the module docstring), and the fastest
    plain decoding they are judged against.

    load(dtype name) gives the target and its draft head in that precision. Every (kernels, tree) pair
    is a candidate: precision and tree are searched jointly (a wide bf16 tree can beat the float32
    chain on a CPU with bf16 matrix instructions). trees=None: the tree is `fixed_tree`, in each
    drafting mode `drafting` allows (`fixed_candidates`). `sampling` is the decoding the candidates are
    timed with, its rule included (a relaxed rule lengthens deep chains more than wide trees: each
    method can have its tree). Candidates are timed by successive halving (`Halving`) within `budget`
    seconds, at most `rounds` passes over the prompts each; kernels whose strict greedy output differs
    from their plain greedy output on the first prompts are not timed (unless none reproduces it).
    Interleaved with them, the plain configurations: our vanilla at every kernel candidate, transformers'
    `model.generate` in every precision loaded, and `references` (e.g. `generate` in a worker process under
    the AVX2 limits, `mars.decoding.reference.limited_references`); the fastest is the record's `reference`.

    Returns the record {"kernels", "tree", "kernel_candidates": {kernels label: {"plain", "trees":
    {tree label: tok/s when last timed}, "identical"}}, "tokens_per_s": the chosen kernels' trees and
    plain decoding, "speedup_over_plain" (the best candidate over our vanilla at its kernels),
    "plains": {label: {"tokens_per_s", "prompts", "dropped"}} (every plain configuration timed),
    "reference": {"label", "tokens_per_s"} (the fastest of them), "speedup_over_reference",
    "fastest_plain" (our fastest vanilla: {"kernels", "tokens_per_s"}), "prediction" (what the reference,
    the speedups and "spread" rest on: the prompts held out for it, `Halving.confirm`), "plain_kernels" (its kernels),
    "dropped": {candidate: when and at what speed}, "rounds", "seconds", "budget_s", "cache", "cached",
    ...}. cache_dir: default `default_cache()`. batch: the batch size the run decodes at (`generate` of a
    list): candidates are timed on batches of that many prompts (the best tree shrinks as the batch grows),
    the first UNITS * batch of `prompts`.
    exclusive: held while timing (not on a cache hit), e.g. a machine-wide lock that keeps other jobs from
    timing at once (eval.runner.locks).
    """
    shapes = candidate_shapes(kernels, trees, fixed_tree, batch, not sampling.greedy, drafting)
    prompts = prompts[: UNITS * batch]  # the prompts timed: the key and the record count these
    started = time.perf_counter()  # the budget counts loading too
    held: dict[str, tuple] = {}
    first = held.setdefault(kernels[0].dtype, load(kernels[0].dtype))
    key = {**fingerprint(*first), "kernels": [k.label for k in kernels], "sampled": not sampling.greedy,
           "rule": {"name": sampling.rule.name, **sampling.rule.params()},
           "trees": [t.label for t in shapes], "drafting": drafting, **({"batch": batch} if batch > 1 else {}),
           "max_new_tokens": max_new_tokens, "prompts": len(prompts), "prompt_ids": prompt_digest(prompts),
           "rounds": rounds, "prediction_units": PREDICTION_UNITS,
           "predicted_on": "held-out prompts",
           "references": ["generate", *(r.label for r in references)]}
    path = cache_path(key, cache_dir or default_cache())
    if path.exists():
        return {**json.loads(path.read_text()), "cache": str(path), "cached": True}
    log(f"calibrating for this machine and model: {len(kernels)} kernel candidates "
        f"({', '.join(k.label for k in kernels)}) x {len(shapes)} trees on {len(prompts)} prompts "
        f"({'greedy' if sampling.greedy else 'sampled'}, rule {sampling.rule.name}), by successive "
        f"halving within {budget:.0f} s, beside plain decoding; cached afterwards")
    timing = Timing(load, held, kernels, shapes, batches_of(prompts, batch), sampling, max_new_tokens, rounds,
                    budget, started, log, progress, references)
    with exclusive():  # no other job of ours times meanwhile
        timing.run()
    held.clear()
    result = timing.record(key, budget, len(prompts), max_new_tokens, batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(result, indent=2))
    # "timed here": a rule's own tree times plain decoding at the tree's kernels alone; the run judges it against
    # strict's record
    log(f"calibrated in {result['seconds']:.0f} s: {timing.best.label}, "
        f"{result['prediction']['tokens_per_s']:.1f} tok/s on its held-out prompts, "
        f"{result['speedup_over_plain']:.2f}x our plain decoding at its kernels, "
        f"{result['speedup_over_reference']:.2f}x the fastest plain decoding timed here "
        f"({result['reference']['label']} {result['reference']['tokens_per_s']:.1f} tok/s; "
        f"{len(result['dropped'])} candidates dropped)")
    return {**result, "cache": str(path), "cached": False}


def candidate_shapes(kernels: list[Kernels], trees: tuple[TreeShape, ...] | None, fixed_tree: TreeShape | None,
                     batch: int, sampled: bool, drafting: str) -> tuple[TreeShape, ...]:
    """The trees a calibration times (`calibrate`'s arguments checked): batched decoding drafts fixed trees."""
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
    return tuple(dict.fromkeys(trees if trees else fixed_candidates(fixed_tree, sampled, drafting)))


class Timing:
    """One calibration's timing (`calibrate`): the precisions' models loaded, the kernels checked, the
    candidates and plain configurations timed by `Halving`, and the record made of what was timed.

    Candidates of one precision share one loaded model; every precision's models are held at once where
    they fit in memory (timed interleaved), one precision at a time otherwise, each with its share of the
    budget, and the winners compared."""

    def __init__(self, load: Load, held: dict[str, tuple], kernels: list[Kernels], shapes: tuple[TreeShape, ...],
                 units: list[list[torch.Tensor]], sampling: SamplingConfig, max_new_tokens: int, rounds: int,
                 budget: float, started: float, log, progress: bool, references: Sequence[Reference]):
        self.load, self.held, self.kernels, self.shapes, self.units = load, held, kernels, shapes, units
        self.sampling, self.max_new_tokens, self.rounds = sampling, max_new_tokens, rounds
        self.budget, self.started, self.log, self.progress = budget, started, log, progress
        # The caller's plain configurations, one arm each across the precisions' groups.
        self.references = [PlainArm(r.label, r.time) for r in references]
        weights = sum(p.numel() for model in held[kernels[0].dtype] for p in model.parameters())
        self.dtypes = _dtypes(kernels)
        self.hold_all = packed_copy_fits(2 * weights * sum(getattr(torch, d).itemsize for d in self.dtypes))
        self.identical: dict[Kernels, bool] = {}
        self.winners: list[Arm] = []
        self.arms: list[Arm] = []
        self.plains: list[PlainArm] = []
        self.rounds_record: list[dict] = []
        self.prediction_s = 0.0  # the groups' `Halving.confirm`, past their deadlines: later groups keep their share

    @property
    def groups(self) -> list[list[str]]:
        return [self.dtypes] if self.hold_all else [[d] for d in self.dtypes]

    @property
    def best(self) -> Arm:
        """The fastest of the groups' winners, by their predictions (each on the prompts held out for it)."""
        return max(self.winners, key=lambda a: a.predicted.speed)

    def prediction(self, best: Arm) -> tuple[Timed, dict[str, Timed]]:
        """`best` and every plain configuration timed beside it on the prompts held out for its prediction
        (`Halving.confirm`): what its prediction is made of."""
        plains = {p.label: t for p in self.plains if (t := p.on(best.predicted_on)) is not None}
        return best.predicted, plains

    def run(self) -> None:
        for g, group in enumerate(self.groups):
            with ExitStack() as stack:
                gens, plains = {}, []
                for dtype in group:
                    if dtype not in self.held:
                        if not self.hold_all:
                            self.held.clear()
                        self.held[dtype] = self.load(dtype)
                    model = self.held[dtype][0]
                    attention = model.config._attn_implementation  # the model's own, before the generators'
                    mine = [k for k in self.kernels if k.dtype == dtype]
                    made = stack.enter_context(generators(*self.held[dtype], mine, self.shapes[0]))
                    gens.update(made)
                    plains += [vanilla_arm(k, gen) for k, gen in made.items()]
                    plains.append(generate_arm(model, dtype, attention))
                self._time_group(g, gens, plains)

    def _time_group(self, g: int, gens: dict[Kernels, SpeculativeGenerator], plains: list[PlainArm]) -> None:
        self.identical.update(check_kernels(gens, self.shapes[0], self.units[:2], 16))
        exact = {k: gen for k, gen in gens.items() if self.identical[k]} or gens
        arms = [Arm(kernels=k, tree=t) for k in exact for t in self.shapes]
        plains += self.references
        for plain in plains:
            plain.warm_up(self.units[0], self.sampling)
        # The whole budget when every precision is held; else each its share, in turn.
        groups = self.groups
        deadline = (self.started + self.prediction_s
                    + self.budget * sum(len(x) for x in groups[: g + 1]) / len(self.dtypes))
        halving = Halving(exact, arms, plains, self.units, self.sampling, self.max_new_tokens, deadline,
                          self.rounds, self.log, self.progress, group=g)
        self.winners.append(halving.run(self.started))
        self.prediction_s += halving.prediction_s
        self.arms += arms
        self.plains += [p for p in plains if all(p is not q for q in self.plains)]  # a reference once
        for p in plains:  # this group's models may be let go (one precision at a time): no arm holds them
            if all(p is not r for r in self.references):
                p.time = retired
        self.rounds_record += [{**r, "group": g} for r in halving.rounds] if len(groups) > 1 else halving.rounds

    def record(self, key: dict, budget: float, prompts: int, max_new_tokens: int, batch: int) -> dict:
        best, everything = self.best, self.arms
        vanilla = {p.kernels: p for p in self.plains if p.kernels is not None and p.units}
        ours = max(vanilla.values(), key=lambda p: p.speed)
        # The prediction: the winner over the fastest plain configuration timed beside it on the held-out prompts
        # (the fastest timed at all where none was: a record of another precision's group)
        tree, beside = self.prediction(best)
        if beside:
            name, reference = max(beside.items(), key=lambda kv: kv[1].speed)
        else:
            name, reference = max(((p.label, p) for p in self.plains if p.units), key=lambda kv: kv[1].speed)
        plain_here = beside.get(f"vanilla {best.kernels.label}") or vanilla[best.kernels]
        # the same ratio on the prompts the search chose the winner on, for comparison (a winner's curse)
        matched = next(p for p in self.plains if p.label == name)
        searched = [u for u in best.per_unit if u not in best.predicted_on and u in matched.per_unit]
        search_speedup = best.on(searched).speed / matched.on(searched).speed if searched else None
        chosen = [a for a in everything if a.kernels == best.kernels]
        return {"kernels": asdict(best.kernels), "tree": asdict(best.tree),
                # False: none did; the fastest was taken anyway
                "kernels_reproduce_plain": any(self.identical.values()),
                # every precision's models fitted in memory at once (a second copy for plain decoding does)
                "precisions_held_together": self.hold_all and len(self.dtypes) > 1,
                "kernel_candidates": {k.label: {"kernels": asdict(k),
                                                "plain": round(vanilla[k].speed, 2) if k in vanilla else None,
                                                "trees": {a.tree.label: round(a.speed, 2) for a in everything
                                                          if a.kernels == k and a.units},
                                                # None: not checked, the budget ran out before its precision
                                                "identical": self.identical.get(k)} for k in self.kernels},
                "tokens_per_s": {**{a.tree.label: round(a.speed, 2) for a in chosen if a.units},
                                 "plain": round(vanilla[best.kernels].speed, 2)},
                "speedup_over_plain": round(tree.speed / plain_here.speed, 3),
                "plains": {p.label: {"tokens_per_s": round(p.speed, 2), "prompts": p.units,
                                     **({"dropped": p.dropped} if p.dropped else {})}
                           for p in self.plains if p.units},
                "reference": {"label": name, "tokens_per_s": round(reference.speed, 2)},
                "speedup_over_reference": round(tree.speed / reference.speed, 3),
                # what that speedup rests on: the prompts held out for it, each configuration's speed on them
                "prediction": {"tree": best.label, "prompts": tree.units, "tokens_per_s": round(tree.speed, 2),
                               "plains": {label: round(t.speed, 2) for label, t in beside.items()},
                               "search_speedup": round(search_speedup, 3) if search_speedup else None},
                # prompt-to-prompt spread of that speedup (against our vanilla at the tree's kernels where the
                # reference was not timed on those units), for the verdict
                "spread": paired_spread(tree, reference) or paired_spread(tree, plain_here),
                "fastest_plain": {"kernels": ours.kernels.label, "tokens_per_s": round(ours.speed, 2)},
                "plain_kernels": asdict(ours.kernels),
                "dropped": {a.label: a.dropped for a in everything if a.dropped},
                # the candidates tied for fastest where the cheapest cycle was chosen (`Halving.chosen`)
                "tied": best.tied,
                "timed_prompts": {a.label: a.units for a in everything},
                "rounds": self.rounds_record, "seconds": round(time.perf_counter() - self.started, 1),
                "prediction_s": round(self.prediction_s, 1),
                "budget_s": budget, "prompts": prompts, "max_new_tokens": max_new_tokens, "sampled": key["sampled"],
                "rule": key["rule"], "batch": batch, "machine": key["cpu"], "capability": key["capability"]}


# --- the verdict: speculate, or decode plainly ------------------------------------------------------

def plain_speed(record: dict, kernels: str) -> float | None:
    """Our vanilla's speed at `kernels` (a label) in a calibration `record`: beside the prediction where it was
    timed there (as the reference is), else over all it was timed on."""
    beside = record.get("prediction", {}).get("plains", {}).get(f"vanilla {kernels}")
    return beside or record["kernel_candidates"].get(kernels, {}).get("plain")


def reference_of(record: dict, strict: dict | None = None) -> dict:
    """The fastest plain decoding a method's calibration `record` is judged against, {"label", "tokens_per_s"}:
    the record's own `reference`; for a rule's record, timed at the run's kernels alone, the faster of that
    and `strict`'s reference (strict's calibration times our vanilla at every kernel candidate and
    `model.generate` in every precision), carried over through our vanilla at those kernels, timed in both
    calibrations, so that the machine's drift between the two cancels."""
    own = record["reference"]
    if strict is None or strict is record:
        return own
    label = Kernels(**record["kernels"]).label
    here, there = plain_speed(record, label), plain_speed(strict, label)
    if not here or not there:
        return own
    carried = strict["reference"]["tokens_per_s"] * here / there
    if carried <= own["tokens_per_s"]:
        return own
    return {"label": strict["reference"]["label"], "tokens_per_s": round(carried, 2),
            "carried": f"strict's calibration, scaled by vanilla {label} ({here:.1f} tok/s here, {there:.1f} there)"}


def speedup_over_reference(record: dict, strict: dict | None = None) -> tuple[float, dict]:
    """(the best tree's speed in `record` over the fastest plain decoding it is judged against, that reference:
    `reference_of`): the prediction a run reports, and what its verdict and its tree's reason say."""
    reference = reference_of(record, strict)
    tree = record.get("prediction", {}).get("tokens_per_s")  # records from before the field: the search's figure
    return (tree or record["tokens_per_s"][TreeShape(**record["tree"]).label]) / reference["tokens_per_s"], reference


# Speculation is on only where the best tree's predicted speedup over the fastest plain decoding exceeds 1 by
# SURE standard errors of its prompt-to-prompt spread (`paired_spread`): a one-sided 95% test that the tree is
# faster. The run decodes other prompts, and the promise is never to be slower than plain decoding: a tree that
# only ties plain decoding in calibration ran at 0.83x on SmolLM2's Alpaca questions (1.03x in calibration, 8
# prompts), and at one standard error (the rule until 2026-11-29) SmolLM2's strict 8/4/2 chain, 1.11x +/- 10% in
# calibration, speculated and ran at 0.98x on MT-bench, where plain decoding would have run at 1.0x. The price: a
# tree truly 1.1x faster, timed +/- 10%, decodes plainly (1.0x) about half the time.
SURE = 1.645


def speculation_of(method: str, record: dict, *, forced: bool = False, strict: dict | None = None,
                   why_forced: str = "a tree set explicitly always speculates") -> Speculation:
    """Whether `method` speculates, by its calibration `record` (`calibrate`'s): on where its best tree ran
    faster than the fastest plain decoding timed (`reference_of`; `strict`: strict's record, for a rule's) by
    more than SURE standard errors of its prompt-to-prompt spread, off otherwise, when the method decodes
    plainly with our vanilla (at `decoding_kernels`). `forced`: the tree was set explicitly, which always
    speculates; the reason then says whether calibration found it slower.

    Why not the adaptive tree (`mars.decoding.adaptive`, the `20/6/5 adaptive` candidate) as the way to stop
    speculating: it sizes each cycle's tree from measured costs and can choose depth 0, a plain step, but it
    still runs the speculative loop (a verification forward of the root and its bookkeeping per token), pays
    a cost measurement at its first call (in calibration, inside its first timed call), probes at full depth
    after every 16 plain steps and then has the head catch up on every token since, and it starts from an
    optimistic prior, so it speculates before it learns not to. It is a candidate like any tree and is timed
    as one (on SmolLM2 it ran at 17.9 tok/s where plain decoding ran at ~50). Speculation off costs nothing
    per token: the method runs `vanilla`'s loop."""
    ratio, reference = speedup_over_reference(record, strict)
    tree = TreeShape(**record["tree"])
    spread = record.get("spread")  # None: fewer than two prompts paired (or a record from before the field)
    se = spread["log_se"] if spread else 0.0
    within = ""
    if spread:  # a batched record's units are batches
        batch = record.get("batch", 1)
        units = f"{spread['prompts']} batches of {batch} prompts" if batch > 1 else f"{spread['prompts']} prompts"
        within = f" (± {100 * math.expm1(se):.0f}% over {units})"
    against = (f"{ratio:.2f}x the fastest plain decoding ({reference['label']}, "
               f"{reference['tokens_per_s']:.1f} tok/s) in calibration{within}")
    if forced:
        slower = ", slower than plain decoding" if ratio < 1 else ""
        return Speculation(True, f"speculation forced for {method} ({why_forced}): "
                                 f"tree {tree.label} ran at {against}{slower}", round(ratio, 3), True, reference)
    if math.log(ratio) >= SURE * se:
        return Speculation(True, f"speculation on for {method}: the best tree ({tree.label}) ran at {against}",
                           round(ratio, 3), False, reference)
    # Plain decoding is the run's: our fastest vanilla in strict's calibration (a rule's own timed only the run's
    # tree kernels), over the reference timed beside it there.
    source = record if strict is None else strict
    plain = decoding_kernels(source, False)[1]  # the fastest vanilla, unless within a tie of the trees' kernels
    speed = plain_speed(source, plain.label)
    short = "" if ratio < 1 else ", not clearly faster"
    where = "" if source is record else " in strict's calibration"
    return Speculation(False, f"speculation off for {method}: the best tree ({tree.label}) ran at {against}{short}; "
                              f"{method} decodes plainly (vanilla {plain.label}, {speed:.1f} tok/s{where})",
                       round(speed / source["reference"]["tokens_per_s"], 3), False, reference)


def decoding_kernels(record: dict, speculate: bool) -> tuple[Kernels, Kernels]:
    """(the kernels a run's trees verify with, those of its plain decoding) by strict's calibration `record`.
    Where strict speculates, or where calibration held every precision's models at once (a second copy of the
    target fits): the best candidate's, and our fastest plain decoding (`plain_kernels_of`). Where it does not:
    our fastest plain decoding's, and for the trees (the rules' own, a forced one) the candidate of that
    precision whose tree ran fastest (a tree at torch's own products would be slow). With both held, a rule's
    tree is timed where trees run fastest even when strict's does not pay: on an AVX2-only EPYC, SmolLM2's
    plain decoding is bf16 (its weights are half the bytes) while a bf16 tree, without bf16 instructions, runs
    at 0.6-0.7x a float32 one; MARS timed at bf16 trees lost to plain decoding (0.89x) where strict's float32
    chain had tied it (1.06x, 2026-11-28)."""
    if speculate or record.get("precisions_held_together"):
        tree = Kernels(**record["kernels"])
    else:
        plain = Kernels(**record["plain_kernels"])
        timed = [(max(e["trees"].values()), Kernels(**e["kernels"])) for e in record["kernel_candidates"].values()
                 if "kernels" in e and e["trees"] and e["kernels"]["dtype"] == plain.dtype and e["identical"]
                 is not False and (e["kernels"]["exact_attention"] or not plain.exact_attention)]
        tree = max(timed, key=lambda t: t[0])[1] if timed else plain
    return tree, plain_kernels_of(record, tree)


def plain_kernels_of(record: dict, kernels: Kernels) -> Kernels:
    """The kernels of plain decoding beside a tree at `kernels` (`SpeculativeGenerator(plain_kernels=)`): our
    fastest vanilla in calibration (`plain_speed`: beside the prediction where timed there, as the reference is),
    `kernels` where none was clearly faster. Clearly: beyond the tie band of `Halving.chosen` on the prediction's
    prompts, since plain decoding at other kernels rounds otherwise and strict no longer reproduces it token for
    token (on the embedded pair `bfloat16+aten` was taken at 2.9% faster over 25 prompts and 0.5% slower on the
    prediction's 8, and decoded below float32 `generate` in the run). In another precision only where calibration
    held every precision's models at once (`precisions_held_together`: a second copy of the target fits); in the
    same precision (the same model) at exact attention only if the tree's is on."""
    tie = tie_band((record.get("prediction") or {}).get("prompts") or 1)
    best, speed = kernels, (plain_speed(record, kernels.label) or 0.0) * (1 + tie)
    for label, entry in record["kernel_candidates"].items():
        other = Kernels(**entry["kernels"]) if "kernels" in entry else None  # records before the field: none
        faster = plain_speed(record, label) or 0.0
        if other is None or faster <= speed:
            continue
        same_model = other.dtype == kernels.dtype
        if (same_model and (kernels.exact_attention or not other.exact_attention)) or (
                not same_model and record.get("precisions_held_together")):
            best, speed = other, faster
    return best
