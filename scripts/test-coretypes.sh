#!/bin/sh
# test-coretypes.sh [BUILD] [JOBS]: the numerical suites (CTest label `numerics`) under every
# OpenBLAS kernel family this CPU can execute, forced one after another with OPENBLAS_CORETYPE,
# so that no bound depends on the kernel OpenBLAS happens to pick (docs/testing.md "Bounds").
# Families: Prescott (SSE3, the dynamic build's generic x86-64 kernel), Sandybridge (AVX),
# Haswell and Zen (AVX2 + FMA), SkylakeX (AVX-512). The mpirun entries are left out: both comm
# backends give bitwise the same results, so they add no numerical case.
set -eu
build=${1:-build}
jobs=${2:-2}

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
