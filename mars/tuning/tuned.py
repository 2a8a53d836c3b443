"""Measured settings for the Python API: in one call, what `eval.run` resolves for a run.

    from mars import tuned
    gen = tuned("data/models/target", "data/models/draft")                 # greedy, strict
    gen = tuned(target_id, draft_id, temperature=1.0, rule="mars", batch_size=4)
    with gen:
        out = gen.generate(input_ids, max_new_tokens=128)                  # gen.target.model: the target

`tuned` loads the target and its draft head in the precision measured fastest here and returns a
`SpeculativeGenerator` with the measured kernels (exact attention, prepacked linears, oneDNN; plain decoding
at the fastest plain kernels of that precision, `gen.plain_kernels`) and tree: the
calibration `eval.run` makes with `model.dtype=auto tree=calibrated`, through the same door
(`mars.tuning.measure`: precision and tree searched together for strict verification, then the tree of `rule`
at those kernels; given the prompts `eval.run` times, the two share one record), cached
per machine, models, kind of decoding, rule and batch size and shared with runs, so it is timed
once. `gen.calibration` holds the records. A fixed tree by name (`tree="paper"`, `NAMED_TREES`) or
as a `TreeShape` skips the tree's measurement; `dtype=` fixes the precision.

Speculation off: where the best tree of `rule` ran slower than the fastest plain decoding timed in
calibration (our vanilla at every kernel candidate, `model.generate` in each precision, and on a CPU with
more than AVX2 under the AVX2 limits: `mars.tuning.calibrate.speculation_of`), the generator's `generate`
decodes plainly, exactly as `vanilla` does (`gen.speculate` is False), at the kernels of our fastest plain
decoding, and `tuned` logs why; `gen.speculation` holds each verdict. `gen.speculate = True` speculates
anyway. A fixed tree always speculates (the log says when calibration found it slower).

`SpeculativeGenerator(target, head)` with no settings keeps EAGLE-2's GPU tree (60/6/10), which on
a 2-core CPU is slower than plain decoding: on a CPU, use `tuned`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.reference import limited_references
from mars.decoding.settings import NAMED_TREES, TreeShape
from mars.rules import make_rule
from mars.tuning.calibrate import kernel_candidates, tree_candidates
from mars.tuning.measure import measure
from mars.verification.sampling import SamplingConfig

# Train-split functions of the standard library: what `eval.run` calibrates on (never a benchmark's).
CALIBRATION_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts" / "stdlib_calibration.jsonl"


def calibration_prompts(tokenizer, path: Path = CALIBRATION_PROMPTS) -> list[torch.Tensor]:
    """The calibration prompts as `eval.run` encodes a completion prompt: BOS, then the text."""
    prompts = []
    for line in path.read_text().splitlines():
        ids = tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"]
        prompts.append(torch.tensor([[tokenizer.bos_token_id, *ids] if tokenizer.bos_token_id is not None else ids]))
    return prompts


def _parameters(target: str) -> int:
    """The target's parameter count, from its config (no weights loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target))
    return sum(p.numel() for p in model.parameters())


def tuned(target: str | Path, draft: str | Path, *, temperature: float = 0.0, rule: str = "strict",
          batch_size: int = 1, device: str | None = None, dtype: str = "auto", tree: str | TreeShape = "auto",
          drafting: str = "auto", prompts: list[torch.Tensor] | None = None, budget: float | None = None,
          max_new_tokens: int = 64, cache_dir: Path | None = None, log=print, **rule_params) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for `target` (a local directory or hub id) and its EAGLE `draft`, with
    the settings measured on this machine for decoding at `temperature` with `rule` (and `rule_params`,
    e.g. theta=0.9) at `batch_size` (see the module docstring). device: default CUDA when available.
    prompts: token tensors [1, n] to time on, the first 24 * batch_size of them (default: the repository's
    calibration prompts, encoded with the target's tokenizer; `mars.tuning.calibrate.UNITS`).
    budget: seconds for all the timing together (first use only; None: 120 s,
    more for turns longer than 64 tokens, `mars.tuning.calibrate.budget_for`).
    max_new_tokens: the length your calls decode, which candidates are timed at."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle.checkpoint import load_draft

    target, draft = str(target), str(draft)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(tree, str) and tree != "auto" and tree not in NAMED_TREES:
        raise ValueError(f"tree must be 'auto', a TreeShape or one of {', '.join(NAMED_TREES)}, got {tree!r}")
    fixed = NAMED_TREES[tree] if isinstance(tree, str) and tree != "auto" else tree if tree != "auto" else None
    sampled = temperature > 0
    parameters = _parameters(target) if torch.device(device).type == "cpu" else None
    options = kernel_candidates(device, dtype, parameters=parameters)

    def load(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, name)).to(device).eval()
        return model, load_draft(draft, model)

    if prompts is None:
        prompts = calibration_prompts(AutoTokenizer.from_pretrained(target))
    prompts = [p.to(device) for p in prompts]
    trees = tree_candidates(sampled, drafting) if fixed is None else None
    rules = {rule: SamplingConfig(temperature=temperature, rule=make_rule(rule, **rule_params))} \
        if rule != "strict" and fixed is None else {}
    references = limited_references(target, device)  # a worker process, started at its first timing
    try:  # the one door `eval.run` goes through too
        found = measure(load, options, prompts, SamplingConfig(temperature=temperature), rules, trees=trees,
                        fixed_tree=fixed, drafting=drafting, batch=batch_size, budget=budget, references=references,
                        max_new_tokens=max_new_tokens, cache_dir=cache_dir, log=log)
    finally:
        for reference in references:
            reference.close()
    kernels, shape = found.kernels, found.method_trees.get(rule, found.tree)
    records, speculation = found.records, found.speculation
    model, head = load(kernels.dtype)
    plain = found.plain_kernels or kernels
    copy = load(plain.dtype)[0] if plain.dtype != kernels.dtype else None  # plain decoding in another precision
    gen = SpeculativeGenerator(model, head, shape, exact_attention=kernels.exact_attention, prepack=kernels.prepack,
                               onednn=kernels.onednn, plain_kernels=plain, plain_model=copy)
    gen.calibration, gen.speculation = records, speculation
    verdict = speculation.get(rule) or speculation.get("strict")  # a fixed tree: strict's record timed it
    gen.speculate = verdict.speculate if verdict else True
    plain = "" if gen.plain_kernels == kernels else f" (plain decoding at {gen.plain_kernels.label})"
    log(f"tuned for this machine: {kernels.label}{plain}, tree {shape.label}"
        + "".join(f"; {name}: {'cached' if r['cached'] else 'measured'} ({r['cache']})" for name, r in records.items()))
    if verdict:
        log(verdict.reason)
    return gen
