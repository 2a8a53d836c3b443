# After gen.py: merge, features + continued fine-tune from the s63 head (deadline 02:30 UTC), then MT-bench tau and held-out.
set -uo pipefail
cd /work/main
T=/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e
W=/work/s66/ft; H=$W/draft/final
while kill -0 $(cat /work/s66/gen.pid) 2>/dev/null; do sleep 20; done
date; [ -s $W/new_sequences.pt ] || { echo "no new sequences"; exit 1; }
[ -d $W/data ] || python /work/s66/merge.py
date
python -m eagle.train.draft --target $T --data-dir $W/data --seq-len 384 --collect-batch 8 --draft-vocab-size 8192 \
    --out $W/draft --batch 8 --epochs 3 --deadline 1795919400 --pack --ttt-steps 5 --ttt-curriculum 2:0.75 \
    --lr 3e-4 --warmup 20 --save-every 50 --eval-sequences 0 --wandb off --init /work/s63/ft/draft/final \
    > $W/train.log 2>&1
date
python docs/measurements/2026-11-28-h100/mtbench_tau_heads.py $W/tau_ft2.json --questions 8 --new-tokens 256 \
    --trees 4/4/1 8/4/2 --heads $H --dtype float32 --by-category > $W/tau.log 2>&1; date
cp /work/s63/ft/heldout_t0.pt /work/s63/ft/heldout_t1.pt $W/
for t in 0 1; do
    tau=(); [[ "$t" == 0 ]] && tau=(--offline-tau 5:4:16)
    python -m eagle.train.evaluate --target $T --draft $H --prompts data/prompts/smollm2_heldout.jsonl --sequences 64 \
        --gen-temperature $t --seq-len 256 --dtype float32 --sequences-cache $W/heldout_t$t.pt "${tau[@]}" \
        --out $H/eval_heldout_t$t.json > $W/heldout_t$t.log 2>&1
    date
done
echo PIPELINE DONE
