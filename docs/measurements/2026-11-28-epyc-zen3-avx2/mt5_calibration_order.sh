#!/bin/bash
cd /work/main
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1; git diff --stat
export MARS_CACHE_DIR=/work/s62/cache5
echo "start $(date)"
python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate,vanilla,strict]" out_dir=/work/s62/mt_runs5 summary_path=/work/s62/mt5_12x128.json
rc=$?; echo "done $(date) rc=$rc"
