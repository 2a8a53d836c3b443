"""The first run on a GPU: the decoding loop at real model shapes, with random weights (nothing is
downloaded) and a synthetic draft whose greedy acceptance is set by hand.

For each shape it builds the target from the published config values (Llama-3.1-8B, Qwen3-8B; or
`tiny` for a CPU), a real EAGLE-3 head whose proposals are replaced by the target's own greedy
continuation with probability `--acceptance` per position, else a wrong token
(`mars.diagnostics.scripted.ScriptedHead`), and measures on
the device it finds (CUDA if present, else CPU):
  - host synchronisations per cycle (`mars.diagnostics.syncs.SyncCounter`) for strict and MARS,
  - time per phase of a cycle (a `profile=True` run; it synchronises at every phase boundary),
  - peak device memory (CUDA) or the process's peak RSS (CPU),
  - tokens/s of `model.generate`, our vanilla decoding, strict and MARS (greedy, interleaved per
    prompt), tau, and the share of prompts where strict equals vanilla token for token.
With `--batch 1,8,32,64`, also per batch size B > 1 (`SpeculativeGenerator.generate` of a list: B prompts of
lengths around `--prompt-len` decoded together): throughput of left-padded `model.generate`, our
`vanilla` of the list, strict and MARS; tau; per-request latency (mean, p90); host syncs per cycle of the
batch; and the share of rows where strict equals vanilla token for token.
It prints a table and writes JSON. What it measured where is in the JSON's `device` and `note`.

    python scripts/gpu_check.py --shape llama31_8b --out gpu_check.json       # on a GPU
    python scripts/gpu_check.py --shape llama31_8b --batch 1,8,32,64 --out gpu_check_batch.json
    python scripts/gpu_check.py --shape tiny --out /tmp/gpu_check.json        # anywhere (CI runs this)
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import transformers

from eagle.precision import DTYPES, resolve_dtype
from eval.config.methods import GENERATE, VANILLA
from mars import SpeculativeGenerator
from mars.accounting.timing import ACCOUNTING
from mars.decoding.settings import TreeShape
from mars.diagnostics.scripted import ScriptedHead
from mars.diagnostics.syncs import SyncCounter
from mars.rules.margin import Mars
from mars.rules.strict import Strict

# Published config values (the models' config.json); `layers` can be lowered with --layers.
SHAPES = {
    "llama31_8b": (transformers.LlamaConfig, dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}, bos_token_id=128000, eos_token_id=128001)),
    "qwen3_8b": (transformers.Qwen3Config, dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)),
    "tiny": (transformers.LlamaConfig, dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024)),
}

RULES_TIMED = (Strict(), Mars())  # the lossless rule, and MARS at the paper's theta


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated on {device}"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB peak RSS of the process"


_T0 = time.perf_counter()


def progress(message: str) -> None:
    """A timestamped line as each stage ends, so a run stopped at its time limit still says how far it got."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {message}", flush=True)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def check_batch(gen: SpeculativeGenerator, config, size: int, prompt_len: int, tokens: int) -> dict:
    """Batched decoding of `size` prompts (lengths prompt_len - 0..31) with `gen`, whose head is scripted."""
    device = next(gen.target.model.parameters()).device
    lengths = [max(1, prompt_len - (7 * i) % 32) for i in range(size)]
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(1000 + i)).to(device)
               for i, n in enumerate(lengths)]
    plain, t_vanilla = timed(lambda: gen.vanilla(prompts, max_new_tokens=tokens))
    gen.head.sequences = [p.tolist() + o.tokens for p, o in zip(prompts, plain, strict=True)]
    width = max(lengths)
    padded = torch.stack([torch.cat([p.new_zeros(width - len(p)), p]) for p in prompts])
    mask = torch.stack([torch.cat([p.new_zeros(width - len(p)), torch.ones_like(p)]) for p in prompts])
    _, t_generate = timed(lambda: gen.target.model.generate(padded, attention_mask=mask, do_sample=False,
                                                            max_new_tokens=tokens, min_new_tokens=tokens,
                                                            pad_token_id=0))
    rate = {GENERATE: size * tokens / t_generate, VANILLA: sum(len(o.tokens) for o in plain) / t_vanilla}
    latency, tau, syncs, equal = {}, {}, {}, 0
    for rule in RULES_TIMED:
        outs, t = timed(lambda rule=rule: gen.generate(prompts, max_new_tokens=tokens, rule=rule))
        rate[rule.display] = sum(len(o.tokens) for o in outs) / t
        waits = sorted(o.seconds for o in outs)
        latency[rule.display] = {"mean": round(sum(waits) / size, 4), "p90": round(waits[-(-9 * size // 10) - 1], 4)}
        tau[rule.display] = round(sum(len(o.tokens) - 1 for o in outs) / sum(o.num_cycles for o in outs), 3)
        if rule.lossless:
            equal = sum(o.tokens == p.tokens for o, p in zip(outs, plain, strict=True))
        with SyncCounter() as counter:
            run = gen.generate(prompts, max_new_tokens=tokens, rule=rule)
        cycles = max(o.num_cycles for o in run)
        syncs[rule.display] = {"per_cycle": round(counter.total / cycles, 2), "kinds": dict(counter.by_kind),
                               "cycles": cycles}
    return {"tokens_per_s": {k: round(v, 2) for k, v in rate.items()},
            "speedup_vs_generate": {k: round(rate[k] / rate[GENERATE], 3) for k in tau},
            "speedup_vs_vanilla": {k: round(rate[k] / rate[VANILLA], 3) for k in tau},
            "tau": tau, "latency_s": latency, "syncs_per_cycle": syncs, "strict_equals_vanilla": f"{equal}/{size}"}


class _Tally:
    """Per method over the prompts: seconds decoding, tokens produced, cycles (rules); and the prompts where the
    lossless rule's output equals vanilla's. (A plain class: the script also runs loaded by path, outside
    sys.modules, where `dataclass` cannot resolve its module.)"""

    def __init__(self, seconds: dict[str, float], produced: dict[str, int], cycles: dict[str, int],
                 equal: int = 0):
        self.seconds, self.produced, self.cycles, self.equal = seconds, produced, cycles, equal


def _build(shape: str, layers: int | None, dtype_name: str, acceptance: float) -> tuple:
    """The target at `shape` with random weights (seeded) and its scripted head, on the device found."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[dtype_name] if dtype_name != "auto" else resolve_dtype("auto", device.type).dtype
    config_cls, values = SHAPES[shape]
    config = config_cls(**{**values, **({"num_hidden_layers": layers} if layers else {})})
    torch.manual_seed(0)
    with torch.device(device):
        target = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    head = ScriptedHead(config, acceptance=acceptance).to(device=device, dtype=dtype)
    progress(f"{shape}: target ({config.num_hidden_layers} layers, {dtype}) and head built on {device}")
    return device, dtype, config, target, head


def _time_prompt(gen: SpeculativeGenerator, target, head: ScriptedHead, ids: torch.Tensor, tokens: int,
                 rules: dict, tally: _Tally) -> None:
    """One prompt by vanilla (whose output the scripted head then follows), `model.generate` and each rule."""
    plain, t = timed(lambda: gen.vanilla(ids, max_new_tokens=tokens))
    tally.seconds[VANILLA] += t
    tally.produced[VANILLA] += len(plain.tokens)
    head.sequence = ids[0].tolist() + plain.tokens
    out, t = timed(lambda: target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens,
        min_new_tokens=tokens, pad_token_id=0))
    tally.seconds[GENERATE] += t
    tally.produced[GENERATE] += out.shape[1] - ids.shape[1]
    for name, rule in rules.items():
        spec, t = timed(lambda rule=rule: gen.generate(ids, max_new_tokens=tokens, rule=rule))
        tally.seconds[name] += t - spec.phase_seconds[ACCOUNTING]  # the method alone, as `spec.seconds` times it
        tally.produced[name] += len(spec.tokens)
        tally.cycles[name] += spec.num_cycles
        tally.equal += rule.lossless and spec.tokens == plain.tokens


def _count_syncs(gen: SpeculativeGenerator, ids: torch.Tensor, tokens: int, rules: dict) -> dict:
    """Host syncs per cycle of each rule on the prompt `ids` again (the prefill's few syncs included)."""
    syncs = {}
    for name, rule in rules.items():
        with SyncCounter() as counter:
            run = gen.generate(ids, max_new_tokens=tokens, rule=rule)
        syncs[name] = {"per_cycle": round(counter.total / run.num_cycles, 2), "kinds": dict(counter.by_kind),
                       "cycles": run.num_cycles}
    return syncs


def _profile_phases(gen: SpeculativeGenerator, ids: torch.Tensor, tokens: int) -> dict:
    """Milliseconds per cycle in each phase but the prefill, from one profiled run (it syncs at every boundary)."""
    gen.profile = True
    profiled = gen.generate(ids, max_new_tokens=tokens)
    phases = {k: round(1e3 * v / profiled.num_cycles, 3) for k, v in profiled.phase_seconds.items()
              if k != "prefill"}
    gen.profile = False
    return phases


def check(shape: str, layers: int | None, dtype_name: str, acceptance: float, *, prompts: int, prompt_len: int,
          tokens: int, tree: tuple[int, int, int], batches: tuple[int, ...] = ()) -> dict:
    """Build `shape` with a head right at `acceptance`, decode `prompts` random prompts by every method, count
    syncs and time phases on the last, then the batch sizes; returns what the JSON holds."""
    device, dtype, config, target, head = _build(shape, layers, dtype_name, acceptance)
    rules = {rule.display: rule for rule in RULES_TIMED}
    seconds = dict.fromkeys((GENERATE, VANILLA, *rules), 0.0)
    tally = _Tally(seconds, dict.fromkeys(seconds, 0), dict.fromkeys(rules, 0))
    with SpeculativeGenerator(target, head, TreeShape(*tree)) as gen:
        progress("generator ready")
        for p in range(prompts):
            ids = torch.randint(0, config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(p))
            ids = ids.to(device)
            _time_prompt(gen, target, head, ids, tokens, rules, tally)
            progress(f"prompt {p + 1}/{prompts}: " + ", ".join(
                f"{k} {tally.produced[k] / max(seconds[k], 1e-9):.1f} tok/s" for k in seconds))
        syncs = _count_syncs(gen, ids, tokens, rules)  # the last prompt again, counted
        progress("syncs counted")
        phases = _profile_phases(gen, ids, tokens)
        progress("phases profiled")
        batched = {str(b): check_batch(gen, config, b, prompt_len, tokens) for b in batches if b > 1}
    produced, cycles = tally.produced, tally.cycles
    rate = {k: produced[k] / seconds[k] for k in seconds}
    return {
        "shape": shape, "layers": config.num_hidden_layers, "dtype": str(dtype), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "tree": list(tree), "acceptance": acceptance, "prompts": prompts, "prompt_len": prompt_len, "tokens": tokens,
        "tokens_per_s": {k: round(v, 2) for k, v in rate.items()},
        "speedup_vs_generate": {k: round(rate[k] / rate[GENERATE], 3) for k in rules},
        "speedup_vs_vanilla": {k: round(rate[k] / rate[VANILLA], 3) for k in rules},
        "tau": {k: round((produced[k] - prompts) / cycles[k], 3) for k in cycles},
        "strict_equals_vanilla": f"{tally.equal}/{prompts}",
        "syncs_per_cycle": syncs, "ms_per_cycle_by_phase": phases, "peak_memory": peak_memory(device),
        **({"batches": batched} if batched else {}),
        "note": ("random weights and a synthetic draft: speed and syncs are real for these shapes, tau is set by "
                 "--acceptance, output text is meaningless"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--layers", type=int, help="fewer decoder layers than the published model (to fit)")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto")
    parser.add_argument("--acceptance", type=float, default=0.8, help="draft's per-position greedy hit rate")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--tree", default="60/6/10", help="total_tokens/depth/branching")
    parser.add_argument("--batch", default="1", help="batch sizes, e.g. 1,8,32,64 (B > 1: generate of a list)")
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args()
    tree = tuple(int(x) for x in args.tree.split("/"))
    if len(tree) != 3:
        parser.error("--tree takes total_tokens/depth/branching, e.g. 60/6/10")
    try:
        batches = tuple(int(b) for b in args.batch.split(","))
    except ValueError:
        parser.error(f"--batch takes batch sizes separated by commas, e.g. 1,8,32,64, got {args.batch!r}")
    if any(b < 1 for b in batches):
        parser.error("--batch sizes must be >= 1")
    result = check(args.shape, args.layers, args.dtype, args.acceptance, prompts=args.prompts,
                   prompt_len=args.prompt_len, tokens=args.tokens, tree=tree, batches=batches)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
