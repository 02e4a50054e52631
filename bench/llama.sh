#!/usr/bin/env bash
# llama.sh: the CPU Llama training-step benchmark, libfsdp against transformers on the same
# machine in the same run: bench_llama (libfsdp) then llama_cpu.py (PyTorch, when importable),
# with the same options and thread count, then tokens/s of both and their ratio (libfsdp /
# PyTorch: above 1 means libfsdp is faster). bench/README.md, "bench_llama".
#
# Usage: bench/llama.sh [BUILD_DIR] [-- OPTIONS]
#   BUILD_DIR  the build holding bench/bench_llama (default: build)
#   OPTIONS    go to both bench_llama and llama_cpu.py, e.g. --big or --batch 4 --seq 256
#              (bench_llama --help lists them); --threads N also sets OPENBLAS_NUM_THREADS
#              (default: every online core)
#   -h, --help prints this help
# Prints bench_llama's report, llama_cpu.py's, then tokens/s of both and their ratio, and
# forward+backward ms of both; without torch and transformers only libfsdp's, and says so.
# Writes no file.
# Exit status: 0 done (also without PyTorch); 2 bad command line or BUILD_DIR without
# bench_llama; otherwise the failing program's status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli.bash"
bench_cli llama.sh "bench_llama" "$@"
set -- ${prog_args[@]+"${prog_args[@]}"}
threads=$(nproc)
for arg in "$@"; do [ "${prev:-}" = "--threads" ] && threads=$arg; prev=$arg; done
ours=$(OPENBLAS_NUM_THREADS=$threads "$build/bench/bench_llama" --threads "$threads" "$@")
echo "$ours"
if ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "PyTorch with transformers is not importable here: no comparison"
    exit 0
fi
theirs=$(python3 "$here/llama_cpu.py" --threads "$threads" "$@")
echo "$theirs"
a=$(echo "$ours" | awk '$1 == "libfsdp" && $2 == "step_ms" {print $5}')
b=$(echo "$theirs" | awk '$1 == "pytorch" && $2 == "step_ms" {print $5}')
fa=$(echo "$ours" | awk '$1 == "libfsdp" && $2 == "fwd_bwd_ms" {print $3}')
fb=$(echo "$theirs" | awk '$1 == "pytorch" && $2 == "fwd_bwd_ms" {print $3}')
awk -v a="$a" -v b="$b" -v fa="$fa" -v fb="$fb" -v t="$threads" 'BEGIN {
    printf "tokens/s on %d threads: libfsdp %.1f, pytorch %.1f, libfsdp/pytorch %.3f\n", t, a, b, a / b
    printf "forward+backward alone: libfsdp %.1f ms, pytorch %.1f ms, pytorch/libfsdp %.3f\n", fa, fb, fb / fa }'
