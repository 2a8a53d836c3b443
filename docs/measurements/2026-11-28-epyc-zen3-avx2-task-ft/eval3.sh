cd /work/main
T=/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e
H=/work/s63/ft/draft/final; W=/work/s63/ft
python docs/measurements/2026-11-28-h100/mtbench_tau_heads.py $W/tau_ft.json --questions 8 --new-tokens 256 \
    --trees 4/4/1 8/4/2 --heads $H --dtype float32 --by-category > $W/tau.log 2>&1; date
python -m eagle.train.evaluate --target $T --draft $H --prompts data/prompts/smollm2_heldout.jsonl --sequences 64 \
    --gen-temperature 1 --seq-len 256 --dtype float32 --sequences-cache $W/heldout_t1.pt --out $H/eval_heldout_t1.json > $W/heldout_t1.log 2>&1; date
