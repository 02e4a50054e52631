#!/bin/sh
# fuzz-ckpt.sh: fuzzes the checkpoint reader (tests/fuzz/fuzz_ckpt_reader.c) for MINUTES
# (default 5) under AddressSanitizer and UndefinedBehaviorSanitizer: the libFuzzer target when
# clang is installed, else the standalone driver with a seeded random campaign.
#
#   scripts/fuzz-ckpt.sh [MINUTES]     (a positive whole number; default 5)
#   scripts/fuzz-ckpt.sh -h | --help   (prints this help)
#
# Environment: RAW=PERCENT adds raw byte flips of the files (libFuzzer: to every input when
# non-zero; standalone: to PERCENT of the inputs; default 0), SEED (standalone; default: the
# time), JOBS (build parallelism, default 2), STANDALONE=1 uses the standalone driver even with
# clang, BUILD the build folder (default build-fuzz for libFuzzer, build-asan otherwise).
# A finding stops the run with the sanitizer's report: libFuzzer leaves the input as crash-* in
# the build folder, the standalone driver prints its seed; replay an input with
# `<build>/tests/fuzz_ckpt_reader FILE` (or the libFuzzer binary with FILE).
# It configures and builds BUILD, and libFuzzer keeps its corpus in BUILD/fuzz-corpus.
# Exit status: 0 no finding; 2 bad command line; otherwise the failing step's (a finding: the
# fuzzer's, non-zero).
set -eu

usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
bad() {
    echo "fuzz-ckpt: $1" >&2
    usage >&2
    exit 2
}
for arg in "$@"; do
    case $arg in -h | --help) usage && exit 0 ;; -*) bad "unknown option '$arg'" ;; esac
done
[ $# -le 1 ] || bad "unexpected argument '$2'"
MINUTES=${1:-5}
case $MINUTES in '' | *[!0-9]* | 0) bad "MINUTES '$MINUTES': give a positive whole number" ;; esac
RAW=${RAW:-0}
JOBS=${JOBS:-2}
SEED=${SEED:-$(date +%s)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_TOTAL=$((MINUTES * 60))
COMMON="-DCMAKE_BUILD_TYPE=Debug -DFSDP_SANITIZE=address,undefined -DFSDP_BUILD_BENCH=OFF"

# BUILD relative to where the script was started (the libFuzzer run changes into it).
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

if command -v clang >/dev/null 2>&1 && [ "${STANDALONE:-0}" != 1 ]; then
    BUILD=$(absolute "${BUILD:-$ROOT/build-fuzz}")
    # shellcheck disable=SC2086
    CC=clang cmake -S "$ROOT" -B "$BUILD" $COMMON -DFSDP_FUZZ=ON -DFSDP_CUDA=OFF >/dev/null
    cmake --build "$BUILD" -j "$JOBS" --target fuzz_ckpt_reader_libfuzzer
    CORPUS=$BUILD/fuzz-corpus/ckpt_reader
    mkdir -p "$CORPUS"
    cd "$BUILD"
    echo "fuzz-ckpt: libFuzzer for $MINUTES min (raw flips: $RAW), corpus $CORPUS"
    FSDP_FUZZ_RAW=$RAW "$BUILD/tests/fuzz_ckpt_reader_libfuzzer" -max_total_time="$SECONDS_TOTAL" \
        -max_len=256 -len_control=0 -rss_limit_mb=4096 -print_final_stats=1 "$CORPUS"
else
    BUILD=$(absolute "${BUILD:-$ROOT/build-asan}")
    # shellcheck disable=SC2086
    cmake -S "$ROOT" -B "$BUILD" $COMMON >/dev/null
    cmake --build "$BUILD" -j "$JOBS" --target fuzz_ckpt_reader
    echo "fuzz-ckpt: standalone driver for $MINUTES min (seed $SEED, raw flips in $RAW% of inputs)"
    "$BUILD/tests/fuzz_ckpt_reader" --seconds "$SECONDS_TOTAL" --seed "$SEED" --raw "$RAW"
fi
