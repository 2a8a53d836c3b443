#!/usr/bin/env bash
# Same-machine A/B of two commits, each a clean clone, each run from an empty MARS_CACHE_DIR; A B B A for the
# quickstart, then for bench_embedded.sh at 64 prompts x 128 tokens (about an hour on 2 cores, idle).
# Set up: git clone -q REPO /work/ab/old && git -C /work/ab/old checkout -q OLD; git clone -q REPO /work/ab/new
# && git -C /work/ab/new checkout -q NEW; mkdir -p /work/ab/runs; then ./ab.sh. Ran with OLD/NEW = c8e073a/c3ee45b
# (issue 49's commit against now, this folder) and f600bda/fa257b4 (the calibration change,
# ../2026-11-29-xeon-amx-calibration/). Table: table.py.
set -u
R=/work/ab/runs
run() {  # tag dir kind
  local tag=$1 dir=$2 kind=$3 cache=$R/cache_$1
  rm -rf "$cache"; mkdir -p "$cache"
  local start=$(date +%s) rc
  if [[ $kind == qs ]]; then
    (cd "$dir" && PYTHONPATH=$dir MARS_CACHE_DIR=$cache python -m eval.run out_dir=$R/out_$tag summary_path=$R/$tag.json > $R/$tag.log 2>&1); rc=$?
  else
    (cd "$dir" && PYTHONPATH=$dir MARS_CACHE_DIR=$cache bash scripts/bench_embedded.sh $R/$tag.json num_prompts=64 max_new_tokens=128 out_dir=$R/out_$tag > $R/$tag.log 2>&1); rc=$?
  fi
  echo "$tag rc=$rc $(( $(date +%s) - start )) s $(date +%T)" >> $R/ab.log
}
for t in old1 new1 new2 old2; do run qs_$t /work/ab/${t%?} qs; done
for t in old1 new1 new2 old2; do run be_$t /work/ab/${t%?} be; done
echo done >> $R/ab.log
