#!/bin/bash
# As run (2026-11-28, one after another on an idle 2-core Zen 3): 'before' from a worktree of 5d30c8f
# (git worktree add /tmp/base 5d30c8f; cd /tmp/base; python .../rate.py ...), the rest from this commit's tree
# (the 'cache only' figure from the tree before packing was added to answer_prompts: PACK unset gives it here).
set -e
export PROMPTS=data/prompts/smollm2_train.jsonl
D=docs/measurements/2026-11-28-epyc-zen3-avx2-answering
python $D/rate.py /tmp/r_cache64.json 256
PACK=1 python $D/rate.py /tmp/r_pack64.json 256
PACK=1 B=128 python $D/rate.py /tmp/r_pack128.json 256
mkdir -p /tmp/feat && ANSWERS=/tmp/r_pack64.json python $D/feat.py /tmp/feat 128
