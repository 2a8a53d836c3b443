#!/usr/bin/env bash
# The embedded benchmark: vanilla vs strict vs MARS on the embedded pair (data/models/{target,draft})
# over the held-out stdlib prompts, methods interleaved question by question, after a warm-up.
#
#   scripts/bench_embedded.sh [OUT.json] [eval.run overrides...]
#   scripts/bench_embedded.sh results/bench_embedded.json num_prompts=64 max_new_tokens=128
#
# Writes {"machine", "settings", "methods": {method: {tokens_per_s, speedup, speedup_vs_generate,
# speedup_vs_fastest, tau, relaxed_frac, quality_recovery, ...}}} to OUT.json (default
# results/bench_embedded.json); each method's answers go to its run directory,
# results/bench_embedded/<method>-T<temperature>-<run id>/answers/<method>.jsonl (the layout:
# eval/rundirs/layout.py; out_dir=... to change). speedup is the ratio of total tokens/s to vanilla's;
# speedup_vs_fastest to the fastest plain decoding timed (model.generate in the run's precision and,
# in a float32 run on a CPU, in bf16; vanilla); speedup_per_question is the EAGLE tools' ratio of mean
# per-question tokens/s. Precision, exact attention and the tree are the embedded config's: chosen
# for this machine (eagle.precision, tree=calibrated). Threads: all cores.
#   scripts/bench_embedded.sh /tmp/t1.json num_prompts=32 max_new_tokens=128 sampling=t1   # temperature 1
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/bench_embedded.json"
if [[ $# -gt 0 && "$1" != *=* ]]; then
    out="$1"
    shift
fi
exec python -m eval.run model=embedded bench=embedded "baselines=[generate,vanilla,strict,mars@0.8]" \
    out_dir=results/bench_embedded summary_path="$out" "$@"
