#!/usr/bin/env bash
# Same-machine A/B of two commits, each a clean clone, each run from an empty MARS_CACHE_DIR, A B B A, for each
# kind given (default: qs be):
#   qs  the quickstart (python -m eval.run)
#   be  bench_embedded.sh at 64 prompts x 128 tokens (about an hour for the four on 2 cores, idle)
#   b4  B = 4 through mars.tuned: experiments/batch_check.py --api at $B4_PROMPTS (default 32) prompts x 64 tokens
# Set up: git clone -q REPO /work/ab/old && git -C /work/ab/old checkout -q OLD; git clone -q REPO /work/ab/new
# && git -C /work/ab/new checkout -q NEW; mkdir -p /work/ab/runs; then ./ab.sh [KIND ...]. Ran with OLD/NEW =
# c8e073a/c3ee45b (issue 49's commit against now, this folder), f600bda/fa257b4 (the calibration change,
# ../2026-11-29-xeon-amx-calibration/), e33c202/fadec20 (24 x B calibration prompts, `./ab.sh b4`,
# ../2026-11-29-xeon-amx-b4-units/), and c8e073a/eac83bb (issue 49's commit against the cycle cuts, `./ab.sh be`,
# ../2026-11-29-xeon-amx-ab2/). Table: table.py.
set -u
R=/work/ab/runs
run() {  # tag dir kind
  local tag=$1 dir=$2 kind=$3 cache=$R/cache_$1
  rm -rf "$cache"; mkdir -p "$cache"
  local start=$(date +%s) rc
  case $kind in
    qs) (cd "$dir" && PYTHONPATH=$dir MARS_CACHE_DIR=$cache python -m eval.run out_dir=$R/out_$tag summary_path=$R/$tag.json > $R/$tag.log 2>&1); rc=$? ;;
    be) (cd "$dir" && PYTHONPATH=$dir MARS_CACHE_DIR=$cache bash scripts/bench_embedded.sh $R/$tag.json num_prompts=64 max_new_tokens=128 out_dir=$R/out_$tag > $R/$tag.log 2>&1); rc=$? ;;
    b4) (cd "$dir" && PYTHONPATH=$dir MARS_CACHE_DIR=$cache python experiments/batch_check.py $R/$tag.json --prompts "${B4_PROMPTS:-32}" --tokens 64 --batches 4 --api > $R/$tag.log 2>&1); rc=$? ;;
  esac
  echo "$tag rc=$rc $(( $(date +%s) - start )) s $(date +%T)" >> $R/ab.log
}
kinds=("$@"); (( ${#kinds[@]} )) || kinds=(qs be)
for kind in "${kinds[@]}"; do
  for t in old1 new1 new2 old2; do run ${kind}_$t /work/ab/${t%?} $kind; done
done
echo done >> $R/ab.log
