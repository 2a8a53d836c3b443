#!/usr/bin/env bash
# The MARS paper's main-table protocol on a real chat model on a CPU: SmolLM2-135M-Instruct (model=smollm2, its
# EAGLE-3 heads from scripts/build_smollm2.sh) on every chat benchmark of the paper that the benchmark directory
# holds: MT-bench (both turns), HumanEval (programs run in the sandbox), GSM8K, Alpaca, CNN/DM (sum), Natural
# Questions (qa), WMT19 zh->en. Per benchmark: T = 0, and T = 1 drafting both ways (the paper's top-k trees, as
# the EAGLE-3 and MARS code draft, and sampled trees). One job per benchmark and mode answers model.generate
# (float32 and bf16), vanilla, strict and MARS θ = 0.8, 0.9, 0.95 together, interleaved question by question, so
# every ratio is measured in one run. Then the report: speed against our vanilla and the fastest plain decoding,
# τ, acceptance per depth, exact TV / KL costs, task quality per benchmark, quality recovery against strict with
# its bootstrap interval and the questions it rests on, agreement with strict's answers and the target's log-
# likelihood of each method's answers (Markdown, CSV, plots), and one offline W&B run per job. A rerun answers
# nothing twice: every finished answer is kept and skipped.
#
#   scripts/main_table_smollm2.sh OUT_DIR [eval.run overrides...]
#   scripts/main_table_smollm2.sh /tmp/small              # the small setting (the defaults below)
#   NUM_PROMPTS=1000 MAX_NEW_TOKENS=256 TREE=calibrated scripts/main_table_smollm2.sh results/smollm2-full
#
# NUM_PROMPTS caps the questions per benchmark (the sets hold 79-164; small: 2); MAX_NEW_TOKENS (small: 32).
# TREE is the tree preset. Small: cpu, one fixed 20/4/5 tree for every method (only the precision is measured).
# Full: calibrated, a tree timed for strict and for each θ in each mode, cached per machine. Those 12 calibrations
# need ~2 min each to time every candidate once on the 2-core AVX2 EPYC; inside a small budget they would time
# only the first candidate or two.
# BENCHES, TEMPERATURES, THETAS override the lists (comma-separated: BENCHES=mt_bench,gsm8k); PLAIN the plain
# decodings answered beside them (default generate,vanilla; "vanilla" leaves model.generate out), EXTRA further
# baselines (EXTRA=typical@0.05), EXTRA_SAMPLED those at T = 1 only (a rule with no greedy form: EXTRA_SAMPLED=ears@0.1),
# DRAFTING T = 1's drafting modes (default topk,sample). Leaves
# OUT_DIR/runs/smollm2/<bench>/<method>-T<t>-<id>/ (answers, summary.json, config.yaml, wandb/), OUT_DIR/report.md,
# report.csv and the plots; `wandb sync OUT_DIR/runs/*/*/*/wandb/offline-run-*` uploads the W&B runs later.
# The times of both settings on this project's CPUs are in docs/real-models.md (the paper's main table on a real model).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/out_dir.sh
out="$(out_dir "usage: scripts/main_table_smollm2.sh OUT_DIR [eval.run overrides...]" "$@")"
shift
export MARS_BENCH_DIR="${MARS_BENCH_DIR:-$(cd .. && pwd)/shared/data/bench}"
IFS=, read -ra thetas <<< "${THETAS:-0.8,0.9,0.95}"
# The job's own method is MARS at the first θ; the other θs are baselines of the same job, so that all seven
# methods are timed interleaved, and the pair is loaded and warmed up once per benchmark and mode.
others=""
for theta in "${thetas[@]:1}"; do others+=",mars@$theta"; done
[[ -n "${EXTRA:-}" ]] && others+=",$EXTRA"
sampled="$others"  # rules with no greedy form (EARS) only where sampling
[[ -n "${EXTRA_SAMPLED:-}" ]] && sampled+=",$EXTRA_SAMPLED"
common=(model=smollm2 "bench=${BENCHES:-mt_bench,humaneval,gsm8k,alpaca,sum,qa,wmt19}"
        "num_prompts=${NUM_PROMPTS:-2}" "max_new_tokens=${MAX_NEW_TOKENS:-32}"
        "tree=${TREE:-cpu}"
        method=mars "method.theta=${thetas[0]}"
        logging=offline logging.group=main_table_smollm2
        "out_dir=$out/runs/\${model.name}/\${bench.name}")
start=$SECONDS
IFS=, read -ra temperatures <<< "${TEMPERATURES:-0,1}"  # one sweep per temperature
for t in "${temperatures[@]}"; do
    case "$t" in
        0) python -m eval.run -m "${common[@]}" "baselines=[${PLAIN:-generate,vanilla},strict$others]" sampling=t0 \
               "hydra.sweep.dir=$out/sweeps/t0" "$@" ;;
        1) python -m eval.run -m "${common[@]}" "baselines=[${PLAIN:-generate,vanilla},strict$sampled]" sampling=t1 \
               "tree.drafting=${DRAFTING:-topk,sample}" "hydra.sweep.dir=$out/sweeps/t1" "$@" ;;
        *) echo "TEMPERATURES holds $t: the protocol runs 0 and 1 (sampling presets t0, t1)" >&2; exit 2 ;;
    esac
done
python -m eval.report "$out/runs" --out "$out"
echo "main_table_smollm2: $((SECONDS - start)) s; report: $out/report.md"
