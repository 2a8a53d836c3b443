# Sourced by the scripts whose first argument is their output directory:
#   source scripts/out_dir.sh; out="$(out_dir "usage: scripts/NAME.sh OUT [eval.run overrides...]" "$@")"; shift
# prints OUT made absolute (and created), or the usage on stderr and exits 2 when OUT is missing or
# looks like an override (key=value).
out_dir() {
    local usage="$1"
    shift
    if [[ $# -lt 1 || "$1" == *=* ]]; then
        echo "$usage" >&2
        exit 2
    fi
    mkdir -p "$1" && cd "$1" && pwd
}
