#!/usr/bin/env bash
# The rule zoo on the embedded pair (data/models/{target,draft}), on a CPU: every verification rule swept
# over its parameter range (eval/reporting/zoo_sweep.py SWEEP, and why: mars theta 0.98-0.6, typical epsilon 0.5-0.15 at
# delta 100 then Medusa's 0.09 / 0.3, topm (m, alpha) (2, 0.7)-(3, 0.2), entropy h 5-1 nats, ears beta
# 0.05-0.6) at temperature 0 and 1 (ears at 1 only: it has no greedy form). One eval.run job per temperature: strict
# with model.generate (float32 and bf16), vanilla and every other rule point as baselines, all answered
# question by question in one process, so every speed ratio of a temperature comes from one run. Then
# the report: OUT/report.md (a table per temperature), OUT/pareto.png (speedup over the fastest plain
# decoding against KL per token at T=1, against argmax mismatch at T=0, against quality where it moves;
# every rule on it, its Pareto front drawn) and OUT/zoo.json.
#
#   bash scripts/rule_zoo_embedded.sh OUT [eval.run overrides...]
#   NUM_PROMPTS=4 MAX_NEW_TOKENS=16 bash scripts/rule_zoo_embedded.sh /tmp/zoo-smoke     # a quick smoke run
#   DRAFTING=both bash scripts/rule_zoo_embedded.sh OUT      # T=1 on top-k and on sampled drafts, one figure
#
# Drafting at T=1 (DRAFTING; greedy always drafts the head's top-k):
#   unset        the run's tree.drafting (auto: calibration chooses top-k or sampled children)
#   topk|sample  tree.drafting=topk or tree.drafting=sample
#   both         the T=1 job twice: tree.drafting=topk (OUT/summary_t1.json, answers under OUT/runs) and
#                tree.drafting=sample (OUT/summary_t1_sampled.json, under OUT/runs-sampled: its own run
#                directories, so that its plain decoding is timed again interleaved with its own methods and
#                its speed ratios, like the top-k job's, come from one run). The report then has a table per
#                drafting mode at T=1 and one T=1 panel with both Pareto fronts (top-k drafts filled,
#                sampled drafts hollow); costs on sampled drafts are upper bounds, marked "≤". About 9 more
#                minutes than the default at the budget below.
#
# Budget: 16 held-out prompts x 96 tokens per method (NUM_PROMPTS, MAX_NEW_TOKENS), so that a fresh clone
# takes <= 30 minutes on 2 cores: ~3 min setup (scripts/setup.sh), then here ~2 min of one-time tree
# calibration (greedy and sampled, cached in ~/.cache/mars-spec/trees), ~1 min of model loading and
# warm-up, and the decoding: 20 methods at T=0 and 24 at T=1, each 1,536 tokens at most; at this CPU
# class's rates (plain decoding ~50-65 tok/s, speculative ~90-100 greedy and ~45-70 sampled) that is
# ~4.5 min at T=0 and ~8-9 min at T=1. Measured: see docs/evaluation.md (the rule zoo). Threads: all cores.
#
# Leaves OUT/runs/<method>-T<t>-<id>/ (answers, and the job's summary.json in strict's), the jobs'
# summaries OUT/summary_t0.json and OUT/summary_t1.json (+ OUT/runs-sampled/ and OUT/summary_t1_sampled.json
# with DRAFTING=both), OUT/report.md, OUT/pareto.png, OUT/zoo.json.
# Rerunning resumes: finished answers are kept, and a finished job only rewrites its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/out_dir.sh
out="$(out_dir "usage: scripts/rule_zoo_embedded.sh OUT [eval.run overrides...]" "$@")"
shift
start=$SECONDS
case "${DRAFTING:-}" in
    "") t1_drafting=() ;;
    topk|sample) t1_drafting=("tree.drafting=$DRAFTING") ;;
    both) t1_drafting=(tree.drafting=topk) ;;
    *) echo "rule_zoo_embedded: DRAFTING must be topk, sample or both, got '$DRAFTING'" >&2; exit 2 ;;
esac
# The sweep lives in eval/reporting/zoo_sweep.py: its eval.run baselines=[...] value at T=0 (first line) and T=1.
lists="$(python -m eval.zoo --baselines 0 1)"
# Every rule at strict's calibrated tree for that temperature and drafting mode (tree.per_method=false), as the
# paper compares rules: their tau and speed are comparable with strict's, which is on every panel.
common=(model=embedded bench=embedded method=strict tree=calibrated tree.per_method=false "num_prompts=${NUM_PROMPTS:-16}"
        "max_new_tokens=${MAX_NEW_TOKENS:-80}")
python -m eval.run "${common[@]}" sampling=t0 "baselines=${lists%%$'\n'*}" "out_dir=\"$out/runs\"" \
    "summary_path=\"$out/summary_t0.json\"" "$@"
python -m eval.run "${common[@]}" sampling=t1 "baselines=${lists##*$'\n'}" "out_dir=\"$out/runs\"" \
    ${t1_drafting[@]+"${t1_drafting[@]}"} "summary_path=\"$out/summary_t1.json\"" "$@"
summaries=("$out/summary_t0.json" "$out/summary_t1.json")
if [[ "${DRAFTING:-}" == both ]]; then
    python -m eval.run "${common[@]}" sampling=t1 "baselines=${lists##*$'\n'}" tree.drafting=sample \
        "out_dir=\"$out/runs-sampled\"" "summary_path=\"$out/summary_t1_sampled.json\"" "$@"
    summaries+=("$out/summary_t1_sampled.json")
fi
python -m eval.zoo "${summaries[@]}" --out "$out"
echo "rule_zoo_embedded: $((SECONDS - start)) s; report: $out/report.md, plot: $out/pareto.png"
