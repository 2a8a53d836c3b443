"""The honest CPU anchor: plain greedy decoding of the same GGUF file by llama.cpp (llama-cpp-python),
which a CPU user holding this file would otherwise run. An optional extra for this script only, never a
dependency of the project: it builds llama.cpp from source (`pip install llama-cpp-python`, ~10 min on
2 cores with cmake and a C++ compiler; docs/real-models.md says how long it took here).

    python experiments/llamacpp_anchor.py OUT.json [--prompts 8] [--tokens 256] [--bench mt_bench]

The same chat prompts as the speed figures (the benchmark's first turns through the target's own chat
template, token ids passed to llama.cpp, whose vocabulary is the same file's), `--tokens` new tokens each
(stopping at the end-of-turn ids, as ours), greedy (top-k 1, no repetition penalty), n_threads = every
core. Precision differs from ours and is stated with the figure: llama.cpp multiplies the stored 4-bit
(Q4_1) and 8-bit (Q8_0) blocks directly, activations quantised to 8 bits on the fly; our float32 and
bf16 decode the weights once (exactly, into float32) and compute in that precision. Writes
{"machine", "capability", "llama_cpp", "decode_tokens_per_s", "end_to_end_tokens_per_s", "per_prompt"}:
decode counts the tokens after the first (what `model.generate`'s per-token rate compares with), end to
end includes the prompt's evaluation. `model.generate` (float32) answers each prompt right after llama.cpp,
in the same process, for a ratio measured in one run, and the two greedy outputs are compared (the
computations differ, so the tokens may part).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from eagle.config import eos_token_ids
from eval.harness import JobPair, machine
from mars.adapter.sources import gguf_file


def hf_greedy(model, ids: list[int], tokens: int, eos: list[int]) -> dict:
    """transformers' `model.generate` in float32 (the fastest plain decoding on an AVX2-only CPU), greedy."""
    prompt = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0])[0, len(ids):].tolist()
    return {"tokens": out, "new_tokens": len(out), "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--bench", default="mt_bench")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError as e:
        raise SystemExit("llama-cpp-python is not installed: `pip install llama-cpp-python` builds llama.cpp from "
                         "source (cmake and a C++ compiler needed); it is an optional extra of this script only") from e

    torch.set_num_threads(args.threads)
    pair = JobPair.of("model=smollm2", f"bench={args.bench}")
    model = pair.target("float32")
    eos = eos_token_ids(model, pair.tokenizer)
    prompts = pair.prompts(args.prompts)  # each question's first turn
    gguf = gguf_file(pair.config.model.target)
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    per_prompt = []
    for ids in prompts:  # llama.cpp, then model.generate on the same prompt: drift touches both alike
        start = time.perf_counter()
        first = None
        tokens: list[int] = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.perf_counter()
            tokens.append(int(token))
            if token in eos or len(tokens) >= args.tokens:
                break
        end = time.perf_counter()
        theirs = hf_greedy(model, ids, args.tokens, sorted(eos))
        same = next((i for i, (a, b) in enumerate(zip(tokens, theirs["tokens"], strict=False)) if a != b),
                    min(len(tokens), len(theirs["tokens"])))
        per_prompt.append({"prompt_tokens": len(ids), "new_tokens": len(tokens), "seconds": end - start,
                           "decode_seconds": end - first, "tokens": tokens, "generate": theirs,
                           "same_prefix_as_float32": same})
    decode_tokens = sum(p["new_tokens"] - 1 for p in per_prompt)
    seconds = sum(p["seconds"] for p in per_prompt)
    hf_tokens = sum(p["generate"]["new_tokens"] for p in per_prompt)
    hf_seconds = sum(p["generate"]["seconds"] for p in per_prompt)
    llama_rate = sum(p["new_tokens"] for p in per_prompt) / seconds
    report = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability(),
              "llama_cpp": llama_cpp.__version__, "threads": args.threads, "bench": args.bench,
              "file": str(gguf), "precision": "Q4_1 / Q8_0 blocks, 8-bit activations (llama.cpp)",
              "decode_tokens_per_s": decode_tokens / sum(p["decode_seconds"] for p in per_prompt),
              "end_to_end_tokens_per_s": llama_rate,
              "generate_float32_end_to_end_tokens_per_s": hf_tokens / hf_seconds,
              "llama_cpp_vs_generate_float32": llama_rate / (hf_tokens / hf_seconds),
              "identical_to_float32_greedy": sum(p["tokens"] == p["generate"]["tokens"] for p in per_prompt),
              "per_prompt": per_prompt}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print({k: v for k, v in report.items() if k != "per_prompt"})


if __name__ == "__main__":
    main()
