#!/usr/bin/env bash
# Engine A/B at one fixed setting (bf16+exact+packed, tree 8/8/1): issue-time commit vs HEAD, alternated.
set -u
R=/work/runs56
common="tree=cpu tree.total_tokens=${TT:-8} tree.depth=${TD:-8} tree.branching=${TB:-1} tree.calibrate=false model.dtype=bfloat16 model.prepack=true model.exact_attention=true method=mars method.theta=0.9 baselines=[strict] num_prompts=24 max_new_tokens=64"
for tag in old1 new1 old2 new2 old3 new3; do
  case $tag in old*) dir=/work/old; extra="";; new*) dir=/work/main; extra="exactness_checks=0";; esac
  cache=$R/fcache_$tag; rm -rf $cache; mkdir -p $cache
  (cd $dir && PYTHONPATH=$dir MARS_CACHE_DIR=$cache python -m eval.run $common $extra out_dir=$R/fout_$tag summary_path=$R/fx_$tag.json > $R/fx_$tag.log 2>&1)
  echo "$tag rc $?" >> $R/fixed.log
done
echo done >> $R/fixed.log
