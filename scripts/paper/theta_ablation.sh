#!/usr/bin/env bash
# Reproduces the MARS paper's theta ablation: speedup, tau and quality of MARS for theta = 0.84, 0.86, ..., 0.98
# against strict and vanilla, Qwen3-8B on HumanEval and WMT19 at T=0.2 (the paper's Qwen3 temperature).
# 8 theta x 2 benchmarks = 16 MARS jobs; strict and vanilla are answered once per benchmark and shared.
#
# GPUs: one 40-80 GB GPU per job (Qwen3-8B, bf16).
#
#   scripts/paper/theta_ablation.sh --dry-run
#   MARS_GPUS=8 scripts/paper/theta_ablation.sh --launcher gpus
#   scripts/paper/theta_ablation.sh -- sampling=t1           # the same sweep at T=1
#
# Table and theta plots: results/paper/theta/report/.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper theta "$@"
