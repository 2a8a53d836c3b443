#!/usr/bin/env bash
# The SmolLM2 head build on a remote GPU machine that reaches no package registry and takes at most 64 MiB of
# files per transfer (the device tool's limit), in three steps:
#
#   here:   bash scripts/gpu_bundle_smollm2.sh pack .gpu        # .gpu0/, .gpu1/, ...: the GGUF in parts, its
#                                                               # sha256, the wheels the machine's image lacks
#                                                               # and what INIT / ANSWERS / PROMPTS name, each
#                                                               # folder one call (<= 64 MiB with the tree)
#   there:  bash scripts/gpu_bundle_smollm2.sh build .gpuI OUT --stash   # every folder but the last: to the disk
#   there:  bash scripts/gpu_bundle_smollm2.sh build .gpuK OUT  # the last: joins and checks the GGUF, installs
#                                                               # the wheels, runs scripts/build_smollm2.sh
#                                                               # --device cuda, writes the bf16 head to OUT in
#                                                               # files <= 15 MiB, with the build's log and
#                                                               # its answers (answers.tgz)
#   here:   bash scripts/gpu_bundle_smollm2.sh unpack OUT DIR   # joins the files that came back into DIR
#
# Each call must reach the machine while it is still warm (30 s after the one before). Add `/.gpu*/` to
# `git rev-parse --git-path info/exclude` so that the folders travel only when carried, and move the embedded
# models' weights out of the tree for the calls (84 MB tracked; 64 MiB travel; pack measures the tree as it is and
# says so). The wheels: gguf (the GGUF reader), hydra-core, omegaconf and antlr4 (eval's config, which the build
# reads its model spec from). The build trains on the tree's data/prompts/smollm2_train.jsonl (the shipped head's
# 2,600 prompts, then 4,499 the target wrote on a lent H200), so the machine writes none; PROMPTS=FILE packs another
# prompts file instead. INIT=DIR packs a head (the shipped one: data/models/smollm2/draft) for the build to train on
# from (DRAFT_INIT). ANSWERS=FILE packs the answers.tgz an earlier build brought back, so this one skips answering
# (same prompts file and GEN_TEMPERATURES; its GEN_MINUTES no longer matters) and spends the call on training.
# MORE_PROMPTS=N has the target write N more there (Magpie, MORE_PROMPTS_SEED; the benchmark questions travel
# with the bundle for the overlap rule) and brings them back; TASK_PROMPTS=N likewise N begun by a task opener
# (eval.chat_prompts TASK_OPENERS: requests to write, play a role, solve, code, extract). GEN_MINUTES bounds the answering; BUILD_MINUTES (whole
# minutes) the whole call: training's schedule is shortened to end, learning rate cooled, EXPORT_SECONDS (60) before
# it (DRAFT_DEADLINE), so the head comes back inside the machine's limit whatever the earlier stages took.
# DRAFT_MINUTES stops training outright. On a CPU the same steps run at a tiny size first: TINY=1 asks the build for
# a few prompts (no chatterbot ones), short answers and one or two steps. ANSWER_RATE=N ends the call by timing the
# answering paths on N prompts.
set -euo pipefail
here="$PWD"
absolute() { [[ "$1" = /* ]] && echo "$1" || echo "$here/$1"; }   # paths as the caller gave them, before the cd
cd "$(dirname "$0")/.."
travel_limit=$((64 * 1024 * 1024)); margin=$((512 * 1024))   # the device tool's limit per call
head_part=$((15 * 1024 * 1024))
send() {  # a file to OUT, cut into parts of the transfer's file size where it is larger (unpack joins them)
    if [[ $(stat -c %s "$1") -gt $head_part ]]; then split -b "$head_part" -d -a 1 "$1" "$out/$(basename "$1").part"
    else cp "$1" "$out/"; fi
}

case "${1:-}" in
pack)
    # The extras (wheels, INIT's head, ANSWERS, PROMPTS, the benchmark questions) go first, whole, into the first
    # folder with room; the GGUF's bytes then fill each folder in turn. Each call carries the tree and one folder.
    gguf_sha=$(python -c 'from eval.config.schema import composed; print(composed("model=smollm2").model.target_sha256)')
    gguf=$(python -c 'from eval.config.schema import composed; from mars.adapter.sources import gguf_file
print(gguf_file(composed("model=smollm2").model.target))')
    dir=$(absolute "$2"); rm -rf "$dir"[0-9] "$dir.extras"; mkdir -p "$dir.extras/wheels"
    extras="$dir.extras"
    echo "$gguf_sha  $(basename "$gguf")" > "$extras/gguf.sha256"
    basename "$gguf" > "$extras/gguf.name"
    # the versions installed here; `pip wheel` builds antlr4's, which is published as a source archive only
    pins=$(python -c 'import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("gguf", "hydra-core", "omegaconf", "antlr4-python3-runtime")))')
    python -m pip wheel --quiet --no-deps -w "$extras/wheels" $pins
    [[ -n "${PROMPTS:-}" ]] && cp "$(absolute "$PROMPTS")" "$extras/prompts.jsonl"
    if [[ "${MORE_PROMPTS:-0}" -gt 0 || "${TASK_PROMPTS:-0}" -gt 0 ]]; then   # the benchmark questions (2.4 MB), for the overlap rule there
        bench=$(python -c 'from eval.config.paths import bench_path; print(bench_path(""))')
        mkdir -p "$extras/bench" && cp "$bench"/* "$extras/bench/"
    fi
    [[ -n "${INIT:-}" ]] && { mkdir -p "$extras/init"; cp "$(absolute "$INIT")"/{config.json,model.safetensors} "$extras/init/"; }
    [[ -n "${ANSWERS:-}" ]] && { mkdir -p "$extras/answers"; tar -xzf "$(absolute "$ANSWERS")" -C "$extras/answers"; }
    # tracked files moved out of the tree do not travel (stat skips them)
    tree=$( (git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s}')
    python - "$dir" "$gguf" $((travel_limit - margin - tree)) "$gguf_sha" <<'PY'
import hashlib, shutil, subprocess, sys
from pathlib import Path

base, gguf, room, sha = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
extras = Path(base + ".extras")
if room < 8 << 20:
    sys.exit(f"pack: the tree that travels leaves {max(room, 0) >> 20} MiB of 64 per call: move the embedded models' "
             "weights (data/models/*/model.safetensors, ~82 MB) out of the tree first (and back after)")


def size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


folders: list[Path] = []
free: list[int] = []


def folder(i: int) -> Path:
    while len(folders) <= i:
        folders.append(Path(f"{base}{len(folders)}"))
        folders[-1].mkdir()
        free.append(room)
    return folders[i]


for item in sorted(extras.iterdir(), key=size, reverse=True):  # first fit, the largest first
    need = size(item)
    if need > room:
        sys.exit(f"pack: {item.name} is {need >> 20} MiB, more than one call's {room >> 20} MiB")
    i = next((i for i in range(len(folders)) if free[i] >= need), len(folders))
    shutil.move(str(item), folder(i) / item.name)
    free[i] -= need
total, done, part, i = gguf.stat().st_size, 0, 0, 0
with gguf.open("rb") as src:
    while done < total:  # the GGUF's bytes fill the folders in turn, as many more as they need
        n = min(free[i] if i < len(folders) else room, total - done)
        if n > 0:
            # two digits: the build joins the parts in glob order
            (folder(i) / f"gguf.part{part:02d}").write_bytes(src.read(n))
            done, part, free[i] = done + n, part + 1, free[i] - n
        i += 1
# The build joins the parts as its stash lists them (glob order) and checks the sha256 there, on the lent machine;
# a short or misordered join is caught here instead, before any device time is spent.
joined = hashlib.sha256()
for p in sorted((p for f in folders for p in f.glob("gguf.part*")), key=lambda p: p.name):
    joined.update(p.read_bytes())
if joined.hexdigest() != sha:
    sys.exit(f"pack: the GGUF's parts do not join to {gguf.name} (sha256 {joined.hexdigest()[:12]}..., expected "
             f"{sha[:12]}...): remove {base}[0-9]* and pack again")
for f, left in zip(folders, free):
    # 1: inside the repository and not ignored, so it would travel in every call (128: outside the repository)
    if subprocess.run(["git", "check-ignore", "-q", str(f)]).returncode == 1:
        sys.exit(f"pack: {f} is not ignored by git, so it would travel in every call: add /.gpu*/ to "
                 "$(git rev-parse --git-path info/exclude)")
    print(f"{f.name}: {(room - left) >> 20} MiB beside the tree's (one call each, <= 64 MiB in all)")
print(f"calls: {len(folders)}: `build DIR OUT --stash` for each folder but {folders[-1].name}, then `build "
      f"{folders[-1].name} OUT`, each while the machine is warm")
PY
    rmdir "$extras" 2>/dev/null || true
    ls -lR "$dir"[0-9]
    ;;
build)
    dir=$(absolute "$2"); out=$(absolute "$3"); stash="${STASH:-/tmp/mars-gpu-bundle}"
    # BUILD_MINUTES: the whole call's wall time. Training's schedule is fitted to end (cooled) EXPORT_SECONDS
    # before it, whatever the prompts, answers and features took, so the head comes back inside the call's limit.
    [[ -n "${BUILD_MINUTES:-}" ]] && export DRAFT_DEADLINE=$(( $(date +%s) + ${BUILD_MINUTES%.*} * 60 - ${EXPORT_SECONDS:-60} ))
    mkdir -p "$stash" "$out"
    cp -r "$dir"/. "$stash"/   # every call's folder lands in one place; the last call builds from it
    [[ "${4:-}" == --stash ]] && { ls -l "$stash"; exit 0; }
    name=$(cat "$stash/gguf.name")
    cat "$stash"/gguf.part* > "$stash/$name"
    (cd "$stash" && sha256sum -c gguf.sha256)
    gguf_sha=$(cut -d' ' -f1 "$stash/gguf.sha256")
    python -c "import gguf, hydra" 2>/dev/null || {
        python -m pip install -q --no-index --no-deps --target /tmp/site "$stash"/wheels/*.whl
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    }
    if [[ "${TINY:-0}" == 1 ]]; then
        export SELF_PROMPTS=4 DOCSTRING_PROMPTS=4 CHATTERBOT=0 DRAFT_EPOCHS=0.5 SEQ_LEN=48 GEN_BATCH=8 BATCH=2 \
            SAVE_EVERY=1
    fi
    device=cuda; python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || device=cpu
    runs="${RUNS:-runs/smollm2}"
    prompts="$stash/prompts.jsonl"; [[ -s "$prompts" ]] || prompts=data/prompts/smollm2_train.jsonl
    [[ -s "$runs/prompts.jsonl" ]] || { mkdir -p "$runs"; cp "$prompts" "$runs/prompts.jsonl"; }
    # a carried head (pack's INIT) is trained on instead of a fresh one
    [[ -d "$stash/init" ]] && export DRAFT_INIT="$stash/init"
    # carried answers (pack's ANSWERS): stage 2 finds its sequences written and goes on to the features
    if [[ -s "$stash/answers/sequences.pt" && ! -s "$runs/data/sequences.pt" ]]; then
        mkdir -p "$runs/data" && cp "$stash/answers/sequences.pt" "$stash/answers/meta.json" "$runs/data/"
    fi
    if [[ -s "$stash/answers/meta.json" ]]; then   # their answering budget, so that stage 2 takes them as its own
        minutes=$(python -c 'import json, sys; v = json.load(open(sys.argv[1]))["gen_minutes"]; print("" if v is None else v)' \
            "$stash/answers/meta.json")
        if [[ -n "$minutes" ]]; then export GEN_MINUTES="$minutes"; else unset GEN_MINUTES; fi
    fi
    # MORE_PROMPTS=N / TASK_PROMPTS=N: N more self-written prompts (Magpie, other seeds than stage 1's; begun by a
    # task opener) beside the carried ones, none shared with them, the held-out or calibration prompts, or a benchmark question; written once
    more=$(( ${MORE_PROMPTS:-0} + ${TASK_PROMPTS:-0} ))
    if [[ "$more" -gt 0 && ! -d "$stash/bench" ]]; then
        echo "build: MORE_PROMPTS / TASK_PROMPTS need the benchmark questions for the overlap rule: pack with it set too" >&2
        exit 2
    fi
    if [[ "$more" -gt 0 && -s "$runs/prompts.jsonl" && ! -s "$runs/more_prompts.jsonl" ]]; then
        target=$(python -m mars.adapter.sources "$stash/$name" "$gguf_sha")
        python -m eval.chat_prompts --target "$target" --self "${MORE_PROMPTS:-0}" --self-tasks "${TASK_PROMPTS:-0}" \
            --docstrings 0 --no-chatterbot \
            --heldout 0 --seed "${MORE_PROMPTS_SEED:-1}" --bench-dir "$stash/bench" --device "$device" \
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
    for f in "$stash/export/draft"/*; do send "$f"; done
    cp "$runs/draft/final/training_summary.json" "$out/"
    # the answers come back (token ids, ~10 MB compressed for 10k answers), so a later build can skip answering
    tar -czf "$stash/answers.tgz" -C "$runs/data" sequences.pt meta.json
    send "$stash/answers.tgz"
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
