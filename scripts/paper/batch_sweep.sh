#!/usr/bin/env bash
# Reproduces the batching study (not in the paper: what MARS is worth when requests share the GPU):
# strict and MARS theta = 0.8, 0.9 at batch sizes 1, 8, 32, 64 (batch_size=B: generate_batch, every
# baseline batched too: model.generate left-padded, vanilla_batch), LLaMA-3.1-8B and Qwen3-8B on
# MT-Bench and GSM8K, greedy. 32 jobs; each job's tree is its config's (tree=paper), or add
# `-- tree=calibrated` to time the trees at each batch size first.
#
# GPUs: one 40-80 GB GPU per job (8B in bf16: ~10 GB of KV cache at batch 64 x 1024 new tokens).
#
#   scripts/paper/batch_sweep.sh --dry-run
#   scripts/paper/batch_sweep.sh --launcher slurm -- hydra.launcher.partition=gpu
#
# Report: results/paper/batch/report/report.md, with throughput and speedup against the batch size
# (batch_<model>_<bench>_T0.png).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper batch "$@"
