#!/bin/bash
# Usage: bash mt_run.sh OUT_DIR NAME [eval.run overrides...]
# SmolLM2 on MT-bench, 12 questions (24 turns) x 128 tokens, greedy, MARS theta = 0.9 with generate, vanilla
# and strict as baselines, from a fresh cache (the converted GGUF linked in): the runs of docs/real-models.md's
# Xeon AMX section. NAME labels the summary; the overrides make the forced shared-tree run
# (tree.per_method=false).
set -u
out="$1"; name="$2"; shift 2
cd "$(dirname "$0")/../../.."
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
grep -m1 "model name" /proc/cpuinfo
git log --oneline -1; git diff --stat
export MARS_CACHE_DIR="$out/cache"
mkdir -p "$MARS_CACHE_DIR" && ln -sfn "$HOME/.cache/mars-spec/models" "$MARS_CACHE_DIR/models"
echo "start $(date)"
python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars \
    method.theta=0.9 "baselines=[generate,vanilla,strict]" out_dir="$out/runs" \
    summary_path="$out/smollm2_mt_bench_12x128_$name.json" "$@"
rc=$?; echo "done $(date) rc=$rc"
