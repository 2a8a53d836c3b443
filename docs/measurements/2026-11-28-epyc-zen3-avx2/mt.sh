#!/bin/bash
cd /work/main
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1; git diff --stat
rm -rf /work/s60/cache_mt; export MARS_CACHE_DIR=/work/s60/cache_mt
mkdir -p /work/s60/cache_mt; cp -r /root/.cache/mars-spec/models /work/s60/cache_mt/ 2>/dev/null
echo "start $(date)"
python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 out_dir=/work/s60/mt_runs summary_path=/work/s60/mt_12x128.json
rc=$?; echo "done $(date) rc=$rc"
