#!/bin/bash
cd /work/main
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1
rm -rf /work/s60/cache_emb; export MARS_CACHE_DIR=/work/s60/cache_emb
echo "start $(date)"
bash scripts/bench_embedded.sh /work/s60/emb_64x128.json num_prompts=64 max_new_tokens=128 out_dir=/work/s60/emb_runs
rc=$?; echo "done $(date) rc=$rc"
