"""Batched speculation against batched plain decoding, at several batch sizes: one interleaved run.

For each batch size B the embedded default is resolved as a job with `batch_size=B` resolves it
(`eval.harness.JobPair.settings`: precision, kernels and tree timed on batches of B calibration prompts,
cached), then the held-out prompts are decoded B at a time by every method, batch
by batch, the methods in rotated order: `model.generate` left-padded in float32 and bf16 (and, on a CPU
with more than AVX2, bf16 under `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` in a worker process),
our batched plain decoding (`vanilla` of a list), strict and MARS speculation
(`generate` of a list). Strict's every row is checked against plain greedy decoding of its prompt alone
(our `vanilla` at batch 1 with the adapter settings B decodes with: the reference every B is held to). Greedy;
EOS ignored: every request decodes `--tokens` tokens. All requests of a batch are submitted at once;
a request's latency runs from its batch's start to its last token.

    python experiments/batch_check.py OUT.json [--prompts 64] [--tokens 128] [--batches 1,4,16] [--theta 0.9]
                                      [--t1] [--api] [--plain NAME,...] [--record] [eval.run overrides ...]

--api: the settings and generator of the Python API instead (`mars.tuned(target, draft, batch_size=B)`:
what a researcher who imports the engine gets), strict's rows checked against that generator's `vanilla`
of each prompt alone.

--plain: only these plain decodings (default every one a user has here: generate@float32, generate@bfloat16,
and generate@bfloat16+avx2 on a CPU with more than AVX2). Trailing eval.run overrides apply to every
configuration (e.g. `tree=cpu model.dtype=float32`: nothing is timed before decoding).

--record: also a measurement record of kind "batch-check" (`eval.reporting.measurements`; every figure but the
calibration's settings, which stay in OUT.json) under benchmarks/records/, the table docs/batching.md renders.

--t1: temperature 1 instead (the run's `sampling=t1`: calibration among top-k and sampled drafts; every
method seeded per batch; no identity check, sampling is compared in distribution by the tests).

Writes {"machine", "capability", "prompts", "max_new_tokens", "batches": {B: {"settings", "tokens_per_s":
{method: throughput}, "latency_p90": {method: s}, "latency_mean", "tau", "tree", "identical_to_alone": strict rows
equal to decoding alone / prompts, "fastest_plain", "speedup_vs_fastest_plain", "speedup_vs_vanilla",
"predicted_speedup_vs_fastest_plain": calibration's figure for strict, "speculation": each verdict}}}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import sys
from pathlib import Path

import torch

from eval.config.paths import REPO_ROOT
from eval.harness import JobPair, machine
from eval.reporting.measurements import Measurement, commit_of, this_machine, write
from mars import SamplingConfig, tuned

GREEDY = SamplingConfig()


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--theta", type=float, default=0.9)
    parser.add_argument("--t1", action="store_true", help="temperature 1 instead of greedy")
    parser.add_argument("--api", action="store_true", help="settings and generator from mars.tuned")
    parser.add_argument("--plain", help="only these plain decodings, comma-separated (generate@float32,...)")
    parser.add_argument("--record", action="store_true", help="also write a measurement record (batch-check)")
    args, overrides = parser.parse_known_args()
    if not args.out:
        parser.error("give the output JSON path")
    sizes = [int(b) for b in args.batches.split(",")]
    started = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M")
    cfg = SamplingConfig(temperature=1.0) if args.t1 else GREEDY
    pair = JobPair.of("model=embedded", *(["sampling=t1"] if args.t1 else []), *overrides)
    prompts = [torch.tensor(ids) for ids in pair.prompts(args.prompts)]
    plain_decoders = pair.plain_decoders(args.plain.split(",") if args.plain else None)
    references: dict[tuple, list[list[int]]] = {}
    result = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(), "prompts": len(prompts),
              "max_new_tokens": args.tokens, "theta": args.theta, "batches": {}}
    for size in sizes:
        gen, record, verdicts, alone = generator_for(args, pair, cfg, size, prompts, references)
        groups = [prompts[k: k + size] for k in range(0, len(prompts), size)]
        ours = our_methods(gen, cfg, args)
        methods = {**{name: (lambda g, n, d=d: d([p.tolist() for p in g], cfg, n))
                      for name, d in plain_decoders.items()}, **ours}
        for run in methods.values():  # warm-up: packing, allocation, kernel choice at this batch size
            run(groups[0], 16)
        timed = time_groups(methods, groups, alone, size, args.tokens)
        gen.close()
        speed = {m: timed["tokens"][m] / timed["seconds"][m] for m in methods}
        row = result["batches"][str(size)] = batch_record(args, cfg, gen, speed, timed, ours=ours, record=record,
                                                          verdicts=verdicts, prompts=len(prompts))
        print(f"B={size}: " + ", ".join(f"{m} {v:.1f}" for m, v in speed.items()) + f" tok/s; tau {row['tau']}; "
              f"identical {row['identical_to_alone']}; vs fastest plain ({row['fastest_plain']['method']}) "
              f"{row['speedup_vs_fastest_plain']}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")  # every finished batch size kept
    for decoder in plain_decoders.values():
        decoder.close()
    if args.record:
        record = measurement(result, started, args.out)
        print(write(record, suffixes=(*(["t1"] if args.t1 else []), *(["api"] if args.api else []))))


def seeded(t1: bool) -> dict:
    """A call's random generator, seeded afresh (sampling only): every method draws the same numbers."""
    return {"generator": torch.Generator().manual_seed(0)} if t1 else {}


def reference(pair: JobPair, settings, prompts: list[torch.Tensor], tokens: int,
              references: dict[tuple, list[list[int]]]) -> list[list[int]]:
    """Plain greedy decoding of each prompt alone (batch 1, `vanilla`) with the adapter settings B decodes
    with (precision, exact attention, kernels): what strict must reproduce (kept in `references`)."""
    key = (settings.dtype.value, settings.exact_attention.value, settings.prepack.value)
    if key not in references:
        with pair.generator(settings) as alone:
            references[key] = [alone.vanilla(p[None], max_new_tokens=tokens, tree_kernels=True).tokens
                               for p in prompts]
    return references[key]


def generator_for(args: argparse.Namespace, pair: JobPair, cfg: SamplingConfig, size: int,
                  prompts: list[torch.Tensor], references: dict) -> tuple:
    """Batch size `size`'s generator (`mars.tuned`'s with --api, else a job's), its settings' record, its
    speculation verdicts, and each prompt's output alone that strict must equal (None when sampling)."""
    if args.api:
        m = pair.config.model
        head = m.sampling_draft if args.t1 and m.sampling_draft else m.draft
        gen = tuned(REPO_ROOT / m.target, REPO_ROOT / head, temperature=cfg.temperature, batch_size=size,
                    max_new_tokens=args.tokens)
        record = {name: calibration.to_dict() for name, calibration in gen.calibration.items()}
        verdicts = gen.speculation
        alone = None if args.t1 else [gen.vanilla(p[None], max_new_tokens=args.tokens, tree_kernels=True).tokens
                                      for p in prompts]
        return gen, record, verdicts, alone
    settings = pair.settings(f"batch_size={size}")
    print(f"B={size}: " + " | ".join(settings.describe()))
    alone = None if args.t1 else reference(pair, settings, prompts, args.tokens, references)
    return pair.generator(settings), settings.record(), settings.speculation, alone


def our_methods(gen, cfg: SamplingConfig, args: argparse.Namespace) -> dict:
    """Our batched plain decoding, strict and MARS on `gen`: run(prompts, max_new_tokens) -> outputs."""
    plain_ours, spec = gen.vanilla, gen.generate
    return {"vanilla": lambda g, n, run=plain_ours: run(g, cfg, max_new_tokens=n, **seeded(args.t1)),
            "strict": lambda g, n, run=spec: run(g, cfg, max_new_tokens=n, **seeded(args.t1)),
            f"mars@{args.theta:g}": lambda g, n, run=spec: run(g, cfg, max_new_tokens=n, rule="mars",
                                                                theta=args.theta, **seeded(args.t1))}


def time_groups(methods: dict, groups: list[list[torch.Tensor]], alone: list[list[int]] | None, size: int,
                tokens: int) -> dict:
    """Every group by every method, in an order rotated group by group: tokens, seconds (a group's wall time:
    its slowest request) and latencies per method, and strict's cycles, emitted tokens and rows equal to `alone`."""
    timed = {"tokens": dict.fromkeys(methods, 0), "seconds": dict.fromkeys(methods, 0.0),
             "latency": {m: [] for m in methods}, "cycles": 0, "cycle_tokens": 0, "same": 0}
    total = sum(len(g) for g in groups)
    for k, group in enumerate(groups):
        order = list(methods.items())
        for name, run in order[k % len(order):] + order[: k % len(order)]:
            outs = run(group, tokens)
            timed["tokens"][name] += sum(len(o.tokens) for o in outs)
            timed["seconds"][name] += max(o.seconds for o in outs)
            timed["latency"][name] += [o.seconds for o in outs]
            if name == "strict":
                timed["same"] += alone is not None and sum(o.tokens == alone[k * size + i] for i, o in enumerate(outs))
                timed["cycles"] += sum(o.num_cycles for o in outs)
                timed["cycle_tokens"] += sum(len(o.tokens) - 1 for o in outs)
        print(f"B={size}: {min((k + 1) * size, total)}/{total} prompts")
    return timed


def batch_record(args: argparse.Namespace, cfg: SamplingConfig, gen, speed: dict[str, float], timed: dict, *,
                 ours: dict, record: dict, verdicts: dict, prompts: int) -> dict:
    """One batch size's entry of the JSON: throughput, latency, tau, identity and speedups (of `ours` but vanilla),
    beside calibration's prediction for strict."""
    plains = {m: v for m, v in speed.items() if m.startswith("generate") or m == "vanilla"}
    fastest = max(plains, key=plains.get)
    cycles = timed["cycles"]
    return {
        "settings": record, "from": "mars.tuned" if args.api else "eval.harness.JobPair.settings",
        "tokens_per_s": {m: round(v, 2) for m, v in speed.items()},
        "latency_p90": {m: round(p90(v), 4) for m, v in timed["latency"].items()},
        "latency_mean": {m: round(sum(v) / len(v), 4) for m, v in timed["latency"].items()},
        "tau": round(timed["cycle_tokens"] / cycles, 3) if cycles else None, "tree": gen.tree.label,
        "identical_to_alone": None if args.t1 else f"{timed['same']}/{prompts}",
        "temperature": cfg.temperature, "drafting": gen.tree.drafts(not cfg.greedy),
        "fastest_plain": {"method": fastest, "tokens_per_s": round(plains[fastest], 2)},
        "speedup_vs_fastest_plain": {m: round(speed[m] / plains[fastest], 3) for m in ours if m != "vanilla"},
        "speedup_vs_vanilla": {m: round(speed[m] / speed["vanilla"], 3) for m in ours if m != "vanilla"},
        # calibration's prediction for strict (its tree, or plain decoding where speculation is off) beside it
        "predicted_speedup_vs_fastest_plain": {"strict": verdicts["strict"].predicted if "strict" in verdicts
                                               else None},
        "speculation": {name: v.state for name, v in verdicts.items()},
    }


def measurement(result: dict, date: str, out: str) -> Measurement:
    """The run as a measurement record: the batch sizes' figures without their calibration settings, the command
    naming its output OUT.json (where this run wrote it says nothing to a reader)."""
    machine_, versions = this_machine()
    rows = {b: {k: v for k, v in row.items() if k != "settings"} for b, row in result["batches"].items()}
    figures = {**{k: v for k, v in result.items() if k not in ("machine", "capability", "batches")}, "batches": rows}
    argv = ["OUT.json" if a == out else a for a in sys.argv[1:]]
    command = shlex.join(["python", "experiments/batch_check.py", *argv])
    return Measurement(kind="batch-check", what="batched speculation against batched plain decoding of the embedded "
                       "pair, by batch size, interleaved", command=command, commit=commit_of(), date=date,
                       machine=machine_, versions=versions, figures=figures)


if __name__ == "__main__":
    main()
