#!/usr/bin/env bash
# ABBA: the quickstart at the commit (c8e073a, /work/old) and at HEAD (/work/main), fresh caches.
set -u
R=/work/runs56
for tag in old1 new1 new2 old2; do
  case $tag in old*) dir=/work/old;; new*) dir=/work/main;; esac
  cache=$R/cache_$tag; rm -rf $cache; mkdir -p $cache
  start=$(date +%s)
  (cd $dir && PYTHONPATH=$dir MARS_CACHE_DIR=$cache python -m eval.run out_dir=$R/out_$tag summary_path=$R/qs_$tag.json > $R/qs_$tag.log 2>&1)
  echo "$tag rc $? $(( $(date +%s) - start )) s" >> $R/ab.log
done
echo done >> $R/ab.log
