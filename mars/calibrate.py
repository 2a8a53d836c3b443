"""The draft tree that runs fastest on this machine, found by timing candidates, cached per machine and model.

How large a tree pays depends on the machine by an order of magnitude (a 21-node verification costs
~1.5 decodes on a CPU with bf16 matrix instructions, ~5 in bf16 and ~1.7 in float32 on one without,
about one on a GPU) and on how well the draft predicts the target (greedy vs sampled decoding).
`calibrate_tree` decodes a few calibration prompts (never the benchmark's) with every candidate tree
and with plain decoding, interleaved round by round, and keeps the candidate with the most tokens/s.
The result is cached under `cache_dir` by a key of the machine, the models, their precision and
the kind of decoding (greedy or sampled), so the calibration runs once per machine.

The tree changes only which tokens are drafted: strict verification stays exact (greedy) and
lossless (sampling) with any of them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from eagle.precision import cpu_name
from mars.generate import SpeculativeGenerator
from mars.sampling import SamplingConfig


def default_cache() -> Path:
    """Where calibrations are kept: $MARS_CACHE_DIR/trees, default ~/.cache/mars-spec/trees."""
    return Path(os.environ.get("MARS_CACHE_DIR", Path.home() / ".cache" / "mars-spec")) / "trees"


@dataclass(frozen=True)
class TreeShape:
    total_tokens: int
    depth: int
    branching: int
    adaptive: bool = False

    @property
    def label(self) -> str:
        return f"{self.total_tokens}/{self.depth}/{self.branching}" + (" adaptive" if self.adaptive else "")


# From a narrow chain-like tree to EAGLE-2's GPU default; the adaptive policy (mars.adaptive) as the
# candidate that can fall back to plain decoding steps where no fixed tree pays.
CANDIDATES = (
    TreeShape(8, 4, 2), TreeShape(12, 4, 3), TreeShape(16, 4, 4), TreeShape(20, 4, 5), TreeShape(24, 5, 5),
    TreeShape(32, 5, 6), TreeShape(32, 6, 6), TreeShape(48, 6, 8), TreeShape(60, 6, 10), TreeShape(20, 6, 5, True),
)


def fingerprint(gen: SpeculativeGenerator) -> dict:
    """What the fastest tree depends on: the machine, torch, the models and how verification runs."""
    cpu = cpu_name()
    device = gen.target.devices.logits
    model = gen.target.model
    with torch.no_grad():  # a cheap checksum of the weights: a retrained model gets a new calibration
        weights = [float(p.float().sum()) for p in (model.get_output_embeddings().weight, *gen.head.parameters())]
    return {
        "cpu": cpu, "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "target": getattr(model.config, "_name_or_path", ""),
        "target_config": model.config.to_json_string(use_diff=False), "draft_config": gen.head.config.to_json(),
        "weights": [round(w, 3) for w in weights], "dtype": str(gen.target.dtype),
        "exact_attention": gen.target.exact_attention, "prepack": gen.prepack,
    }


def cache_path(gen: SpeculativeGenerator, sampled: bool, cache_dir: Path) -> Path:
    key = json.dumps({**fingerprint(gen), "sampled": sampled}, sort_keys=True, default=str)
    return Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@torch.inference_mode()
def time_trees(gen: SpeculativeGenerator, prompts: list[torch.Tensor], sampling: SamplingConfig,
               candidates: tuple[TreeShape, ...], max_new_tokens: int, rounds: int) -> dict:
    """Tokens/s of plain decoding and of each candidate over `prompts` [1, T] each, interleaved per round."""
    saved = gen.total_tokens, gen.depth, gen.branching, gen.adaptive
    tokens = {c.label: 0 for c in candidates} | {"plain": 0}
    seconds = dict.fromkeys(tokens, 0.0)
    try:
        for r in range(rounds):
            for i, prompt in enumerate(prompts):
                rng = None if sampling.greedy else torch.Generator(gen.target.devices.logits).manual_seed(r * 997 + i)
                out = gen.vanilla(prompt, sampling, max_new_tokens=max_new_tokens, generator=rng)
                tokens["plain"] += len(out.tokens)
                seconds["plain"] += out.seconds
                for c in candidates:
                    gen.total_tokens, gen.depth, gen.branching, gen.adaptive = (c.total_tokens, c.depth,
                                                                                  c.branching, c.adaptive)
                    if rng is not None:
                        rng.manual_seed(r * 997 + i)
                    out = gen.generate(prompt, sampling, max_new_tokens=max_new_tokens, generator=rng)
                    tokens[c.label] += len(out.tokens)
                    seconds[c.label] += out.seconds
    finally:
        gen.total_tokens, gen.depth, gen.branching, gen.adaptive = saved
    return {label: tokens[label] / seconds[label] for label in tokens}


def calibrate_tree(gen: SpeculativeGenerator, prompts: list[torch.Tensor], sampling: SamplingConfig,
                   candidates: tuple[TreeShape, ...] = CANDIDATES, max_new_tokens: int = 64, rounds: int = 1,
                   cache_dir: Path | None = None, log=print) -> dict:
    """The fastest of `candidates` for `gen` on this machine: {"tree": TreeShape fields, "tokens_per_s":
    every candidate's and plain decoding's, "cache": path, "cached": bool}. A warm-up run precedes timing.
    cache_dir: default `default_cache()`."""
    path = cache_path(gen, not sampling.greedy, cache_dir or default_cache())
    if path.exists():
        found = json.loads(path.read_text())
        return {**found, "cache": str(path), "cached": True}
    log(f"calibrating the draft tree: {len(candidates)} candidates x {len(prompts)} prompts x {rounds} rounds "
        f"({'sampled' if not sampling.greedy else 'greedy'}; cached for this machine and model afterwards)")
    time_trees(gen, prompts[:1], sampling, candidates, 16, 1)  # warm-up: allocation, kernel selection
    speeds = time_trees(gen, prompts, sampling, candidates, max_new_tokens, rounds)
    best = max(candidates, key=lambda c: speeds[c.label])
    result = {"tree": asdict(best), "tokens_per_s": {k: round(v, 2) for k, v in speeds.items()},
              "speedup_over_plain": round(speeds[best.label] / speeds["plain"], 3),
              "prompts": len(prompts), "max_new_tokens": max_new_tokens, "rounds": rounds,
              "sampled": not sampling.greedy, "machine": fingerprint(gen)["cpu"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    return {**result, "cache": str(path), "cached": False}
