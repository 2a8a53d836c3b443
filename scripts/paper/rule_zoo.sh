#!/usr/bin/env bash
# Reproduces the rule zoo on the paper's models: every verification rule (strict, mars, typical, topm,
# entropy, ears) over its parameter range (eval/reporting/zoo_sweep.py SWEEP) as baselines of one strict job per model x
# bench x temperature, at T=0 and T=1 (ears at T=1 only: it has no greedy form), tree 49 / 7 / 10, on MT-bench
# and HumanEval for Vicuna-13B, LLaMA-3.1-8B, LLaMA-3.3-70B and DeepSeek-R1-Distill-LLaMA-8B (--models for
# others). 16 jobs, each answering ~20 methods per question; scripts/rule_zoo_embedded.sh is the CPU version.
#
# GPUs: as scripts/paper/main_table.sh (one 80 GB GPU per 8B/13B job, 2 x 80 GB for LLaMA-3.3-70B).
#
#   scripts/paper/rule_zoo.sh --dry-run                    # the Hydra sweeps (one per model and temperature)
#   scripts/paper/rule_zoo.sh --models llama31_8b --num-prompts 40 --launcher gpus
#
# Report: results/paper/zoo/report/report.md, zoo.json and a Pareto plot per model x bench
# (pareto_<model>_<bench>.png: speedup against KL per token at T=1, against argmax mismatch at T=0, and
# against quality where it moves), written by python -m eval.zoo.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m eval.paper zoo "$@"
