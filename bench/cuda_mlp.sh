#!/usr/bin/env bash
# cuda_mlp.sh: the GPU training-step benchmark, libfsdp against PyTorch on the same machine in
# the same run: bench_cuda_mlp (libfsdp) then cuda_mlp.py (PyTorch, when importable), then the
# ratio per mode (PyTorch ms / libfsdp ms: above 1 means libfsdp is faster).
#
# Usage: bench/cuda_mlp.sh [BUILD_DIR] [-- OPTIONS]
#   BUILD_DIR  the build holding bench/bench_cuda_mlp (default: build)
#   OPTIONS    go to both bench_cuda_mlp and cuda_mlp.py, e.g. --batch 4096 --steps 10
#              (bench_cuda_mlp --help lists them)
#   -h, --help prints this help
# Prints bench_cuda_mlp's report (or its line saying it skipped: no GPU), cuda_mlp.py's, then
# per mode libfsdp ms, PyTorch ms and their ratio; without PyTorch with CUDA only libfsdp's,
# and says so. Writes no file.
# Exit status: 0 done (also skipped, or without PyTorch); 2 bad command line or BUILD_DIR
# without bench_cuda_mlp; otherwise the failing program's status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli.bash"
bench_cli cuda_mlp.sh "bench_cuda_mlp" "$@"
set -- ${prog_args[@]+"${prog_args[@]}"}
ours=$("$build/bench/bench_cuda_mlp" "$@")
echo "$ours"
if ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    echo "PyTorch with CUDA is not importable here: no comparison"
    exit 0
fi
theirs=$(python3 "$here/cuda_mlp.py" "$@")
echo "$theirs"
echo "mode    libfsdp ms  pytorch ms  pytorch/libfsdp"
for mode in f32 tf32 bf16; do
    a=$(echo "$ours" | awk -v m="$mode" '$1 == "libfsdp" && $2 == m {print $3}')
    b=$(echo "$theirs" | awk -v m="$mode" '$1 == "pytorch" && $2 == m {print $3}')
    [ -n "$b" ] || continue
    if [ -n "$a" ]; then
        awk -v m="$mode" -v a="$a" -v b="$b" 'BEGIN {printf "%-6s %11.2f %11.2f %16.3f\n", m, a, b, b / a}'
    else
        printf "%-6s %11s %11.2f %16s\n" "$mode" "n/a" "$b" "n/a"
    fi
done
