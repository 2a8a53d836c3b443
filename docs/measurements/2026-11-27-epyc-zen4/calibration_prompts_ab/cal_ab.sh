#!/usr/bin/env bash
# ABBA on an idle machine: the quickstart (embedded pair) calibrated on the default train-split prompts (A) against
# 8 spare held-out-split functions (B, none of the 64 the run answers), fresh caches each.
set -u
R=/work/runs57
cd /work/main
for tag in A1 B1 B2 A2; do
  cache=$R/cache_$tag; rm -rf $cache; mkdir -p $cache
  extra=(); case $tag in B*) extra=(tree.calibration_prompts=$R/stdlib_calibration_heldout.jsonl);; esac
  start=$(date +%s)
  MARS_CACHE_DIR=$cache python -m eval.run out_dir=$R/out_$tag summary_path=$R/qs_$tag.json "${extra[@]}" > $R/qs_$tag.log 2>&1
  echo "$tag rc $? $(( $(date +%s) - start )) s" >> $R/cal_ab.log
done
echo done >> $R/cal_ab.log
