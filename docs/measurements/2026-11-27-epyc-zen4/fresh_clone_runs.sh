#!/usr/bin/env bash
# Issue 49's must-show runs from a fresh clone (/work/fresh at 1e51ae7) after the README's setup, one empty cache.
set -u
R=/work/runs56/fresh
export MARS_CACHE_DIR=$R/cache
rm -rf $MARS_CACHE_DIR; mkdir -p $MARS_CACHE_DIR
cd /work/fresh
step() { local tag=$1; shift; local s=$(date +%s); "$@" > $R/$tag.log 2>&1; echo "$tag rc $? $(( $(date +%s) - s )) s $(date +%H:%M)" >> $R/steps.log; }
step quickstart bash scripts/quickstart.sh summary_path=$R/quickstart.json
step embedded bash scripts/bench_embedded.sh $R/embedded_64x128.json num_prompts=64 max_new_tokens=128
step mt_bench python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate@bfloat16+avx2,vanilla,strict]" summary_path=$R/smollm2_mt_bench_12x128.json
step alpaca python -m eval.run model=smollm2 bench=alpaca num_prompts=24 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate@bfloat16+avx2,vanilla,strict]" summary_path=$R/smollm2_alpaca_24x128.json
step shared python -m eval.run model=smollm2 bench=mt_bench num_prompts=12 max_new_tokens=128 sampling=t0 method=mars method.theta=0.9 "baselines=[generate@bfloat16+avx2,vanilla,strict]" tree.per_method=false summary_path=$R/smollm2_mt_bench_12x128_shared_tree.json
step batch4 python experiments/batch_check.py $R/batch4_api_embedded_16x64.json --prompts 16 --tokens 64 --batches 4 --api
echo done >> $R/steps.log
