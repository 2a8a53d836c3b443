#!/bin/bash
# MT-bench 12 q x 128, greedy, MARS 0.9 + baselines, with the old head and the new one, each from an empty cache
cd /work/main
python -c "import torch;print('capability', torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
git log --oneline -1
for h in old new; do
  d=OLD_HEAD; [[ $h == new ]] && d=data/models/smollm2/draft
  rm -rf /work/gpu58/cache_$h; export MARS_CACHE_DIR=/work/gpu58/cache_$h
  echo "$h start $(date)"
  python -m eval.run model=smollm2 model.draft=$d bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate@bfloat16+avx2,vanilla,strict]" out_dir=/work/gpu58/mt_$h summary_path=/work/gpu58/mt_$h.json > /work/gpu58/mt_$h.log 2>&1
  rc=$?; echo "$h done $(date) rc=$rc"
done
rm -rf /work/gpu58/cache_alp; export MARS_CACHE_DIR=/work/gpu58/cache_alp
python -m eval.run model=smollm2 bench=alpaca num_prompts=24 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate@bfloat16+avx2,vanilla,strict]" out_dir=/work/gpu58/alpaca_new summary_path=/work/gpu58/alpaca_new.json > /work/gpu58/alpaca_new.log 2>&1
rc=$?; echo "alpaca done $(date) rc=$rc"
echo ALL DONE
