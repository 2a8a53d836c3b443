#!/usr/bin/env bash
# Issue 48's must-show: the old recipe's full schedule beside the new recipe's 1000-step run, one thread each,
# same data (runs48: 1,400 answers of 700 prompts), same CPU, at the same time. Resumable: rerun continues.
set -uo pipefail
cd /work/main
T=/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e
D=/work/runs48; R=/work/runs57
n=$(wc -l < $D/train_prompts.jsonl)
common=(--target $T --data-jsonl $D/train_prompts.jsonl --data-dir $D/data --generate --gen-each --gen-temperature 0 1
        --loop-cap --gen-batch 64 --seq-len 384 --max-tokens $((n * 384)) --draft-vocab-size 8192
        --eval-sequences 0 --wandb off --save-every 25 --log-every 10)
OMP_NUM_THREADS=1 python -m eagle.train.draft "${common[@]}" --batch 8 --ttt-steps 5 --lr 5e-4 --steps 768 \
    --out $R/old_768 >> $R/old_768.log 2>&1 &
OMP_NUM_THREADS=1 python -m eagle.train.draft "${common[@]}" --batch 2 --pack --ttt-steps 5 --ttt-curriculum 2:0.75 \
    --lr 1e-3 --warmup 50 --steps 1000 --out $R/new_1000 >> $R/new_1000.log 2>&1 &
wait
echo "SIDE DONE $(date)"
