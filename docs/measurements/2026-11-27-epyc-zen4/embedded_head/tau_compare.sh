#!/bin/bash
# strict greedy tau (no timing) of the shipped and the new embedded head on the 64 held-out prompts x 128 tokens
# usage: tau_compare.sh NEW_HEAD_DIR OUT_DIR [OLD_HEAD_DIR]  (the shipped run: OLD = the head before, git show 598ef00:data/models/draft/...)
cd "$(dirname "$0")/../../../.."
new=$1; old=${3:-data/models/draft}; out=$2; mkdir -p "$out"
for tree in 6/6/1 8/8/1 12/4/3 20/4/5; do
  IFS=/ read t d b <<< "$tree"
  for name in old new; do
    head=$old; [ $name = new ] && head=$new
    python -m eval.tau --target data/models/target --draft "$head" --prompts-jsonl data/prompts/stdlib_heldout.jsonl \
      --prompts 64 --new-tokens 128 --total-tokens $t --depth $d --branching $b --dtype bfloat16 --no-timing \
      > "$out/tau_${name}_${t}x${d}x${b}.log" 2>&1
    echo "$tree $name $(grep -i -E 'tau|accept' "$out/tau_${name}_${t}x${d}x${b}.log" | tail -2 | tr '\n' ' ')"
  done
done
