#!/bin/bash
cd /work/main
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1; git diff --stat
export MARS_CACHE_DIR=/work/s60/cache_mt   # strict's calibration record of the run before (same key), MARS's anew
echo "start $(date)"
python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate,vanilla,strict]" out_dir=/work/s60/mt_runs2 summary_path=/work/s60/mt_12x128_after.json
rc=$?; echo "done $(date) rc=$rc"
