#!/usr/bin/env bash
# cuda_archs.sh: CTest's check that every kernel file (src/kernels/cuda/*.cu) compiles for both
# architectures the library ships, sm_80 (A100) and sm_90 (H100, H200), with the library's CUDA
# flags and warnings as errors, whatever CMAKE_CUDA_ARCHITECTURES this build uses (a GPU session
# builds for 90 alone). Compiles only: no GPU is needed.
# Usage: tests/cuda_archs.sh NVCC SOURCE_DIR
set -euo pipefail
nvcc=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shopt -s nullglob
files=("$src"/src/kernels/cuda/*.cu)
[ ${#files[@]} -gt 0 ] || { echo "cuda_archs: no .cu files under $src/src/kernels/cuda" >&2 && exit 1; }
failed=0
for arch in 80 90; do
    for f in "${files[@]}"; do
        name=$(basename "$f" .cu)
        if ! "$nvcc" -std=c++17 -O3 --default-stream=per-thread --fmad=false --Werror=all-warnings \
            -Xcompiler=-Wall,-Wextra,-Werror -arch=sm_$arch -I"$src/include" -I"$src/src" \
            -c "$f" -o "$tmp/$name.sm_$arch.o" 2>"$tmp/err"; then
            echo "cuda_archs: $name.cu does not compile for sm_$arch:" >&2
            cat "$tmp/err" >&2
            failed=1
        fi
    done
    echo "cuda_archs: sm_$arch: ${#files[@]} files compiled"
done
exit "$failed"
