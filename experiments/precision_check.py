"""Is the default the fastest setting, and how does it compare to the fastest plain decoding? One run.

Resolves the embedded default (no overrides), `model.dtype=bfloat16` and `model.dtype=float32`
as a job resolves them (`eval.harness.JobPair.settings`: calibration read from its cache, or timed first),
then decodes the held-out prompts with strict greedy speculation under each setting
and with every plain decoding a user has on this machine, interleaved prompt by prompt in one process:
`model.generate` in float32 and bf16 (torch's kernels) and our `vanilla` in each precision with the
resolved kernels, and on a CPU with more than AVX2 `model.generate` under `ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2` (read by torch when it loads: a worker process, `generate@bfloat16+avx2`), the
fastest plain bf16 decoding on AVX-512 BF16 CPUs. Every strict output is checked against its own
plain decoding. EOS is ignored: every method decodes `--tokens` tokens.

    python experiments/precision_check.py OUT.json [--prompts 32] [--tokens 128] [--plain NAME,...] [overrides ...]

--plain: only these plain decodings (as in experiments/batch_check.py); trailing eval.run overrides apply to
every configuration (e.g. `tree=cpu tree.calibration_budget=5`).

Writes {"machine", "capability", "settings": {config: resolved record}, "tokens_per_s": {method: ...},
"identical": {config: strict == vanilla on every prompt}, "default_vs_best_explicit", "fastest_plain",
"strict_vs_fastest_plain"}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eval.harness import JobPair, machine
from mars import SamplingConfig

CONFIGS = {"default": [], "bfloat16": ["model.dtype=bfloat16"], "float32": ["model.dtype=float32"]}
GREEDY = SamplingConfig()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--plain", help="only these plain decodings, comma-separated (generate@float32,...)")
    args, overrides = parser.parse_known_args()
    if not args.out:
        parser.error("give the output JSON path")

    pair = JobPair.of("model=embedded", *overrides)  # the embedded benchmark: held-out stdlib functions
    resolved = {name: pair.settings(*extra) for name, extra in CONFIGS.items()}
    for name, settings in resolved.items():
        print(f"{name}: " + " | ".join(settings.describe()))
    prompts = [torch.tensor([ids]) for ids in pair.prompts(args.prompts)]
    gens = {name: pair.generator(s) for name, s in resolved.items()}
    # model.generate here, and on a CPU with more than AVX2 under the AVX2 limits in a worker process
    plain_decoders = pair.plain_decoders(args.plain.split(",") if args.plain else None)
    totals, identical = decode_all(gens, plain_decoders, prompts, args.tokens)
    speed = {method: count / seconds for method, (count, seconds) in totals.items()}
    result = summary(speed, identical, resolved, len(prompts), args.tokens)
    for gen in reversed(list(gens.values())):  # last opened first: each hands back what it found
        gen.close()
    for decoder in plain_decoders.values():
        decoder.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for method, value in sorted(speed.items(), key=lambda kv: -kv[1]):
        print(f"{method:45s} {value:8.1f} tok/s")
    print(f"default / best explicit (strict): {result['default_vs_best_explicit']:.3f}; fastest plain: "
          f"{result['fastest_plain']['method']}; strict / fastest plain: {result['strict_vs_fastest_plain']}; "
          f"identical: {identical}")


def decode_all(gens: dict, plain_decoders: dict, prompts: list[torch.Tensor],
               tokens: int) -> tuple[dict[str, list], dict[str, bool]]:
    """Every prompt by strict and vanilla under each setting and by every plain decoder, the settings in an order
    rotated prompt by prompt, after a warm-up; returns {method: [tokens, seconds]} and, per setting, whether
    strict equalled vanilla on every prompt."""
    totals: dict[str, list] = {}

    def add(method: str, count: int, seconds: float) -> None:
        totals.setdefault(method, [0, 0.0])
        totals[method][0] += count
        totals[method][1] += seconds

    identical = dict.fromkeys(gens, True)
    for gen in gens.values():  # warm-up: packing, allocation
        gen.generate(prompts[0], max_new_tokens=16)
        gen.vanilla(prompts[0], max_new_tokens=16)
    for decoder in plain_decoders.values():
        decoder([prompts[0][0].tolist()], GREEDY, 16)
    for i, ids in enumerate(prompts):
        order = list(gens.items())
        order = order[i % len(order):] + order[:i % len(order)]  # rotated: no setting always runs first
        for name, gen in order:
            spec = gen.generate(ids, max_new_tokens=tokens)
            add(f"strict[{name}]", len(spec.tokens), spec.seconds)
            base = gen.vanilla(ids, max_new_tokens=tokens)
            add(f"vanilla[{name}]", len(base.tokens), base.seconds)
            identical[name] &= spec.tokens == base.tokens
        for name, decoder in plain_decoders.items():
            out = decoder([ids[0].tolist()], GREEDY, tokens)[0]
            add(name, len(out.tokens), out.seconds)
        print(f"{i + 1}/{len(prompts)} prompts")
    return totals, identical


def summary(speed: dict[str, float], identical: dict[str, bool], resolved: dict, prompts: int, tokens: int) -> dict:
    """The JSON written: speeds, strict's identity, the default against the best explicit precision, and each
    setting's strict against the fastest plain decoding."""
    plain_methods = {m: v for m, v in speed.items() if not m.startswith("strict")}
    fastest = max(plain_methods, key=plain_methods.get)
    best_explicit = max(speed["strict[bfloat16]"], speed["strict[float32]"])
    return {
        "machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(),
        "prompts": prompts, "max_new_tokens": tokens,
        "settings": {name: s.record() for name, s in resolved.items()},
        "tokens_per_s": {m: round(v, 2) for m, v in speed.items()}, "identical": identical,
        "default_vs_best_explicit": round(speed["strict[default]"] / best_explicit, 3),
        "fastest_plain": {"method": fastest, "tokens_per_s": round(plain_methods[fastest], 2)},
        "strict_vs_fastest_plain": {name: round(speed[f"strict[{name}]"] / plain_methods[fastest], 3)
                                    for name in resolved},
    }


if __name__ == "__main__":
    main()
