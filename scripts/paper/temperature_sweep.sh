#!/usr/bin/env bash
# Reproduces a temperature sweep of strict and MARS theta=0.9 at T = 0, 0.2, 0.5, 0.8, 1.0, Qwen3-8B on
# HumanEval and WMT19 (the MARS release's scripts run 0, 0.2 and 1.0; the sweep adds 0.5 and 0.8). 10 jobs.
#
# GPUs: one 40-80 GB GPU per job (Qwen3-8B, bf16).
#
#   scripts/paper/temperature_sweep.sh --dry-run
#   MARS_TARGET_QWEN3_8B=/m/Qwen3-8B MARS_DRAFT_QWEN3_8B=/m/Qwen3-8B_eagle3 scripts/paper/temperature_sweep.sh
#
# Table: results/paper/temperature/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper temperature "$@"
