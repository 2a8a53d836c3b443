#!/usr/bin/env bash
# The MARS paper's claim on the real pair at a size that decides (docs/real-models.md): SmolLM2-135M-Instruct
# with its shipped head on every question of the reference sets shipped in the benchmark directory (Alpaca 80,
# CNN/DM 80) and MT-bench's 80 first turns, 128 new tokens, at T = 0 and T = 1 (top-k trees, as the paper
# drafts), in two phases of scripts/main_table_smollm2.sh:
#   quality: vanilla, strict, MARS θ = 0.8 / 0.9 / 0.95 and EARS (T = 1 only: it has no greedy form), every
#            method drafting strict's calibrated tree for the temperature (tree.per_method=false; calibrated on
#            the model's own chat prompts, as no question is spare), strict greedy checked against plain
#            decoding at the tree's kernels on every question (exactness_checks=null);
#   speed:   each set's first 24 questions with the tree calibrated for each method (the speed a user gets) and
#            model.generate in every precision, in run directories of their own, timed interleaved per question.
# Every finished answer is kept: a rerun (or a run stopped and started again) answers nothing twice. About 370k
# generated tokens in the quality phase and 170k in the speed phase: 13.5 hours on 2 cores as measured (calibrations
# of 2-22 min per run included; docs/real-models.md). QUALITY_PROMPTS,
# SPEED_PROMPTS, MAX_NEW_TOKENS, TREE, BENCHES and TEMPERATURES change the sizes (a smoke test's).
#   scripts/quality_table_smollm2.sh OUT_DIR [eval.run overrides...]   # PHASES=quality or =speed: one of them
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/out_dir.sh
out="$(out_dir "usage: scripts/quality_table_smollm2.sh OUT_DIR [eval.run overrides...]" "$@")"
shift
export BENCHES="${BENCHES:-alpaca,sum,mt_bench}" THETAS=0.8,0.9,0.95 EXTRA_SAMPLED=ears@0.1 DRAFTING=topk
export MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-128}" TREE="${TREE:-calibrated}"
IFS=, read -ra phases <<< "${PHASES:-quality,speed}"
for phase in "${phases[@]}"; do
    case "$phase" in
        # The quality phase's speeds are not the table's (the speed phase's are): an answer that another process, or
        # the hypervisor's steal, slowed is not answered again (MARS_FOREIGN_LOAD=off), which on a shared host
        # would cost up to three answers and two minutes of waiting per question.
        quality) MARS_FOREIGN_LOAD=off NUM_PROMPTS="${QUALITY_PROMPTS:-80}" PLAIN=vanilla \
                     bash scripts/main_table_smollm2.sh "$out/quality" \
                     bench.max_turns=1 tree.per_method=false tree.calibration_prompts=model exactness_checks=null "$@" ;;
        speed) NUM_PROMPTS="${SPEED_PROMPTS:-24}" bash scripts/main_table_smollm2.sh "$out/speed" bench.max_turns=1 \
                   "$@" ;;
        *) echo "PHASES holds $phase: the phases are quality and speed" >&2; exit 2 ;;
    esac
done
