#!/bin/sh
# test-coretypes.sh [BUILD] [JOBS]: the numerical suites (CTest label `numerics`) under every
# OpenBLAS kernel family this CPU can execute, forced one after another with OPENBLAS_CORETYPE,
# so that no bound depends on the kernel OpenBLAS happens to pick (docs/testing.md "Bounds").
# Families: Prescott (SSE3, the dynamic build's generic x86-64 kernel), Sandybridge (AVX),
# Haswell and Zen (AVX2 + FMA), SkylakeX (AVX-512). The mpirun entries are left out: both comm
# backends give bitwise the same results, so they add no numerical case.
#
#   BUILD       the build folder, holding fsdp-train and the suites (default: build)
#   JOBS        ctest's parallelism, a positive integer (default: 2)
#   -h, --help  prints this help
# Prints which kernel OpenBLAS picks here, then ctest's output per family (or a line saying why
# nothing runs: not x86-64 with SSE3, or an OpenBLAS without DYNAMIC_ARCH) and the time taken.
# Writes only what ctest writes in BUILD.
# Exit status: 0 every family passed (or there is one family, which make test ran); 1 a suite
# failed under some family; 2 bad command line (also: no BUILD/fsdp-train).
set -eu
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
bad() {
    echo "test-coretypes: $1" >&2
    usage >&2
    exit 2
}
for arg in "$@"; do
    case $arg in -h | --help) usage && exit 0 ;; -*) bad "unknown option '$arg'" ;; esac
done
[ $# -le 2 ] || bad "unexpected argument '$3'"
build=${1:-build}
jobs=${2:-2}
case $jobs in '' | *[!0-9]* | 0) bad "JOBS '$jobs': give a positive integer" ;; esac
[ -x "$build/fsdp-train" ] || bad "no $build/fsdp-train: build first (make build), or name the build folder"

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true)
has() {
    for f in "$@"; do
        case " $flags " in *" $f "*) ;; *) return 1 ;; esac
    done
}
families=""
has pni && families="$families Prescott"
has avx && families="$families Sandybridge"
has avx2 fma && families="$families Haswell Zen"
has avx512f avx512cd avx512bw avx512dq avx512vl && families="$families SkylakeX"
if [ -z "$families" ]; then
    echo "test-coretypes: not an x86-64 CPU with SSE3; OpenBLAS has one kernel family here," \
        "which make test ran"
    exit 0
fi

# OPENBLAS_VERBOSE=2 makes OpenBLAS print the kernel it loads ("Core: Haswell"); a build
# without DYNAMIC_ARCH prints nothing and ignores OPENBLAS_CORETYPE.
core_of() {
    OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE="$1" "$build/fsdp-train" --version 2>&1 |
        sed -n 's/^Core: //p' | head -n 1
}
default=$(core_of "")
if [ -z "$default" ]; then
    echo "test-coretypes: this OpenBLAS is not a DYNAMIC_ARCH build (it names no kernel);" \
        "it has one kernel family, which make test ran"
    exit 0
fi
echo "test-coretypes: OpenBLAS picks $default here; running the numerical suites under$families"
start=$(date +%s)
failed=""
for core in $families; do
    got=$(core_of "$core")
    if [ "$got" != "$core" ]; then
        echo "test-coretypes: this OpenBLAS does not know OPENBLAS_CORETYPE=$core" \
            "(it loaded $got instead); $core skipped"
        continue
    fi
    echo "== OPENBLAS_CORETYPE=$core"
    OPENBLAS_CORETYPE=$core ctest --test-dir "$build" -L numerics -LE mpi --output-on-failure \
        -j "$jobs" || failed="$failed $core"
done
echo "test-coretypes: $(($(date +%s) - start)) s"
if [ -n "$failed" ]; then
    echo "test-coretypes: numerical suites failed under$failed"
    exit 1
fi
