#!/usr/bin/env bash
# Reproduces the MARS paper's draft-depth ablation: strict and MARS theta=0.9 at draft depth K = 6, 9, 12, 15
# (tree.depth=K, 49 nodes and 10 children as the paper preset), Qwen3-32B on GSM8K at T=0.2. 4 jobs.
#
# GPUs: ~64 GB of bf16 weights per job: one 80 GB GPU, or 2 x 40-48 GB (model.device_map=auto).
#
#   scripts/paper/depth_ablation.sh --dry-run
#   scripts/paper/depth_ablation.sh --launcher slurm -- hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=2
#
# Table: results/paper/depth/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper depth "$@"
