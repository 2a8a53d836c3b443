"""How to decode fastest on this machine and model, found by timing, cached per machine and model.

Two questions decide a run's speed, and the answers differ by machine more than any rule of thumb
can say:
- the kernels: precision (bf16 / float32), exact attention and prepacked linears. On an AVX-512
  BF16 CPU, bf16 verification is 1.3x slower than float32 with torch's own kernels and the fastest
  of all on prepacked weights; without bf16 instructions a 21-token bf16 forward costs ~6 decodes
  against ~1.7 in float32 (`../shared/notes/cpu-performance.md`).
- the draft tree: a 21-node verification costs ~1.3 decodes with bf16 matrix instructions, ~1.7 in
  float32 without them, about one on a GPU; sampled decoding accepts less than greedy.

`calibrate` answers both on a few calibration prompts (never the benchmark's). Stage 1 times every
kernel candidate, plain decoding and strict speculation at probe trees, and keeps only candidates
whose strict greedy output equals their own plain greedy decoding on every prompt (the correctness
every strict run promises); the fastest of those wins. Stage 2 times the candidate trees with the
winning kernels, interleaved with plain decoding, and keeps the fastest. Candidates of one precision
share one loaded model; every precision's models are held at once and timed interleaved prompt by
prompt where they fit in memory, one precision at a time otherwise. The record keeps every figure, and is
cached under `cache_dir` by a key of the machine, the models, the candidates and the kind of
decoding (greedy or sampled), so a machine calibrates once.

The tree and the kernels change only how fast verification runs: strict verification stays exact
(greedy) and lossless (sampling) with any of them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch

from eagle.kernels import packed_copy_fits, packs
from eagle.precision import cpu_name, needs_exact_attention, resolve_dtype
from mars.generate import SpeculativeGenerator
from mars.sampling import SamplingConfig
from mars.settings import Kernels, TreeShape

Load = Callable[[str], tuple[torch.nn.Module, torch.nn.Module]]  # dtype name -> (target, draft head) in it


def default_cache() -> Path:
    """Where calibrations are kept: $MARS_CACHE_DIR/trees, default ~/.cache/mars-spec/trees."""
    return Path(os.environ.get("MARS_CACHE_DIR", Path.home() / ".cache" / "mars-spec")) / "trees"


# From a narrow chain-like tree to EAGLE-2's GPU default; the adaptive policy (mars.adaptive) as the
# candidate that can fall back to plain decoding steps where no fixed tree pays.
# Chains first: on a CPU a verification's cost grows with every row, and a chain of 5-7 drafts
# beats any tree there (embedded pair, bf16, AVX-512: 6/6/1 383 tok/s, 8/4/2 332, 20/4/5 258);
# wider trees pay where extra rows are nearly free (a GPU, a larger model).
CANDIDATES = (
    TreeShape(4, 4, 1), TreeShape(6, 6, 1), TreeShape(8, 8, 1), TreeShape(8, 4, 2), TreeShape(12, 4, 3),
    TreeShape(16, 4, 4), TreeShape(20, 4, 5), TreeShape(24, 5, 5),
    TreeShape(32, 5, 6), TreeShape(32, 6, 6), TreeShape(48, 6, 8), TreeShape(60, 6, 10), TreeShape(20, 6, 5, True),
)
# At temperature > 0, sampled children (eagle.tree.sample_tree): a first draw is accepted far more
# often than any later sibling, so deep chains and narrow trees, deeper than top-k trees go.
SAMPLED_CANDIDATES = tuple(TreeShape(*shape, drafting="sample") for shape in (
    (4, 4, 1), (6, 6, 1), (8, 8, 1), (8, 6, 2), (8, 8, 2), (12, 6, 3), (12, 8, 3), (16, 8, 4), (20, 6, 5)))


def tree_candidates(sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """The trees a calibration times: top-k trees when greedy; when sampling, those of `drafting`
    ("topk", "sample", or both for "auto")."""
    if not sampled or drafting == "topk":
        return CANDIDATES
    return SAMPLED_CANDIDATES if drafting == "sample" else CANDIDATES + SAMPLED_CANDIDATES


def batchable(tree: TreeShape) -> bool:
    """Whether batched decoding can draft this tree: fixed trees (no adaptive tree, for now)."""
    return not tree.adaptive


def fixed_candidates(tree: TreeShape, sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """A configured tree's shape in the drafting modes a run may use (both, for "auto" when sampling)."""
    topk = replace(tree, drafting="topk")
    if not sampled or tree.adaptive or drafting == "topk":
        return (topk,)
    return (topk.sampled(),) if drafting == "sample" else (topk, topk.sampled())


# Stage 1 times kernels at a chain and a mid-size tree: which kernels win can depend on how many rows
# a verification multiplies (a few on a chain, ~20 on a wide tree). When sampling, at the shapes
# sampled drafting uses (chains of 5-9 rows), where a precision slow on wide trees can win.
PROBES = (TreeShape(6, 6, 1), TreeShape(20, 4, 5))
SAMPLED_PROBES = (TreeShape(6, 6, 1), TreeShape(6, 6, 1, drafting="sample"), TreeShape(12, 8, 3, drafting="sample"))


def probe_trees(sampled: bool, drafting: str = "auto") -> tuple[TreeShape, ...]:
    """The trees stage 1 times the kernels at: those of the drafting modes the run may use."""
    if not sampled or drafting == "topk":
        return PROBES
    return SAMPLED_PROBES if drafting == "auto" else SAMPLED_PROBES[1:]


def kernel_candidates(device: str | torch.device, dtype: str = "auto", exact_attention: bool | None = None,
                      prepack: bool | None = None, parameters: int | None = None) -> list[Kernels]:
    """The kernel combinations to time on `device`, after the run's explicit settings (None / "auto": free).

    CPU: float32 and bf16; exact attention where the precision needs it to reproduce plain decoding
    (bf16: `eagle.precision.needs_exact_attention`) unless set; prepacked linears on and off where
    oneDNN packs that precision here (`eagle.kernels.packs`) and a packed copy of the target's
    `parameters` weights fits in memory (`eagle.kernels.packed_copy_fits`), unless set. Other devices: one candidate,
    the precision of `eagle.precision.resolve_dtype` and no prepacking (nothing on a GPU is timed:
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


def cache_path(key: dict, cache_dir: Path) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return Path(cache_dir) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


@contextmanager
def generators(target, head, kernels: list[Kernels], tree: TreeShape) -> Iterator[dict[Kernels, SpeculativeGenerator]]:
    """One generator per kernel candidate on the same model (closed in reverse order, so the model
    gets its own attention implementation back)."""
    with ExitStack() as stack:
        yield {k: stack.enter_context(SpeculativeGenerator(
            target, head, tree.total_tokens, tree.depth, tree.branching, adaptive=tree.adaptive,
            drafting=tree.drafting, exact_attention=k.exact_attention, prepack=k.prepack)) for k in kernels}


def use_tree(gen: SpeculativeGenerator, tree: TreeShape) -> None:
    gen.total_tokens, gen.depth, gen.branching = tree.total_tokens, tree.depth, tree.branching
    gen.adaptive, gen.drafting = tree.adaptive, tree.drafting


def batches_of(prompts: list[torch.Tensor], batch: int) -> list[list[torch.Tensor]]:
    """The prompts in groups of `batch` (1: one each); too few prompts for a whole group are cycled."""
    if batch == 1:
        return [[p] for p in prompts]
    count = max(len(prompts), batch)
    cycled = [prompts[i % len(prompts)] for i in range(count - count % batch)]
    return [cycled[i: i + batch] for i in range(0, len(cycled), batch)]


def decode(gen: SpeculativeGenerator, plain: bool, group: list[torch.Tensor], sampling: SamplingConfig,
           max_new_tokens: int, rng: torch.Generator | None) -> tuple[list[list[int]], float]:
    """Each prompt's tokens and the call's seconds: plain decoding or strict speculation of one prompt
    (`vanilla` / `generate`), or of a batch of them at once (`vanilla_batch` / `generate_batch`)."""
    if len(group) == 1:
        out = (gen.vanilla if plain else gen.generate)(group[0], sampling, max_new_tokens=max_new_tokens,
                                                       generator=rng)
        return [out.tokens], out.seconds
    outs = (gen.vanilla_batch if plain else gen.generate_batch)(group, sampling, max_new_tokens=max_new_tokens,
                                                                generator=rng)
    return [o.tokens for o in outs], max(o.seconds for o in outs)


@torch.inference_mode()
def time_runs(gens: dict[str, SpeculativeGenerator], prompts: list[torch.Tensor], sampling: SamplingConfig,
              trees: tuple[TreeShape, ...], max_new_tokens: int, rounds: int = 1,
              check: bool = False, batch: int = 1) -> dict[str, dict]:
    """Tokens/s of plain decoding and of strict speculation at each tree, for each generator,
    interleaved prompt by prompt (`batch` > 1: batch by batch, the throughput of the whole batch).
    check: also whether strict greedy output (at the first tree) equals plain greedy output on every
    prompt (checked greedily when `sampling` samples).
    Returns {name: {"plain": tok/s, "trees": {label: tok/s}, "identical": bool (with check)}}."""
    runs = ("plain", *(t.label for t in trees))
    tokens = {(name, run): 0 for name in gens for run in runs}
    seconds = dict.fromkeys(tokens, 0.0)
    identical = dict.fromkeys(gens, True)
    greedy = SamplingConfig()
    for r in range(rounds):
        for i, group in enumerate(batches_of(prompts, batch)):
            for name, gen in gens.items():
                seed = r * 997 + i
                rng = None if sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(seed)
                plain, took = decode(gen, True, group, sampling, max_new_tokens, rng)
                tokens[name, "plain"] += sum(map(len, plain))
                seconds[name, "plain"] += took
                first = None
                for tree in trees:
                    use_tree(gen, tree)
                    if rng is not None:
                        rng.manual_seed(seed)
                    out, took = decode(gen, False, group, sampling, max_new_tokens, rng)
                    tokens[name, tree.label] += sum(map(len, out))
                    seconds[name, tree.label] += took
                    first = first or out
                if check and r == 0:
                    if not sampling.greedy:
                        use_tree(gen, trees[0])
                        plain = decode(gen, True, group, greedy, max_new_tokens, None)[0]
                        first = decode(gen, False, group, greedy, max_new_tokens, None)[0]
                    identical[name] &= first == plain
    result = {}
    for name in gens:
        result[name] = {"plain": tokens[name, "plain"] / seconds[name, "plain"],
                        "trees": {t.label: tokens[name, t.label] / seconds[name, t.label] for t in trees}}
        if check:
            result[name]["identical"] = identical[name]
    return result


def _dtypes(kernels: list[Kernels]) -> list[str]:
    """The precisions of `kernels`, in order, each once."""
    return list(dict.fromkeys(k.dtype for k in kernels))


def calibrate(load: Load, kernels: list[Kernels], prompts: list[torch.Tensor], sampling: SamplingConfig,
              trees: tuple[TreeShape, ...] | None = CANDIDATES, fixed_tree: TreeShape | None = None,
              max_new_tokens: int = 64, rounds: int = 1, cache_dir: Path | None = None, log=print,
              drafting: str = "auto", batch: int = 1) -> dict:
    """The fastest kernels of `kernels` and tree of `trees` here (see the module docstring).

    load(dtype name) gives the target and its draft head in that precision. trees=None: the tree is
    `fixed_tree`, timed in each drafting mode `drafting` allows (`fixed_candidates`: when sampling
    with "auto", top-k and sampled children), and the kernels and the mode are chosen. Returns the record
    {"kernels": Kernels fields, "tree": TreeShape fields, "kernel_candidates": {label: {"plain", "trees",
    "identical"}}, "tokens_per_s": each tree's and plain decoding's with the chosen kernels,
    "speedup_over_plain", "fastest_plain": {"kernels", "tokens_per_s"}, "cache", "cached", ...}.
    cache_dir: default `default_cache()`. batch: the batch size the run decodes at (`generate_batch`):
    every candidate is timed on batches of that many prompts (the best tree shrinks as the batch grows:
    verification multiplies batch x tree rows).
    """
    if not kernels:
        raise ValueError("no kernel candidates to calibrate")
    if batch > 1:  # what batched decoding runs (`SpeculativeGenerator.generate_batch`): no adaptive tree
        if trees:
            trees = tuple(t for t in trees if batchable(t)) or (TreeShape(6, 6, 1),)
        if fixed_tree is not None and not batchable(fixed_tree):
            raise ValueError(f"tree {fixed_tree.label} cannot decode a batch: batched decoding drafts fixed "
                             "trees (no adaptive tree)")
    if trees is None and fixed_tree is None:
        raise ValueError("give the candidate trees, or the fixed tree to time the kernels at")
    sampled = not sampling.greedy
    held: dict[str, tuple] = {}
    hold_all = False  # every precision's models at once (timed interleaved), when they fit in memory

    def models(dtype: str) -> tuple:
        if dtype not in held:
            if not hold_all:
                held.clear()
            held[dtype] = load(dtype)
        return held[dtype]

    first = models(kernels[0].dtype)
    key = {**fingerprint(*first), "kernels": [k.label for k in kernels], "sampled": sampled,
           "trees": [t.label for t in trees] if trees else None, "fixed_tree": fixed_tree and fixed_tree.label,
           "drafting": drafting, **({"batch": batch} if batch > 1 else {}),
           "max_new_tokens": max_new_tokens, "prompts": len(prompts)}
    path = cache_path(key, cache_dir or default_cache())
    if path.exists():
        return {**json.loads(path.read_text()), "cache": str(path), "cached": True}
    weights = sum(p.numel() for model in first for p in model.parameters())
    hold_all = packed_copy_fits(2 * weights * sum(getattr(torch, d).itemsize for d in _dtypes(kernels)))
    probes = tuple(dict.fromkeys(probe_trees(sampled, drafting) if trees
                                 else fixed_candidates(fixed_tree, sampled, drafting)))
    if batch > 1:
        probes = tuple(t for t in probes if batchable(t)) or (TreeShape(6, 6, 1),)
    log(f"calibrating for this machine and model: {len(kernels)} kernel candidates "
        f"({', '.join(k.label for k in kernels)}) x {len(probes)} probe trees, then "
        f"{len(trees) if trees else 0} trees, on {len(prompts)} prompts ({'sampled' if sampled else 'greedy'}; "
        "cached afterwards)")
    measured: dict[str, dict] = {}
    if len(kernels) > 1 or not trees:  # one candidate and trees to time: nothing to choose in stage 1
        # Interleaved prompt by prompt over every candidate held at once, so that drift in the machine's
        # speed (other processes, clocks) falls on all alike; one precision at a time where memory is short.
        rounds_of = [_dtypes(kernels)] if hold_all else [[d] for d in _dtypes(kernels)]
        for dtypes in rounds_of:
            with ExitStack() as stack:
                named = {}
                for dtype in dtypes:
                    group = [k for k in kernels if k.dtype == dtype]
                    gens = stack.enter_context(generators(*models(dtype), group, probes[0]))
                    named.update({k.label: gens[k] for k in group})
                # warm-up: allocation, packing, kernel choice
                time_runs(named, prompts[:batch], sampling, probes, 16, batch=batch)
                measured.update(time_runs(named, prompts, sampling, probes, max_new_tokens, rounds, check=True,
                                          batch=batch))
    exact = [k for k in kernels if k.label not in measured or measured[k.label]["identical"]]
    best = max(exact or kernels, key=lambda k: max(measured[k.label]["trees"].values()) if measured else 0)
    if trees:
        target, head = models(best.dtype)
        with generators(target, head, [best], trees[0]) as gens:
            named = {best.label: gens[best]}
            time_runs(named, prompts[:batch], sampling, trees, 16, batch=batch)
            speeds = time_runs(named, prompts, sampling, trees, max_new_tokens, rounds, batch=batch)[best.label]
        shape = max(trees, key=lambda t: speeds["trees"][t.label])
    else:
        speeds = measured[best.label]
        shape = max(probes, key=lambda t: speeds["trees"][t.label])
    held.clear()
    plains = {label: m["plain"] for label, m in measured.items()} or {best.label: speeds["plain"]}
    fastest_plain = max(plains, key=plains.get)
    result = {"kernels": asdict(best), "tree": asdict(shape),
              "kernels_reproduce_plain": bool(exact),  # False: no candidate did; the fastest was taken anyway
              "kernel_candidates": {label: {"plain": round(m["plain"], 2),
                                            "trees": {t: round(v, 2) for t, v in m["trees"].items()},
                                            "identical": m["identical"]} for label, m in measured.items()},
              "tokens_per_s": {**{t: round(v, 2) for t, v in speeds["trees"].items()},
                               "plain": round(speeds["plain"], 2)},
              "speedup_over_plain": round(speeds["trees"][shape.label] / speeds["plain"], 3),
              "fastest_plain": {"kernels": fastest_plain, "tokens_per_s": round(plains[fastest_plain], 2)},
              "prompts": len(prompts), "max_new_tokens": max_new_tokens, "rounds": rounds, "sampled": sampled,
              "batch": batch,
              "machine": key["cpu"], "capability": key["capability"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    return {**result, "cache": str(path), "cached": False}
