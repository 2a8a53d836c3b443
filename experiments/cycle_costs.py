"""What one draft-verify cycle costs on this machine, phase by phase, beside plain decoding: a JSON report.

For each tree shape the speculative loop decodes one chat prompt (in the model's prompt format) with
phase timing on (`profile=True`:
prefill, catch-up of the head, drafting, the target's tree forward, acceptance, cache update) and the
report gives milliseconds per cycle. The plain figures decode the same prompt greedily: `model.generate`
in-process, under the AVX2 limits in a worker process on a CPU with more than AVX2
(`mars.decoding.reference`), and our vanilla at the fastest plain kernels of the precision (bf16 / fp16:
torch's own products with oneDNN off, `bfloat16+aten`; float32: packed). Acceptance does not matter for these
costs (any head will do, a trained one or a stand-in), so the figures say how many plain tokens a cycle must
win back: a cycle of C ms against plain decoding at P ms per token needs tau > C / P to be faster
(`tau_to_match_fastest` divides by the fastest of them). Trees verify on packed weights where oneDNN packs
the precision, with exact attention in bf16 / fp16 (the calibrated kernels).

    python experiments/cycle_costs.py OUT.json                       # model=smollm2 and its trained head
    python experiments/cycle_costs.py OUT.json --model embedded --draft DIR --trees 8/4/2 20/4/5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from compute.kernels import packs
from eagle.checkpoint import load_draft
from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from mars import SpeculativeGenerator, TreeShape
from mars.decoding.reference import limited_references
from mars.decoding.settings import Kernels
from mars.verification.sampling import SamplingConfig

PROMPT = "Write a short story about a robot who learns to paint, in three paragraphs."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="smollm2", help="a model config of configs/model/ (default smollm2)")
    parser.add_argument("--draft", help="default: the model config's draft")
    parser.add_argument("--trees", nargs="+", default=["8/4/2", "12/4/3", "20/4/5", "30/5/6", "50/6/10"],
                        help="total/depth/branching")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    pair = JobPair.of(f"model={args.model}")
    model = pair.target(args.dtype)
    head = load_draft(args.draft or str(REPO_ROOT / pair.config.model.draft), model)
    ids = torch.tensor([pair.encode(PROMPT)])
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(),
              "threads": torch.get_num_threads(), "dtype": args.dtype, "prompt_tokens": ids.shape[1],
              "tokens": args.tokens, "trees": {}}
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False)
    plain_ms = 1000 * (time.perf_counter() - start) / args.tokens
    report["generate_ms_per_token"] = plain_ms
    plains = {"generate": plain_ms}
    for reference in limited_references(pair.source, "cpu"):
        reference.time([ids], SamplingConfig(), 8, 0)  # warm-up (and the worker's start)
        tokens, seconds = reference.time([ids], SamplingConfig(), args.tokens, 0)
        plains[reference.label] = 1000 * seconds / tokens
        reference.close()
    packed = packs(model.dtype)
    half = model.dtype != torch.float32 and torch.backends.mkldnn.is_available()
    plain = Kernels(args.dtype, False, False, onednn=False) if half else Kernels(args.dtype, False, packed)
    with SpeculativeGenerator(model, head, TreeShape(4, 4, 1), prepack=packed, plain_kernels=plain) as gen:
        gen.vanilla(ids, max_new_tokens=8)  # warm-up
        out = gen.vanilla(ids, max_new_tokens=args.tokens)  # no EOS given: every token decoded
        plains[f"vanilla {plain.label}"] = 1000 * out.seconds / len(out.tokens)
    report["plain_ms_per_token"] = {k: round(v, 2) for k, v in plains.items()}
    fastest = min(plains.values())
    for shape in args.trees:
        with SpeculativeGenerator(model, head, TreeShape(*map(int, shape.split("/"))), prepack=packed,
                                  profile=True) as gen:
            gen.generate(ids, max_new_tokens=8)  # warm-up
            out = gen.generate(ids, max_new_tokens=args.tokens)
        phases = {k: 1000 * v / out.num_cycles for k, v in out.phase_seconds.items() if k != "accounting"}
        cycle = sum(v for k, v in phases.items() if k != "prefill")  # the prompt's forward is paid once per call
        report["trees"][shape] = {"cycles": out.num_cycles, "ms_per_cycle": round(cycle, 2),
                                  "phases_ms": {k: round(v, 2) for k, v in phases.items()},
                                  "tau_to_match_generate": round(cycle / plain_ms, 2),
                                  "tau_to_match_fastest": round(cycle / fastest, 2)}
        print(shape, report["trees"][shape], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
