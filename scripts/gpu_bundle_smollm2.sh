#!/usr/bin/env bash
# The SmolLM2 head build on a remote GPU machine that reaches no package registry and takes at most 64 MiB of
# files per transfer (the device tool's limit), in three steps:
#
#   here:   bash scripts/gpu_bundle_smollm2.sh pack .gpu        # .gpu/: the GGUF in two parts (< 48 MiB each),
#                                                               # its sha256, the gguf reader as a wheel
#   there:  bash scripts/gpu_bundle_smollm2.sh build .gpu OUT   # joins and checks the GGUF, installs the wheel,
#                                                               # runs scripts/build_smollm2.sh --device cuda,
#                                                               # writes the bf16 head to OUT in files <= 15 MiB
#   here:   bash scripts/gpu_bundle_smollm2.sh unpack OUT DIR   # joins the head's files into DIR
#
# Two transfers carry the GGUF: the first call carries .gpu with part 0 (`carry: [.gpu]`) and copies it to the
# machine's disk (`... build .gpu OUT --stash`), the second carries part 1 and builds. Add `/.gpu/` to
# `git rev-parse --git-path info/exclude` so that the parts travel only when carried. On a CPU the same steps run at a tiny size
# first: TINY=1 asks the build for a few prompts (no chatterbot ones), short answers and one or two steps.
set -euo pipefail
here="$PWD"
absolute() { [[ "$1" = /* ]] && echo "$1" || echo "$here/$1"; }   # paths as the caller gave them, before the cd
cd "$(dirname "$0")/.."
part_size=$((47 * 1024 * 1024))
head_part=$((15 * 1024 * 1024))
gguf_sha=$(python -c 'from eval.config.schema import composed; print(composed("model=smollm2").model.target_sha256)')

case "${1:-}" in
pack)
    dir=$(absolute "$2"); mkdir -p "$dir/wheels"
    gguf=$(python -c 'from eval.config.schema import composed; from mars.adapter.sources import gguf_file
print(gguf_file(composed("model=smollm2").model.target))')
    split -b "$part_size" -d -a 1 "$gguf" "$dir/gguf.part"
    echo "$gguf_sha  $(basename "$gguf")" > "$dir/gguf.sha256"
    basename "$gguf" > "$dir/gguf.name"
    version=$(python -c 'import importlib.metadata as m; print(m.version("gguf"))')
    python -m pip download --quiet --no-deps --only-binary=:all: -d "$dir/wheels" "gguf==$version"
    ls -l "$dir" "$dir/wheels"
    ;;
build)
    dir=$(absolute "$2"); out=$(absolute "$3"); stash="${STASH:-/tmp/mars-gpu-bundle}"
    mkdir -p "$stash" "$out"
    cp -n "$dir"/gguf.part* "$dir"/gguf.sha256 "$dir"/gguf.name "$stash"/ 2>/dev/null || true
    [[ "${4:-}" == --stash ]] && { ls -l "$stash"; exit 0; }
    name=$(cat "$stash/gguf.name")
    cat "$stash"/gguf.part* > "$stash/$name"
    (cd "$stash" && sha256sum -c gguf.sha256)
    python -c "import gguf" 2>/dev/null || {
        python -m pip install -q --no-index --no-deps --target /tmp/site "$dir"/wheels/*.whl
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    }
    device=cuda; python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || device=cpu
    if [[ "${TINY:-0}" == 1 ]]; then
        export SELF_PROMPTS=4 DOCSTRING_PROMPTS=4 CHATTERBOT=0 DRAFT_EPOCHS=0.5 SEQ_LEN=48 GEN_BATCH=8 BATCH=2 \
            SAVE_EVERY=1
    fi
    TARGET_GGUF="$stash/$name" bash scripts/build_smollm2.sh --device "$device" --train-only "${RUNS:-runs/smollm2}"
    # the head as it ships (bf16, the target's embedding left out: ~20 MB), then cut to the transfer's file size
    target=$(python -m mars.adapter.sources "$stash/$name" "$gguf_sha")
    rm -rf "$stash/export"
    python -m eagle.train.export --target "$target" --draft "${RUNS:-runs/smollm2}/draft/final" --out "$stash/export" \
        --heads-only
    for f in "$stash/export/draft"/*; do
        if [[ $(stat -c %s "$f") -gt $head_part ]]; then
            split -b "$head_part" -d -a 1 "$f" "$out/$(basename "$f").part"
        else
            cp "$f" "$out/"
        fi
    done
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
