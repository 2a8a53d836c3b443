"""Does our vanilla at B = 4 run faster on the calibration's batches than on the benchmark's? (Last session the
calibration timed it at 288-310 tok/s, batch_check at 248 on the benchmark's.) Both sets, one process, the same
kernels (float32 unpacked, what calibration chose), interleaved pass by pass (order reversed every other pass),
64 tokens each, EOS ignored, greedy.

    python docs/measurements/2026-11-29-xeon-amx-b4-units/vanilla_batches.py OUT.json [--passes 4]

Writes {"capability", "sets": {name: tok/s over all passes}, "passes": [{name: tok/s}], "prompt_tokens": {name: [..]}}.
"""
import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from eval.config.paths import REPO_ROOT
from eval.harness import JobPair
from mars import SamplingConfig
from mars.tuning.calibrate import batches_of
from mars.tuning.tuned import calibration_prompts

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--passes", type=int, default=4)
args = parser.parse_args()
pair = JobPair.of("model=embedded", "tree.calibrate=false", "tree.total_tokens=4", "tree.depth=4", "tree.branching=1",
                  "model.dtype=float32", "model.prepack=false")
bench = [torch.tensor(ids) for ids in pair.prompts(64)]
calibration = [p[0] for p in calibration_prompts(AutoTokenizer.from_pretrained(REPO_ROOT / pair.config.model.target))]
sets = {"calibration 24 (6 x 4)": batches_of(calibration[:24], 4), "benchmark 24 (6 x 4)": batches_of(bench[:24], 4),
        "benchmark 64 (16 x 4)": batches_of(bench, 4), "calibration 6 (B = 1)": batches_of(calibration[:6], 1),
        "benchmark 6 (B = 1)": batches_of(bench[:6], 1)}
gen = pair.generator(pair.settings())
greedy = SamplingConfig()
gen.vanilla(sets["calibration 24 (6 x 4)"][0], greedy, max_new_tokens=16)  # warm-up
total = {name: [0, 0.0] for name in sets}
passes = []
for k in range(args.passes):
    this = {}
    for name in list(sets)[:: 1 if k % 2 == 0 else -1]:
        tokens, seconds = 0, 0.0
        for group in sets[name]:
            outs = gen.vanilla(group, greedy, max_new_tokens=64)
            tokens += sum(len(o.tokens) for o in outs)
            seconds += max(o.seconds for o in outs)
        this[name] = round(tokens / seconds, 1)
        total[name][0] += tokens
        total[name][1] += seconds
    passes.append(this)
    print(k, this)
result = {"capability": torch.backends.cpu.get_cpu_capability(), "kernels": "float32 unpacked",
          "sets": {name: round(t / s, 1) for name, (t, s) in total.items()}, "passes": passes,
          "prompt_tokens": {"calibration": [len(p) for p in calibration[:24]], "benchmark": [len(p) for p in bench]}}
print(result["sets"])
Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
