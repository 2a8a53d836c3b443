#!/usr/bin/env bash
# Rebuild the embedded default pair from scratch on this machine (CPU, no downloads):
#   1. tokenizer + target: a 14-layer Llama trained on the stdlib train split   (~80 min on 2 cores)
#   2. EAGLE-3 draft head trained against it with training-time test            (~30 min)
#   3. export both to data/models/{target,draft} and check the pair loads        (seconds)
#   4. the held-out prompt set data/prompts/stdlib_heldout.jsonl
# Every stage resumes when rerun (runs/ keeps checkpoints), so an interruption loses little.
#
#   scripts/build_embedded.sh [RUNS_DIR]        (default: runs/)
# Smoke test of the whole chain in ~10 minutes, without touching the shipped pair:
#   TARGET_MINUTES=1 DRAFT_MINUTES=1 DRAFT_MAX_TOKENS=20000 EXPORT_DIR=/tmp/pair PROMPTS_OUT=/tmp/p.jsonl \
#       scripts/build_embedded.sh /tmp/runs
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-runs}"
target_minutes="${TARGET_MINUTES:-80}"
draft_minutes="${DRAFT_MINUTES:-24}"
draft_max_tokens="${DRAFT_MAX_TOKENS:-1000000}"
export_dir="${EXPORT_DIR:-data/models}"
prompts_out="${PROMPTS_OUT:-data/prompts/stdlib_heldout.jsonl}"

python -m eagle.train.target_lm --out "$runs/target" --minutes "$target_minutes" --steps 5000 \
    --warmup 80 --seq 512 --batch 8 --lr 1.5e-3 --save-every 25

mkdir -p "$runs/draft/data"
# The draft trains on the same tokenised stdlib splits as the target (no second tokenisation).
cp -n "$runs/target/cache/train.pt" "$runs/draft/data/stdlib_train.pt"
cp -n "$runs/target/cache/heldout.pt" "$runs/draft/data/stdlib_heldout.pt"
python -m eagle.train.draft --target "$runs/target/final" --out "$runs/draft" --seq-len 512 \
    --max-tokens "$draft_max_tokens" --draft-vocab-size 2048 --batch 4 --epochs 2 --ttt-steps 3 --lr 1e-3 \
    --warmup 30 --save-every 100 --minutes "$draft_minutes" --eval-sequences 32 \
    --wandb "${WANDB_MODE_DRAFT:-offline}"

python -m eval.tau --target "$runs/target/final" --draft "$runs/draft/final" --prompts 8 \
    --update "$runs/draft/final/eval.json"

python -m eagle.train.export --target "$runs/target/final" --draft "$runs/draft/final" --out "$export_dir"
python -m eval.prompts --tokenizer "$export_dir/target" --out "$prompts_out"
