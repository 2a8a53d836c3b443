#!/bin/bash
# Usage: MARS_CACHE_DIR=EMPTY_DIR bash mt6_defaults_rerun.sh OUT_DIR (absolute); run 6 of docs/real-models.md
cd "$(dirname "$0")/../../.."
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1; git diff --stat
: "${MARS_CACHE_DIR:?an empty cache directory, with the converted GGUF linked in as models/}"
echo "start $(date)"
python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate,vanilla,strict]" out_dir="$1" summary_path="$1/smollm2_mt_bench_12x128_run6.json"
rc=$?; echo "done $(date) rc=$rc"
