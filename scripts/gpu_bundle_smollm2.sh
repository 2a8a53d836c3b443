#!/usr/bin/env bash
# The SmolLM2 head build on a remote GPU machine that reaches no package registry and takes at most 64 MiB of
# files per transfer (the device tool's limit), in three steps:
#
#   here:   bash scripts/gpu_bundle_smollm2.sh pack .gpu        # .gpu0/ and .gpu1/: the GGUF's two parts
#                                                               # (< 48 MiB each), its sha256, the wheels the
#                                                               # machine's image lacks, the prompts
#   there:  bash scripts/gpu_bundle_smollm2.sh build .gpu0 OUT --stash   # first call: part 0 to the disk
#   there:  bash scripts/gpu_bundle_smollm2.sh build .gpu1 OUT  # second call: joins and checks the GGUF, installs
#                                                               # the wheels, runs scripts/build_smollm2.sh
#                                                               # --device cuda, writes the bf16 head to OUT in
#                                                               # files <= 15 MiB, with the build's log
#   here:   bash scripts/gpu_bundle_smollm2.sh unpack OUT DIR   # joins the head's files into DIR
#
# The second call must reach the machine while it is still warm (30 s after the first). Add `/.gpu0/` and
# `/.gpu1/` to `git rev-parse --git-path info/exclude` so that the parts travel only when carried, and move the
# embedded models' weights out of the tree for the calls (84 MB tracked; 64 MiB travel). The wheels: gguf (the
# GGUF reader), hydra-core, omegaconf and antlr4 (eval's config, which the build reads its model spec from).
# PROMPTS=FILE packs a prompts file (stage 1's output; default data/prompts/smollm2_train.jsonl: the shipped
# head's 2,600 prompts, then 4,499 the target wrote on a lent H200) so the machine skips writing its own;
# MORE_PROMPTS=N has the target write N more there (Magpie, MORE_PROMPTS_SEED; the benchmark questions travel
# with the bundle for the overlap rule) and brings them back. GEN_MINUTES bounds the answering; BUILD_MINUTES (whole minutes) the whole call: training's
# schedule is shortened to end, learning rate cooled, EXPORT_SECONDS (60) before it (DRAFT_DEADLINE), so the head
# comes back inside the machine's limit whatever the earlier stages took. DRAFT_MINUTES stops training outright.
# On a CPU the same steps run at a tiny size first: TINY=1 asks the build for a few prompts (no chatterbot
# ones), short answers and one or two steps. ANSWER_RATE=N ends the call by timing the answering paths on N prompts.
set -euo pipefail
here="$PWD"
absolute() { [[ "$1" = /* ]] && echo "$1" || echo "$here/$1"; }   # paths as the caller gave them, before the cd
cd "$(dirname "$0")/.."
part_size=$((47 * 1024 * 1024))
head_part=$((15 * 1024 * 1024))

case "${1:-}" in
pack)
    gguf_sha=$(python -c 'from eval.config.schema import composed; print(composed("model=smollm2").model.target_sha256)')
    dir=$(absolute "$2"); rm -rf "$dir"0 "$dir"1; mkdir -p "$dir"0/wheels
    gguf=$(python -c 'from eval.config.schema import composed; from mars.adapter.sources import gguf_file
print(gguf_file(composed("model=smollm2").model.target))')
    split -b "$part_size" -d -a 1 "$gguf" "$dir"0/gguf.part
    echo "$gguf_sha  $(basename "$gguf")" > "$dir"0/gguf.sha256
    basename "$gguf" > "$dir"0/gguf.name
    # the versions installed here; `pip wheel` builds antlr4's, which is published as a source archive only
    pins=$(python -c 'import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("gguf", "hydra-core", "omegaconf", "antlr4-python3-runtime")))')
    python -m pip wheel --quiet --no-deps -w "$dir"0/wheels $pins
    prompts="${PROMPTS:+$(absolute "$PROMPTS")}"
    cp "${prompts:-data/prompts/smollm2_train.jsonl}" "$dir"0/prompts.jsonl
    # the benchmark questions (2.4 MB), so prompts written there are checked for overlap as here (MORE_PROMPTS)
    bench=$(python -c 'from eval.config.paths import bench_path; print(bench_path(""))')
    mkdir -p "$dir"0/bench && cp "$bench"/* "$dir"0/bench/
    cp -r "$dir"0 "$dir"1
    mv "$dir"0/gguf.part1 "$dir"1/ && rm "$dir"1/gguf.part0
    ls -l "$dir"0 "$dir"1 "$dir"0/wheels
    ;;
build)
    dir=$(absolute "$2"); out=$(absolute "$3"); stash="${STASH:-/tmp/mars-gpu-bundle}"
    # BUILD_MINUTES: the whole call's wall time. Training's schedule is fitted to end (cooled) EXPORT_SECONDS
    # before it, whatever the prompts, answers and features took, so the head comes back inside the call's limit.
    [[ -n "${BUILD_MINUTES:-}" ]] && export DRAFT_DEADLINE=$(( $(date +%s) + ${BUILD_MINUTES%.*} * 60 - ${EXPORT_SECONDS:-60} ))
    mkdir -p "$stash" "$out"
    cp -n "$dir"/gguf.part* "$dir"/gguf.sha256 "$dir"/gguf.name "$stash"/ 2>/dev/null || true
    [[ "${4:-}" == --stash ]] && { ls -l "$stash"; exit 0; }
    name=$(cat "$stash/gguf.name")
    cat "$stash"/gguf.part* > "$stash/$name"
    (cd "$stash" && sha256sum -c gguf.sha256)
    gguf_sha=$(cut -d' ' -f1 "$stash/gguf.sha256")
    python -c "import gguf, hydra" 2>/dev/null || {
        python -m pip install -q --no-index --no-deps --target /tmp/site "$dir"/wheels/*.whl
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    }
    if [[ "${TINY:-0}" == 1 ]]; then
        export SELF_PROMPTS=4 DOCSTRING_PROMPTS=4 CHATTERBOT=0 DRAFT_EPOCHS=0.5 SEQ_LEN=48 GEN_BATCH=8 BATCH=2 \
            SAVE_EVERY=1
    fi
    device=cuda; python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || device=cpu
    runs="${RUNS:-runs/smollm2}"
    [[ -s "$dir/prompts.jsonl" && ! -s "$runs/prompts.jsonl" ]] && { mkdir -p "$runs"; cp "$dir/prompts.jsonl" "$runs/"; }
    # MORE_PROMPTS=N: N more self-written prompts (Magpie, other seeds than stage 1's) beside the carried ones,
    # none shared with them, the held-out or calibration prompts, or a benchmark question; written once
    if [[ "${MORE_PROMPTS:-0}" -gt 0 && -s "$runs/prompts.jsonl" && ! -s "$runs/more_prompts.jsonl" ]]; then
        target=$(python -m mars.adapter.sources "$stash/$name" "$gguf_sha")
        python -m eval.chat_prompts --target "$target" --self "$MORE_PROMPTS" --docstrings 0 --no-chatterbot \
            --heldout 0 --seed "${MORE_PROMPTS_SEED:-1}" --bench-dir "$dir/bench" --device "$device" \
            --batch "${GEN_BATCH:-256}" --exclude "$runs/prompts.jsonl" data/prompts/smollm2_heldout.jsonl \
            data/prompts/smollm2_calibration.jsonl --out "$runs/more_prompts.jsonl.tmp" 2>&1 | tee -a "$out/build.log"
        mv "$runs/more_prompts.jsonl.tmp" "$runs/more_prompts.jsonl"
        # the new prompts come back (~1 MB): later prompt sets there must not share one with them
        cp "$runs/more_prompts.jsonl" "$runs/more_prompts.jsonl.tmp.stats.json" "$out/"
        cat "$runs/more_prompts.jsonl" >> "$runs/prompts.jsonl"
    fi
    python -c "import wandb" 2>/dev/null || export WANDB_MODE_DRAFT=off   # W&B is not on every GPU image
    set -o pipefail
    TARGET_GGUF="$stash/$name" bash scripts/build_smollm2.sh --device "$device" --train-only "$runs" 2>&1 \
        | tee -a "$out/build.log"
    # the head as it ships (bf16, the target's embedding left out: ~20 MB), then cut to the transfer's file size
    target=$(python -m mars.adapter.sources "$stash/$name" "$gguf_sha")
    rm -rf "$stash/export"
    python -m eagle.train.export --target "$target" --draft "$runs/draft/final" --out "$stash/export" \
        --heads-only
    for f in "$stash/export/draft"/*; do
        if [[ $(stat -c %s "$f") -gt $head_part ]]; then
            split -b "$head_part" -d -a 1 "$f" "$out/$(basename "$f").part"
        else
            cp "$f" "$out/"
        fi
    done
    cp "$runs/draft/final/training_summary.json" "$out/"
    # ANSWER_RATE=N: then time the answering paths on N of the prompts (experiments/answer_rate.py, GPU batch sizes)
    if [[ "${ANSWER_RATE:-0}" -gt 0 ]]; then
        PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" timeout "${ANSWER_RATE_SECONDS:-120}" python experiments/answer_rate.py --target "$target" --device "$device" \
            --prompts "$runs/prompts.jsonl" --count "$ANSWER_RATE" --configs ${ANSWER_RATE_CONFIGS:-continuous:bfloat16:256 \
            continuous:bfloat16:1024 generate:bfloat16:256} --out "$out/answer_rate.json" 2>&1 | tee "$out/answer_rate.log" \
            || echo "answer rate: stopped (limit or error), rows so far in $out/answer_rate.log"
    fi
    ls -l "$out"
    ;;
unpack)
    src=$(absolute "$2"); dest=$(absolute "$3"); mkdir -p "$dest"
    for f in "$src"/*; do
        case "$f" in
            *.part0) cat "${f%.part0}".part* > "$dest/$(basename "${f%.part0}")" ;;
            *.part[1-9]) ;;
            *) cp "$f" "$dest/" ;;
        esac
    done
    ls -l "$dest"
    ;;
*)
    echo "usage: $0 pack DIR | build DIR OUT [--stash] | unpack OUT DIR" >&2
    exit 2
    ;;
esac
