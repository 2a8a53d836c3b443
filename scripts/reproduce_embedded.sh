#!/usr/bin/env bash
# The paper-table pipeline for real on the embedded pair, on a CPU: a θ sweep (0.8, 0.9, 0.95) of
# MARS with strict, vanilla and model.generate as baselines, on the held-out stdlib prompts and
# HumanEval (completion prompts), at T=0 and T=1; then the report (Markdown, CSV, plots) and one
# offline W&B run per job. Under 15 minutes on 2 cores; rerunning skips every finished job.
#
#   scripts/reproduce_embedded.sh OUT_DIR [eval.run overrides...]
#   NUM_PROMPTS=4 MAX_NEW_TOKENS=16 scripts/reproduce_embedded.sh /tmp/smoke    # a quick smoke run
#
# Leaves OUT_DIR/runs/<model>/<bench>/<method>-T<t>-<id>/ (answers, summary.json, config.yaml,
# wandb/ offline runs), OUT_DIR/report.md, OUT_DIR/report.csv and OUT_DIR/*.png.
# `wandb sync OUT_DIR/runs/*/*/*/wandb/offline-run-*` uploads the W&B runs later.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/out_dir.sh
out="$(out_dir "usage: scripts/reproduce_embedded.sh OUT_DIR [eval.run overrides...]" "$@")"
shift
export MARS_BENCH_DIR="${MARS_BENCH_DIR:-$(cd .. && pwd)/shared/data/bench}"
# Every method at strict's calibrated tree for that temperature and drafting mode (tree.per_method=false): the
# theta points and strict compared at one tree, as the paper compares rules.
common=(model=embedded "bench=embedded,humaneval" "sampling=t0,t1" tree=calibrated tree.per_method=false
        "num_prompts=${NUM_PROMPTS:-10}" "max_new_tokens=${MAX_NEW_TOKENS:-64}"
        logging=offline logging.group=reproduce_embedded
        "out_dir=$out/runs/\${model.name}/\${bench.name}")
start=$SECONDS
# The sweep: the first job of each bench x temperature also answers the shared baselines.
python -m eval.run -m "${common[@]}" method=mars "method.theta=0.8,0.9,0.95" \
    "hydra.sweep.dir=$out/sweeps/theta" "$@"
# strict and vanilla as jobs of their own (their answers are there already: summaries and W&B runs).
python -m eval.run -m "${common[@]}" "method=strict,vanilla" "hydra.sweep.dir=$out/sweeps/baselines" "$@"
python -m eval.report "$out/runs" --out "$out"
echo "reproduce_embedded: $((SECONDS - start)) s; report: $out/report.md"
