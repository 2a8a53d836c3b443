"""Strict greedy tau on MT-bench first turns (bf16, exact attention, packed linears) for each head given.

    python docs/measurements/2026-11-28-h100/mtbench_tau_heads.py OUT.json --questions 40 --new-tokens 128 \
        --trees 4/4/1 8/4/2 12/4/3 --heads OLD_HEAD data/models/smollm2/draft

tau does not depend on the machine's load, so this may run beside other work.
"""

import argparse
import json

import torch

from eagle.checkpoint import load_draft
from eagle.config import eos_token_ids
from eval.benchmarks import load_questions
from eval.benchmarks.prompting import encode
from eval.harness import JobPair
from mars import SpeculativeGenerator, TreeShape

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--questions", type=int, default=40)
ap.add_argument("--new-tokens", type=int, default=128)
ap.add_argument("--trees", nargs="+", default=["4/4/1", "8/4/2", "12/4/3"])
ap.add_argument("--heads", nargs="+", required=True)
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                help="float32 where oneDNN cannot pack bf16 (AVX2-only CPUs); these JSON files are bf16")
ap.add_argument("--by-category", action="store_true",
                help="the benchmark's order (MT-bench's categories in turn, as eval.run takes num_prompts since "
                     "2026-11-28); without it the file's order (questions 81, 82, ...), which these JSON files used")
args = ap.parse_args()

pair = JobPair.of("model=smollm2", "bench=mt_bench")
bench = pair.config.bench
questions = load_questions(bench.questions, bench.data_dir, None, bench.source)
if not args.by_category:
    questions = sorted(questions, key=lambda q: q.question_id)
questions = questions[: args.questions]
model = pair.target(args.dtype)
eos = sorted(eos_token_ids(model, pair.tokenizer))
prompts = [torch.tensor([encode(pair.tokenizer, q, [], pair.fmt)]) for q in questions]
out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
       "questions": f"MT-bench {'the first ' if args.by_category else 'q1-'}{len(prompts)}"
                    f"{' in category order' if args.by_category else ''}, first turns",
       "question_ids": [q.question_id for q in questions], "new_tokens": args.new_tokens, "dtype": args.dtype,
       "results": []}
for head_dir in args.heads:
    head = load_draft(head_dir, model)
    for tree in args.trees:
        shape = TreeShape(*map(int, tree.split("/")), drafting="topk")
        with SpeculativeGenerator(model, head, shape, exact_attention=True, prepack=True) as gen:
            per_question = []  # [tokens, cycles]
            for ids in prompts:
                o = gen.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=eos)
                per_question.append([len(o.tokens) - 1, o.num_cycles])
        first12 = per_question[:12]  # the questions `eval.run ... num_prompts=12` answers
        result = {"head": head_dir, "tree": tree,
                  "tau": sum(t for t, _ in per_question) / sum(c for _, c in per_question),
                  "tau_first_12": sum(t for t, _ in first12) / sum(c for _, c in first12),
                  "per_question": per_question}
        out["results"].append(result)
        print(head_dir, tree, round(result["tau"], 3), round(result["tau_first_12"], 3), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
