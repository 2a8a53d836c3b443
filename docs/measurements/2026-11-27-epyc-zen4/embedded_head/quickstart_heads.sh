#!/usr/bin/env bash
# The quickstart (python -m eval.run, the embedded default, 12 held-out prompts x 64 tokens) with the embedded
# greedy head before and after draft item 5 (data/models/README.md), alternated new old old new, each from an
# empty MARS_CACHE_DIR (calibration included). OLD: a copy of the head before (git show 598ef00:data/models/draft/...).
#   bash quickstart_heads.sh OUT_DIR OLD_HEAD_DIR
set -u
out=$1; old=$2
mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
for tag in new1 old1 old2 new2; do
  case $tag in old*) draft=(model.draft="$old");; new*) draft=();; esac
  cache="$out/cache_$tag"; rm -rf "$cache"; mkdir -p "$cache"
  start=$(date +%s)
  MARS_CACHE_DIR="$cache" python -m eval.run "${draft[@]}" out_dir="$out/out_$tag" summary_path="$out/qs_$tag.json" \
      > "$out/qs_$tag.log" 2>&1
  echo "$tag rc $? $(( $(date +%s) - start )) s" >> "$out/ab.log"
done
