# Stage 1 of the CPU fine-tune (2026-11-28, Zen 3): 1,600 task-opener prompts written by the target (Magpie).
T=$(python -m mars.adapter.sources $(python -c 'from eval.config.schema import composed; c = composed("model=smollm2").model; print(c.target, c.target_sha256)'))
python -m eval.chat_prompts --target $T --self 0 --self-tasks 1600 --docstrings 0 --no-chatterbot --heldout 0 \
    --seed 300000 --exclude data/prompts/smollm2_heldout.jsonl data/prompts/smollm2_calibration.jsonl \
    data/prompts/smollm2_train.jsonl --batch 64 --out task_prompts.jsonl
