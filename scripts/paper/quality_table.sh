#!/usr/bin/env bash
# Reproduces the MARS paper's quality table: task quality of strict verification and MARS theta=0.9 and
# MARS's quality recovery (MARS / strict) at T=1 on HumanEval (pass@1), GSM8K (accuracy), WMT19 zh-en (BLEU),
# CNN/DM (ROUGE) and MT-bench (agreement with vanilla; LLM judge when MARS_JUDGE_URL is set),
# for Vicuna-13B, LLaMA-3.1-8B, LLaMA-3.3-70B and DeepSeek-R1-Distill-LLaMA-8B (arXiv 2601.15498). 20 jobs.
#
# GPUs: as scripts/paper/main_table.sh. Needs HumanEval.jsonl.gz next to the question files (unit tests).
#
#   scripts/paper/quality_table.sh --dry-run
#   scripts/paper/quality_table.sh --out results/paper/main    # reuse the main table's answers (same settings):
#                                                              # finished jobs are skipped, WMT19 is added
#
# Table: results/paper/quality/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper quality "$@"
