#!/usr/bin/env bash
# cuda_mlp.sh: the GPU training-step benchmark, libfsdp against PyTorch on the same machine in
# the same run: bench_cuda_mlp (libfsdp) then cuda_mlp.py (PyTorch, when importable), then the
# ratio per mode (PyTorch ms / libfsdp ms: above 1 means libfsdp is faster).
# Usage: bench/cuda_mlp.sh [BUILD_DIR] [-- options for both, e.g. --batch 4096]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
shift || true
[ "${1:-}" = "--" ] && shift
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
