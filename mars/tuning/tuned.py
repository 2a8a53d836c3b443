"""Measured settings for the Python API: in one call, what `eval.run` resolves for a run.

    from mars import tuned
    gen = tuned("data/models/target", "data/models/draft")                 # greedy, strict
    gen = tuned(target_id, draft_id, temperature=1.0, rule="mars", batch_size=4)
    with gen:
        out = gen.generate(input_ids, max_new_tokens=128)                  # gen.target.model: the target

`tuned` loads the target and its draft head in the precision measured fastest here and returns a
`SpeculativeGenerator` with the measured kernels (exact attention, prepacked linears) and tree: the
calibration `eval.run` makes with `model.dtype=auto tree=calibrated` (`mars.tuning.calibrate`: precision and
tree searched together for strict verification, then the tree of `rule` at those kernels), cached
per machine, models, kind of decoding, rule and batch size and shared with runs, so it is timed
once. `gen.calibration` holds the records. A fixed tree by name (`tree="paper"`, `NAMED_TREES`) or
as a `TreeShape` skips the tree's measurement; `dtype=` fixes the precision.

`SpeculativeGenerator(target, head)` with no settings keeps EAGLE-2's GPU tree (60/6/10), which on
a 2-core CPU is slower than plain decoding: on a CPU, use `tuned`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import NAMED_TREES, Kernels, TreeShape
from mars.rules import make_rule
from mars.tuning.calibrate import DEFAULT_BUDGET, Budget, calibrate, kernel_candidates, tree_candidates
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
          drafting: str = "auto", prompts: list[torch.Tensor] | None = None, budget: float = DEFAULT_BUDGET,
          cache_dir: Path | None = None, log=print, **rule_params) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for `target` (a local directory or hub id) and its EAGLE `draft`, with
    the settings measured on this machine for decoding at `temperature` with `rule` (and `rule_params`,
    e.g. theta=0.9) at `batch_size` (see the module docstring). device: default CUDA when available.
    prompts: token tensors [1, n] to time on (default: the repository's calibration prompts, encoded
    with the target's tokenizer). budget: seconds for all the timing together (first use only)."""
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
    common = {"log": log, "drafting": drafting, "batch": batch_size, "cache_dir": cache_dir}
    trees = tree_candidates(sampled, drafting)
    strict = SamplingConfig(temperature=temperature)
    # Strict first, precision and tree together; then the rule's own tree at those kernels (as a run).
    shares = Budget(budget, [len(options) * (len(trees) if fixed is None else 1),
                             len(trees) if rule != "strict" and fixed is None else 0])
    records = {}
    if len(options) > 1 or fixed is None:
        records["strict"] = calibrate(load, options, prompts, strict, trees=None if fixed else trees,
                                      fixed_tree=fixed, budget=shares.next(), **common)
        kernels = Kernels(**records["strict"]["kernels"])
        shape = TreeShape(**records["strict"]["tree"])
    else:
        kernels, shape = options[0], fixed
    if rule != "strict" and fixed is None:
        cfg = SamplingConfig(temperature=temperature, rule=make_rule(rule, **rule_params))
        records[rule] = calibrate(load, [kernels], prompts, cfg, trees=trees, budget=shares.next(), **common)
        shape = TreeShape(**records[rule]["tree"])
    model, head = load(kernels.dtype)
    gen = SpeculativeGenerator(model, head, shape, exact_attention=kernels.exact_attention, prepack=kernels.prepack)
    gen.calibration = records
    log(f"tuned for this machine: {kernels.label}, tree {shape.label}"
        + "".join(f"; {name}: {'cached' if r['cached'] else 'measured'} ({r['cache']})" for name, r in records.items()))
    return gen
