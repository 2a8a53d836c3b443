#!/usr/bin/env bash
# Reproduces the MARS paper's main table (Song et al., Findings of ACL 2026, arXiv 2601.15498): speedup
# over vanilla decoding and tau (tokens per draft-verify cycle) of EAGLE-3 (strict verification) and MARS
# theta=0.9 at T=1, tree 49 nodes / depth 7 / 10 children, on MT-bench, HumanEval, GSM8K, Alpaca and CNN/DM,
# for Vicuna-13B, LLaMA-3.1-8B, LLaMA-3.3-70B and DeepSeek-R1-Distill-LLaMA-8B (--models for others). 20 jobs.
#
# GPUs: one 80 GB GPU per job for the 8B/13B targets; LLaMA-3.3-70B (fp16, ~140 GB) shards over 2 x 80 GB
# (model.device_map=auto). Parallel jobs: --launcher gpus (MARS_GPUS at a time) or --launcher slurm.
#
#   scripts/paper/main_table.sh --dry-run                 # the Hydra sweeps, the 20 jobs, the report command
#   MARS_MODELS_DIR=/models scripts/paper/main_table.sh --launcher slurm -- hydra.launcher.partition=gpu
#   scripts/paper/main_table.sh --models llama31_8b --target /m/Llama-3.1-8B-Instruct --draft /m/EAGLE3-LLaMA3.1-8B
#
# Table: results/paper/main/report/report.md (--out DIR to change). Options: python -m eval.paper --help.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper main "$@"
