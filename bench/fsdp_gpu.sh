#!/usr/bin/env bash
# fsdp_gpu.sh: FSDP on one GPU, libfsdp against PyTorch FSDP2 in the same run (bench/README.md,
# "fsdp_gpu.sh"): bench_fsdp_gpu's "mp" mode (world 1, the 134 M MLP, each Linear a FULL_SHARD
# unit, bf16 param_dtype and compute, AdamW) and fsdp_gpu.py (FSDP2 fully_shard per Linear,
# MixedPrecisionPolicy bf16, fused AdamW) on the same shapes, then the ratio; and the "overlap"
# mode: two rank threads on the GPU, the step without and with prefetch and the share of
# all_gather time prefetch hides.
#
#   bench/fsdp_gpu.sh [--dry-run] [--steps N] [--widths a,b,...] [--batch N] [BUILD_DIR]
#   bench/fsdp_gpu.sh --device sim --widths 64,96,96,64 --batch 64 [BUILD_DIR]   (the plumbing)
#
# Without a GPU (nvidia-smi fails) or with --dry-run it says why it skipped and exits 0; without
# PyTorch it times libfsdp alone and says so. --device sim runs libfsdp on the simulated GPU and
# PyTorch (when importable) on the CPU with gloo: a check of the script, not a measurement.
#
# Options (defaults in brackets), passed on to bench_fsdp_gpu and fsdp_gpu.py:
#   --dry-run          print the plan and stop
#   --steps N          timed steps, median [10]
#   --widths a,b,...   the MLP's widths [4096,8192,8192,4096]
#   --batch N          rows per step [8192]
#   --device cuda|sim  [cuda]
#   BUILD_DIR          the build holding bench/bench_fsdp_gpu [build]
#   -h, --help         prints this help
# Prints the plan, both programs' result lines and the mp ratio (PyTorch / libfsdp). Writes
# no file.
# Exit status: 0 done or skipped (a failing fsdp_gpu.py is reported in the output); 1 no
# bench_fsdp_gpu in BUILD_DIR; 2 bad command line; otherwise bench_fsdp_gpu's failing status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build dry=0 device=cuda steps=10 widths=4096,8192,8192,4096 batch=8192
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
bad() { echo "fsdp_gpu.sh: $1" >&2 && usage >&2 && exit 2; }
for arg in "$@"; do case $arg in -h | --help) usage && exit 0 ;; esac; done
build_given=0
while [ $# -gt 0 ]; do
    case $1 in
    --steps | --widths | --batch | --device) [ $# -ge 2 ] || bad "$1 needs a value" ;;
    esac
    case $1 in
    --dry-run) dry=1 ;;
    --steps) steps=$2 && shift ;;
    --widths) widths=$2 && shift ;;
    --batch) batch=$2 && shift ;;
    --device) device=$2 && shift ;;
    -*) bad "unknown option '$1'" ;;
    *) [ "$build_given" = 0 ] || bad "unexpected argument '$1' (BUILD_DIR is '$build')"
       build=$1 build_given=1 ;;
    esac
    shift
done
case $device in cuda | sim) ;; *) bad "--device $device: cuda or sim" ;; esac
echo "fsdp_gpu: plan: MLP $widths, batch $batch, median of $steps steps; libfsdp mp (world 1)"
echo "  and overlap (2 rank threads), PyTorch FSDP2 at world 1"
if [ "$dry" = 1 ]; then
    echo "fsdp_gpu: skipped: dry run (--dry-run)"
    exit 0
fi
torch_dev=cuda
if [ "$device" = sim ]; then
    torch_dev=cpu
elif ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
    echo "fsdp_gpu: skipped: no NVIDIA GPU visible (nvidia-smi failed)"
    exit 0
fi
exe=$build/bench/bench_fsdp_gpu
[ -x "$exe" ] || { echo "fsdp_gpu.sh: no $exe (build with FSDP_BUILD_BENCH=ON)" >&2 && exit 1; }
ours=$("$exe" --device "$device" --widths "$widths" --batch "$batch" --steps "$steps")
echo "$ours"
theirs=""
if python3 -c 'import torch' 2>/dev/null; then
    theirs=$(python3 "$here/fsdp_gpu.py" --device "$torch_dev" --widths "$widths" \
        --batch "$batch" --steps "$steps") || echo "fsdp_gpu: fsdp_gpu.py failed"
    echo "$theirs"
else
    echo "fsdp_gpu: PyTorch not importable: libfsdp alone"
fi
a=$(echo "$ours" | awk '$1 == "result" && $3 == "mp" {print $5}')
b=$(echo "$theirs" | awk '$1 == "result" && $3 == "mp" {print $5}')
if [ -n "$a" ] && [ -n "$b" ]; then
    echo "ratio mp pytorch/libfsdp $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}') (above 1: libfsdp faster)"
fi
