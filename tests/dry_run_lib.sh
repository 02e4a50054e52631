# shellcheck shell=bash
# dry_run_lib.sh: the frame of the benchmark scripts' dry-run checks (llama_gpu_dry_run.sh,
# fsdp_gpu_dry_run.sh), sourced after `set -euo pipefail` with $name set to the check's name: a
# temporary folder $tmp removed on exit, where each run's output goes ($tmp/out); fail MESSAGE
# (prints it and that output, exits 1); expect TEXT (fails unless the output has TEXT); and
# make_no_gpu (writes $tmp/bin/nvidia-smi, one that fails: put $tmp/bin first on PATH for a
# machine without a GPU).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "${name:?}: $*" >&2
    echo "--- output" >&2
    cat "$tmp/out" >&2 || true
    exit 1
}
expect() { grep -qF -- "$1" "$tmp/out" || fail "no '$1' in the output"; }
make_no_gpu() {
    mkdir -p "$tmp/bin"
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n' >"$tmp/bin/nvidia-smi"
    chmod +x "$tmp/bin/nvidia-smi"
}
