#!/usr/bin/env bash
# Reproduces the MARS paper's main table at T=0 (greedy): speedup and tau of EAGLE-3 (strict) and MARS
# theta=0.9 on MT-bench, HumanEval, GSM8K, Alpaca and CNN/DM for Vicuna-13B, LLaMA-3.1-8B, LLaMA-3.3-70B and
# DeepSeek-R1-Distill-LLaMA-8B (arXiv 2601.15498). 20 jobs.
#
# GPUs: as scripts/paper/main_table.sh (one 80 GB GPU per 8B/13B job, 2 x 80 GB for LLaMA-3.3-70B).
#
#   scripts/paper/main_table_t0.sh --dry-run
#   MARS_GPUS=4 scripts/paper/main_table_t0.sh --launcher gpus --models vicuna13b,llama31_8b
#
# Table: results/paper/main_t0/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper main_t0 "$@"
