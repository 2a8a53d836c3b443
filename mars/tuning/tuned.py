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
(`mars.tuning.measure`: precision and tree chosen together for strict verification, then the tree of `rule`
at those kernels; given the prompts `eval.run` times, the two share one record), cached
per machine, models, decoding (every sampling parameter), rule and batch size and shared with runs, so it is
timed once. The default prompts are those `eval.run` times for such a model: a tokenizer with a chat template
gets the chat calibration prompts through that template (`CHAT_PROMPTS`), any other the standard library's
functions as raw text (`COMPLETION_PROMPTS`). `gen.calibration` holds the records (`mars.tuning.record`). A
fixed tree by name (`tree="paper"`, `NAMED_TREES`) or as a `TreeShape` skips the tree's measurement; `dtype=`
fixes the precision.

Speculation off: where the best tree of `rule` was not faster than the fastest plain decoding raced in
calibration (our vanilla, `model.generate` in each precision, and on a CPU with more than AVX2 under the AVX2
limits in a worker), paired prompt by prompt (`mars.tuning.verdict`), the generator's `generate` decodes with
that plain decoding (`gen.speculate` is False, `gen.plain_decoding` names it), and `tuned` logs why. Where that
is `model.generate` in an AVX2-limited worker, the generator holds the worker (`gen.hold`) until `gen.close()`
or the end of its `with` block. `gen.speculation` holds each verdict. `gen.speculate = True` speculates anyway.
A fixed tree always speculates (the log says when calibration found it slower).

`SpeculativeGenerator(target, head)` with no settings keeps EAGLE-2's GPU tree (60/6/10), which on
a 2-core CPU is slower than plain decoding: on a CPU, use `tuned`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.reference import InProcessGenerate, LimitedGenerate, limited_references
from mars.decoding.settings import NAMED_TREES, TreeShape
from mars.rules import make_rule
from mars.tuning.candidates import kernel_candidates, tree_candidates
from mars.tuning.measure import Measured, Request, measure
from mars.tuning.plan import TIMED_TOKENS
from mars.tuning.quality_budget import BUDGET_PROMPTS, Choice, QualityBudget, choose_value
from mars.tuning.search import STRICT
from mars.verification.sampling import SamplingConfig

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts"
# Train-split functions of the standard library, as raw text: what `eval.run` calibrates a completion model on.
COMPLETION_PROMPTS = PROMPTS / "stdlib_calibration.jsonl"
# Short chat requests of the kinds chat benchmarks ask (writing to humanities), none from a benchmark: what
# `eval.run` calibrates a chat model on where its benchmark has no questions to spare.
CHAT_PROMPTS = PROMPTS / "chat_calibration.jsonl"


def calibration_prompts(tokenizer, path: Path | None = None) -> list[torch.Tensor]:
    """The calibration prompts as `eval.run` encodes them: a chat model's (a tokenizer with a chat template)
    each first turn through its template, with the template's default system message; otherwise BOS, then the
    text. `path`: a JSONL file of "prompt" or "turns" records (default: `CHAT_PROMPTS` or `COMPLETION_PROMPTS`)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    path = path or (CHAT_PROMPTS if chat else COMPLETION_PROMPTS)
    prompts = []
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        text = record["turns"][0] if "turns" in record else record["prompt"]
        if chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = [tokenizer.bos_token_id, *ids] if tokenizer.bos_token_id is not None else ids
        prompts.append(torch.tensor([list(ids)]))
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
          max_new_tokens: int = 64, top_p: float = 1.0, top_k: int = 0, cache_dir: Path | None = None, log=print,
          quality_budget: QualityBudget | None = None, **rule_params) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for `target` (a local directory or hub id) and its EAGLE `draft`, with
    the settings measured on this machine for decoding at `temperature` with `rule` (and `rule_params`,
    e.g. theta=0.9) at `batch_size` (see the module docstring). device: default CUDA when available.
    prompts: token tensors [1, n] to time on, the first 24 * batch_size of them (default: `calibration_prompts`
    with the target's tokenizer; `mars.tuning.search.UNITS`).
    budget: seconds for all the timing together (first use only; None: `mars.tuning.plan.DEFAULT_BUDGET`).
    max_new_tokens: the length your calls decode; candidates are timed at it, or at
    `mars.tuning.plan.TIMED_TOKENS` where that is shorter. top_p, top_k: the sampling
    filters your calls use (each its own record). quality_budget: the rule's main parameter (MARS's theta) is
    chosen, not given: the value that accepts the most while its exact cost per token on the prompts stays within
    the budget (`mars.tuning.quality_budget`), at strict's measured kernels and tree; `gen.quality_choice` holds
    it and every value measured, and the call is `gen.generate(ids, rule=rule, **gen.quality_choice.params)`."""
    from transformers import AutoTokenizer

    target, draft = str(target), str(draft)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(tree, str) and tree != "auto" and tree not in NAMED_TREES:
        raise ValueError(f"tree must be 'auto', a TreeShape or one of {', '.join(NAMED_TREES)}, got {tree!r}")
    fixed = NAMED_TREES[tree] if isinstance(tree, str) and tree != "auto" else tree if tree != "auto" else None
    sampled = temperature > 0
    parameters = _parameters(target) if torch.device(device).type == "cpu" else None
    options = kernel_candidates(device, dtype, parameters=parameters)

    load = _Models(target, draft, device)
    if prompts is None:
        prompts = calibration_prompts(AutoTokenizer.from_pretrained(target))
    prompts = [p.to(device) for p in prompts]
    trees = tree_candidates(sampled, drafting) if fixed is None else None
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    references = limited_references(target, device)  # a worker process, started at its first timing
    try:  # the one door `eval.run` goes through too
        request = Request(sampling, trees=trees, fixed_tree=fixed, drafting=drafting, batch=batch_size,
                          budget=budget, max_new_tokens=max_new_tokens, references=references, cache_dir=cache_dir,
                          log=log)
        choice = None if quality_budget is None else _budgeted(
            load, options, prompts, request, rule=rule, params=rule_params, budget=quality_budget, target=target)
        if choice is not None:
            log(choice.describe(rule))
            rule_params = {**rule_params, **choice.params}
        if rule != STRICT and fixed is None:
            request = replace(request, rules={rule: replace(sampling, rule=make_rule(rule, **rule_params))})
        found = measure(load, options, prompts, request)
    finally:
        for reference in references:
            reference.close()
    gen = _generator(found, rule, load, target, log)
    gen.quality_choice = choice
    return gen


class _Models:
    """The target and its head in each precision, loaded once per `tuned` call: the calibration, the budget's
    choice and the generator returned all decode on the same copies (each generator hands its model back as it
    was given, `SpeculativeGenerator.close`), since a load of a model of billions of parameters takes minutes
    and a call with a quality budget goes through four steps that each need the target."""

    def __init__(self, target: str, draft: str, device: str):
        self.target, self.draft, self.device = target, draft, device
        self.loaded: dict[str, tuple[torch.nn.Module, torch.nn.Module]] = {}

    def __call__(self, dtype: str) -> tuple[torch.nn.Module, torch.nn.Module]:
        if dtype not in self.loaded:
            from transformers import AutoModelForCausalLM

            from eagle.checkpoint import load_draft

            model = AutoModelForCausalLM.from_pretrained(self.target, dtype=getattr(torch, dtype))
            model = model.to(self.device).eval()
            self.loaded[dtype] = (model, load_draft(self.draft, model))
        return self.loaded[dtype]

    def keep(self, *dtypes: str) -> None:
        """Let go of the copies in other precisions (before loading these: a calibration may have held a copy
        the generator does not use, and two copies of a large model may not fit together)."""
        self.loaded = {d: pair for d, pair in self.loaded.items() if d in dtypes}


def _budgeted(load: _Models, options: list, prompts: list[torch.Tensor], request: Request, *, rule: str, params: dict,
              budget: QualityBudget, target: str) -> Choice:
    """`rule`'s main parameter chosen by `budget` (`mars.tuning.quality_budget`) at strict's measured kernels and
    tree: strict's calibration first (then cached for the rule's), a generator with it, the grid decoded there."""
    strict = _generator(measure(load, options, prompts, request), STRICT, load, target, lambda _: None)
    budgets = Path(request.cache_dir) / "budgets" if request.cache_dir else None
    try:
        return choose_value(strict, prompts[:BUDGET_PROMPTS], rule, params, request.strict, budget,
                            min(request.max_new_tokens, TIMED_TOKENS), budgets)
    finally:
        strict.close()


def _generator(found: Measured, rule: str, load: _Models, target: str, log) -> SpeculativeGenerator:
    """The generator `found` describes for `rule`, with the models `load` gives, and its plain decoding where its
    speculation is off."""
    kernels, shape = found.kernels, found.method_trees.get(rule, found.tree)
    records, speculation = found.records, found.speculation
    plain = found.plain_kernels or kernels
    load.keep(kernels.dtype, plain.dtype)
    model, head = load(kernels.dtype)
    copy = load(plain.dtype)[0] if plain.dtype != kernels.dtype else None  # plain decoding in another precision
    gen = SpeculativeGenerator(model, head, shape, exact_attention=kernels.exact_attention, prepack=kernels.prepack,
                               onednn=kernels.onednn, plain_kernels=plain, plain_model=copy)
    gen.calibration, gen.speculation = records, speculation
    verdict = speculation.get(rule) or speculation.get("strict")  # a fixed tree: strict's record timed it
    gen.speculate = verdict.speculate if verdict else True
    if verdict is not None and not verdict.speculate:
        gen.plain_decoding = plain_decoding(verdict.plain, target, model, gen)
    plain = "" if gen.plain_kernels == kernels else f" (plain decoding at {gen.plain_kernels.label})"
    log(f"tuned for this machine: {kernels.label}{plain}, tree {shape.label}"
        + "".join(f"; {name}: {'cached' if r.cached else 'measured'} ({r.cache})" for name, r in records.items()))
    if verdict:
        log(verdict.reason)
    return gen


def plain_decoding(label: str, target: str, model: torch.nn.Module, gen: SpeculativeGenerator):
    """What a generator whose speculation is off decodes with: the fastest plain decoding calibration raced,
    by its `label`. Our vanilla needs nothing (None: the generator's own plain loop at its plain kernels);
    `model.generate` in this process runs on `model` when in its precision; under the AVX2 limits it runs in a
    worker process the generator holds (`gen.hold`, ended by `gen.close()`)."""
    if label.startswith("vanilla"):
        return None
    dtype, _, isa = label.removeprefix("generate@").partition("+")
    if isa:
        return gen.hold(LimitedGenerate(target, dtype, isa))
    if dtype == str(model.dtype).removeprefix("torch."):
        return InProcessGenerate(model, gen.target.own_attention)
    from transformers import AutoModelForCausalLM

    copy = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).to(model.device).eval()
    return InProcessGenerate(copy, copy.config._attn_implementation)
