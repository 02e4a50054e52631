#!/usr/bin/env bash
# fsdp_gpu_dry_run.sh: CTest's check of bench/fsdp_gpu.sh where no GPU is: --dry-run and a
# machine whose nvidia-smi fails each print the plan, say why they skipped and exit 0 with no
# figure; --device sim on a small MLP runs bench_fsdp_gpu's two modes on the simulated GPU (world
# 1 with bf16 mixed precision; two rank threads without and with prefetch, and the gathers
# alone) and prints their result lines (and, where torch is importable, fsdp_gpu.py's FSDP2 line
# on the CPU and the ratio); a bad option exits 2.
# Usage: tests/fsdp_gpu_dry_run.sh SCRIPT BUILD_DIR
set -euo pipefail
script=$1 build=$2
name=fsdp_gpu_dry_run
# shellcheck source-path=SCRIPTDIR source=dry_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dry_run_lib.sh"

rc=0
bash "$script" --dry-run "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "--dry-run exited $rc, want 0"
expect "fsdp_gpu: plan: MLP 4096,8192,8192,4096, batch 8192"
expect "fsdp_gpu: skipped: dry run (--dry-run)"

make_no_gpu
rc=0
PATH="$tmp/bin:$PATH" bash "$script" "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "without a GPU it exited $rc, want 0"
expect "fsdp_gpu: skipped: no NVIDIA GPU visible"
grep -q '^result' "$tmp/out" && fail "a result without a GPU"

rc=0
bash "$script" --device sim --widths 64,96,96,64 --batch 64 --steps 3 "$build" >"$tmp/out" 2>&1 ||
    rc=$?
[ "$rc" -eq 0 ] || fail "--device sim exited $rc, want 0"
num='[0-9]+\.[0-9]+'
grep -qE "^result libfsdp mp step_ms $num$" "$tmp/out" || fail "no result line of the mp mode"
grep -qE "^result libfsdp overlap off_ms $num on_ms $num gathers_ms $num hidden $num \(unclamped -?$num\)$" \
    "$tmp/out" || fail "no result line of the overlap mode"
if python3 -c 'import torch' 2>/dev/null; then
    grep -qE "^result pytorch mp step_ms $num" "$tmp/out" || fail "no result line of fsdp_gpu.py"
    grep -qE "^ratio mp pytorch/libfsdp $num" "$tmp/out" || fail "no ratio line"
    echo "fsdp_gpu_dry_run: fsdp_gpu.py ran FSDP2 on the CPU"
else
    echo "fsdp_gpu_dry_run: torch is not importable here: fsdp_gpu.py not run"
fi

rc=0
"$build/bench/bench_fsdp_gpu" --mode fast >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "bench_fsdp_gpu --mode fast exited $rc, want 2"
expect "usage: bench_fsdp_gpu"
echo "fsdp_gpu_dry_run: dry run, no-GPU skip, sim figures and option check passed"
