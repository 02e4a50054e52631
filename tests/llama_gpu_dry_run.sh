#!/usr/bin/env bash
# llama_gpu_dry_run.sh: CTest's check of bench/llama_gpu.sh where no GPU is: --dry-run and a
# machine whose nvidia-smi fails each print the plan (shapes, modes, the MFU formula), say why
# they skipped and exit 0; --device sim --shapes tiny --libfsdp-only runs bench_llama_gpu on the
# simulated GPU and its figure reaches the table; a bad option exits 2. Where torch is
# importable, llama_gpu.py runs the tiny shape on the CPU and prints its result line.
# Usage: tests/llama_gpu_dry_run.sh SCRIPT BUILD_DIR
set -euo pipefail
script=$1 build=$2
here=$(cd "$(dirname "$script")" && pwd)
name=llama_gpu_dry_run
# shellcheck source-path=SCRIPTDIR source=dry_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dry_run_lib.sh"

rc=0
bash "$script" --dry-run "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "--dry-run exited $rc, want 0"
expect "llama_gpu: plan: shapes S,M"
expect "modes f32, tf32, bf16"
expect "MFU = tokens/s x (6N + 12 L d T) / peak"
expect "llama_gpu: skipped: dry run (--dry-run)"

# A machine without a GPU: an nvidia-smi that fails comes first on PATH.
make_no_gpu
rc=0
PATH="$tmp/bin:$PATH" bash "$script" "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "without a GPU it exited $rc, want 0"
expect "llama_gpu: skipped: no NVIDIA GPU visible"
grep -q '^result' "$tmp/out" && fail "a result without a GPU"

# The plumbing on sim: libfsdp's figure of the tiny shape in its row of the table.
rc=0
bash "$script" --device sim --shapes tiny --libfsdp-only --budget-s 120 "$build" >"$tmp/out" 2>&1 ||
    rc=$?
[ "$rc" -eq 0 ] || fail "--device sim exited $rc, want 0"
grep -qE '^result libfsdp tiny f32 step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a loss [0-9.]+$' \
    "$tmp/out" || fail "no result line of libfsdp tiny f32"
grep -qE '^tiny +f32 +[0-9.]+ +[0-9]+ +n/a +-' "$tmp/out" || fail "no table row with libfsdp's figure"
grep -qE '^result libfsdp tiny bf16 step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a loss [0-9.]+$' \
    "$tmp/out" || fail "no result line of libfsdp tiny bf16 (the bf16 compute policy)"
expect "skip libfsdp tiny tf32: TF32 is a CUDA tensor-core mode"
expect "goal tiny bf16: faster than eager SDPA: no eager figure; MFU n/a (goal 0.40)"

rc=0
bash "$script" --steps 3 "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--steps 3 exited $rc, want 2 (the median needs 10)"
expect "the median needs at least 10 steps"

if python3 -c 'import torch' 2>/dev/null; then
    rc=0
    python3 "$here/llama_gpu.py" --device cpu --shapes tiny --modes f32 --executions eager \
        --budget-s 120 >"$tmp/out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || fail "llama_gpu.py on the CPU exited $rc"
    grep -qE '^result torch-eager tiny f32 step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a' "$tmp/out" ||
        fail "no result line of llama_gpu.py"
    expect "sdpa tiny f32: aten::_scaled_dot_product"
    echo "llama_gpu_dry_run: llama_gpu.py ran the tiny shape on the CPU"
else
    echo "llama_gpu_dry_run: torch is not importable here: llama_gpu.py not run"
fi
echo "llama_gpu_dry_run: dry run, no-GPU skip, sim figure and option check passed"
