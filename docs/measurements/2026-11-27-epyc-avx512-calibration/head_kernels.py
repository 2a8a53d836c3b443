"""A one-off measurement for issue 49 item 5 (the head's steps in their own fastest kernels), kept with its JSON.

Strict 4/4/1 on SmolLM2 bf16 (exact attention, packed linears): the head's draft steps on packed oneDNN weights
(as the engine runs them) against torch's own products (oneDNN off, the head's packed forwards set aside while it
drafts); the target's tree forward unchanged. The first 6 MT-bench first turns x 128 tokens, A/B then B/A, phase
seconds per cycle (`profile=True`). Run from the repository root:

    python docs/measurements/2026-11-27-epyc-avx512-calibration/head_kernels.py > OUT.json
"""

from __future__ import annotations

import json

import torch
from hydra import compose, initialize_config_dir

from eagle.kernels import onednn
from eval.benchmarks import load_questions
from eval.benchmarks.prompting import PromptFormat, encode
from eval.config.paths import REPO_ROOT
from eval.config.schema import validate
from eval.runner import job_settings as settings
from eval.runner.models import load_head, load_target, load_tokenizer
from mars import SamplingConfig, SpeculativeGenerator
from mars.decoding import drafting
from mars.decoding.settings import TreeShape

with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
    run = validate(compose("config", overrides=["model=smollm2", "bench=mt_bench", "max_new_tokens=128"]))
fmt = PromptFormat.of(run.model.prompt)
tokenizer = load_tokenizer(run)
# the file's first six (MT-bench's num_prompts order is category by category since 2026-11-28; this ran before)
questions = sorted(load_questions(run.bench.questions, run.bench.data_dir, None, run.bench.source),
                   key=lambda q: q.question_id)[:6]
prompts = [torch.tensor([encode(tokenizer, q, [], fmt)]) for q in questions]
target = load_target(run, torch.bfloat16)
head = load_head(settings.head_setting(run, False), target)
gen = SpeculativeGenerator(target, head, TreeShape(4, 4, 1), exact_attention=True, prepack=True, onednn=True,
                           profile=True)
head_linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
packed_draft = drafting.Drafter.draft


def aten_draft(self, *args, **kwargs):
    """The head's draft steps with torch's own products: its packed forwards (instance attributes set by
    `PackedLinears.active`) set aside, oneDNN off."""
    saved = {linear: linear.__dict__.pop("forward") for linear in head_linears if "forward" in linear.__dict__}
    try:
        with onednn(False):
            return packed_draft(self, *args, **kwargs)
    finally:
        for linear, forward in saved.items():
            linear.forward = forward


def use(name: str) -> None:
    drafting.Drafter.draft = packed_draft if name == "packed" else aten_draft


greedy = SamplingConfig()
for name in ("packed", "aten"):  # warm-up
    use(name)
    gen.generate(prompts[0], greedy, max_new_tokens=16)
result = {name: {"tokens": 0, "seconds": 0.0, "cycles": 0, "phases": {}} for name in ("packed", "aten")}
tokens = {}
for order in (("packed", "aten"), ("aten", "packed")):
    for name in order:
        use(name)
        for i, prompt in enumerate(prompts):
            out = gen.generate(prompt, greedy, max_new_tokens=128)
            r = result[name]
            r["tokens"] += len(out.tokens)
            r["seconds"] += out.seconds
            r["cycles"] += out.num_cycles
            for phase, seconds in out.phase_seconds.items():
                r["phases"][phase] = r["phases"].get(phase, 0.0) + seconds
            tokens.setdefault((name, i), out.tokens)
for r in result.values():
    r["tok_s"] = r["tokens"] / r["seconds"]
    r["ms_per_cycle"] = {phase: round(1000 * s / r["cycles"], 2) for phase, s in r["phases"].items()}
    r["tau"] = r["tokens"] / r["cycles"]
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), **result,
                  "same_tokens": all(tokens[("packed", i)] == tokens[("aten", i)] for i in range(len(prompts)))},
                 indent=1))
