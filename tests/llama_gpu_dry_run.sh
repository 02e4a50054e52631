#!/usr/bin/env bash
# llama_gpu_dry_run.sh: CTest's check of bench/llama_gpu.sh where no GPU is: --dry-run and a
# machine whose nvidia-smi fails each print the plan (shapes, modes, the MFU formula), say why
# they skipped and exit 0; --device sim --shapes tiny --libfsdp-only runs bench_llama_gpu on the
# simulated GPU and its figure reaches the table; with --breakdown every part's line and the
# total come out per mode, the shares sum to 1 and the parts stay within the step, and the
# breakdown's steps give the same losses as plain steps, bitwise, and the same launches and host
# waits (one a step) as a timed step, its parts' launches adding up; --checkpoint reaches
# bench_llama_gpu (MODE+ckpt lines and table rows), whose checkpointed steps give the plain
# steps' losses bitwise with a lower peak of device memory; --checkpoint with --breakdown and a
# bad option exit 2. Where torch is importable, llama_gpu.py runs the tiny shape on the CPU
# with --checkpoint and prints its result line, its loss the plain run's bitwise, and with
# --breakdown its eager parts pass the same checks and meet libfsdp's in one table.
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
expect "modes bf16,tf32,f32;"
expect "MFU = tokens/s x (6N + 12 L d T) / peak"
expect "llama_gpu: skipped: dry run (--dry-run)"

# A machine without a GPU: an nvidia-smi that fails comes first on PATH.
make_no_gpu
rc=0
PATH="$tmp/bin:$PATH" bash "$script" "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "without a GPU it exited $rc, want 0"
expect "llama_gpu: skipped: no NVIDIA GPU visible"
grep -q '^result' "$tmp/out" && fail "a result without a GPU"

# The runs below check what comes out, not how fast: their budget never binds, so no result or
# breakdown line becomes a skip line on a slow or busy machine (as with the 120 s and 150 s
# these runs had: libfsdp gets 40% of it, a mode only with 10 s left to build the model, and
# PyTorch what is left less 25 s for its start, not run below 20 s). The work is bounded
# otherwise: the tiny shape (a step takes milliseconds), a fixed number of steps, and PyTorch
# eager only (--eager-only: torch.compile, which nothing here checks, compiled for 25-60 s a
# mode on a cold cache, which pushed the entry towards CTest's 300 s on a busy machine).
budget=100000

# The plumbing on sim: libfsdp's figure of the tiny shape in its row of the table.
rc=0
bash "$script" --device sim --shapes tiny --libfsdp-only --budget-s "$budget" "$build" \
    >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "--device sim exited $rc, want 0"
grep -qE '^result libfsdp tiny f32 step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a peak_mib [0-9.]+ loss [0-9.]+$' \
    "$tmp/out" || fail "no result line of libfsdp tiny f32"
grep -qE '^tiny +f32 +[0-9.]+ +[0-9]+ +n/a +[0-9.]+ +-' "$tmp/out" ||
    fail "no table row with libfsdp's figure and peak"
grep -qE '^result libfsdp tiny bf16 step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a peak_mib [0-9.]+ loss [0-9.]+$' \
    "$tmp/out" || fail "no result line of libfsdp tiny bf16 (the bf16 compute policy)"
expect "skip libfsdp tiny tf32: TF32 is a CUDA tensor-core mode"
expect "goal tiny bf16: faster than eager SDPA: no eager figure; MFU n/a (goal 0.40)"

# --modes and --checkpoint reach bench_llama_gpu: bf16 alone times no f32 step, checkpointed
# (bf16+ckpt in its lines and the table, the goals left unjudged); a mode it does not know fails,
# and so does --checkpoint with --breakdown.
rc=0
bash "$script" --device sim --shapes tiny --libfsdp-only --modes bf16 --checkpoint \
    --budget-s "$budget" "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "--modes bf16 --checkpoint on sim exited $rc, want 0"
expect "modes bf16;"
expect "every decoder layer checkpointed on both sides (--checkpoint: modes MODE+ckpt)"
grep -qE '^result libfsdp tiny bf16\+ckpt step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a peak_mib [0-9.]+ loss [0-9.]+$' \
    "$tmp/out" || fail "--modes bf16 --checkpoint: no bf16+ckpt result"
grep -qE '^tiny +bf16\+ckpt +[0-9.]+ +[0-9]+ +n/a +[0-9.]+ +-' "$tmp/out" ||
    fail "no table row of bf16+ckpt with libfsdp's figure"
grep -qE '^result libfsdp tiny f32' "$tmp/out" && fail "--modes bf16 timed f32"
expect "goals not judged: the steps are checkpointed (--checkpoint)"
rc=0
bash "$script" --device sim --checkpoint --breakdown "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--checkpoint --breakdown exited $rc, want 2"
expect "--breakdown with --checkpoint is not supported"
rc=0
bash "$script" --dry-run --modes bf16,fp8 "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--modes bf16,fp8 exited $rc, want 2"
expect "a list of f32, tf32, bf16"

# --breakdown on sim: after each mode's timed steps, every part of libfsdp's step and the total.
rc=0
bash "$script" --device sim --shapes tiny --libfsdp-only --breakdown --budget-s "$budget" "$build" \
    >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "--breakdown on sim exited $rc, want 0"
expect "libfsdp's and PyTorch eager's steps broken down by part (--breakdown)"
num='-?[0-9]+\.[0-9]+' # other (the step less the parts) may come out below 0: see below
# check_breakdown WHO MODE: WHO's (libfsdp, torch-eager) breakdown of the tiny shape in MODE, in
# $tmp/out: every part's line and the total, shares summing to 1, parts within the step.
check_breakdown() {
    local who=$1 mode=$2 part
    for part in embedding input_norm attn_proj attn_core post_attn_norm mlp_proj mlp_rest residual \
        final_norm lm_head loss optimizer other; do
        grep -qE "^breakdown $who tiny $mode $part fwd_ms $num bwd_ms $num share $num\$" \
            "$tmp/out" || fail "no $who breakdown line of part $part in tiny $mode"
    done
    grep -qE "^breakdown $who tiny $mode total step_ms $num parts_ms $num timed_step_ms $num steps 5 idle_sync_us $num loss [0-9.]+\$" \
        "$tmp/out" || fail "no $who breakdown total line of tiny $mode"
    # The shares are (fwd + bwd) / step with other = step - parts, so they sum to 1 but for the
    # printing: 13 shares of 4 decimals each off by at most 5e-5, 6.5e-4 in all.
    # Each breakdown step's timed parts are disjoint intervals of it (a rest part, like
    # attn_core, is its module's interval less its children's), so within a step they cannot
    # exceed it; the figures are medians per part over 5 steps, whose sum can pass the median
    # step only by noise that lands in different steps: at most 1.7% was measured on a 2-core
    # machine with both cores busy (8.4% with 3 steps). The bound is 10% of the step: the
    # attention projections left in attn_core as well (counted twice) passed it in bf16 (12%
    # over), though not in f32, where other's slack hid them. A rest part is a median of
    # intervals less their children's: never below 0, unless a child is subtracted twice.
    awk -v who="$who" -v mode="$mode" '
        $1 == "breakdown" && $2 == who && $4 == mode && $5 != "total" { sum += $11; n++; v[$5] = $7 " " $9 }
        $1 == "breakdown" && $2 == who && $4 == mode && $5 == "total" { step = $7; parts = $9 }
        END {
            if (n != 13) { printf "%d parts, want 13\n", n; exit 1 }
            if (sum < 1 - 6.5e-4 || sum > 1 + 6.5e-4) { printf "shares sum to %.5f\n", sum; exit 1 }
            if (parts > 1.10 * step) { printf "parts %.3f ms > 1.10 x step %.3f ms\n", parts, step; exit 1 }
            split("attn_core mlp_rest residual", rest, " ")
            for (i = 1; i <= 3; i++) {
                split(v[rest[i]], fb, " ")
                if (fb[1] < 0 || fb[2] < 0) { printf "%s below 0: %s\n", rest[i], v[rest[i]]; exit 1 }
            }
        }' "$tmp/out" >"$tmp/why" || fail "$who breakdown of tiny $mode: $(cat "$tmp/why")"
}
for mode in f32 bf16; do
    check_breakdown libfsdp "$mode"
done

# The launch and host-wait counts (docs/device.md): the timed step waits once (its loss), the
# breakdown's last step, less the breakdown's own synchronizes, is the same step (the hooks add
# waits, not launches), and its parts' launches add up to it with none below 0.
for mode in f32 bf16; do
    grep -qE "^counts libfsdp tiny $mode step launches [0-9]+ host_waits 1\$" "$tmp/out" ||
        fail "no counts line of tiny $mode with one host wait"
    awk -v mode="$mode" '
        $1 == "counts" && $4 == mode && $5 == "step" { step = $7 }
        $1 == "counts" && $4 == mode && $5 == "breakdown_step" { bd = $7; bdw = $9 }
        $1 == "counts" && $4 == mode && $6 == "launches_fwd" {
            n++; sum += $7 + $9
            if ($7 < 0 || $9 < 0) { printf "%s launches below 0\n", $5; exit 1 }
        }
        END {
            if (n != 13) { printf "%d parts counted, want 13\n", n; exit 1 }
            if (bd != step || bdw != 1) { printf "breakdown step %s/%s, timed step %s/1\n", bd, bdw, step; exit 1 }
            if (sum != step) { printf "parts %d launches, step %d\n", sum, step; exit 1 }
        }' "$tmp/out" >"$tmp/why" || fail "counts of tiny $mode: $(cat "$tmp/why")"
done

# The breakdown's hooks only synchronise: its steps train as ordinary ones, bitwise on sim. A
# run of 1 warm-up, 1 timed and 5 breakdown steps per mode ends each mode on the same step as
# 1 warm-up and 6 timed steps (7 per mode; bf16 continues f32's training); both print that
# step's loss with 9 significant digits, a float's round trip.
bench=$build/bench/bench_llama_gpu
"$bench" --device sim --shapes tiny --modes f32,bf16 --warmup 1 --steps 1 --breakdown \
    >"$tmp/out" 2>&1 || fail "bench_llama_gpu --breakdown exited $?"
awk '$1 == "breakdown" && $5 == "total" { print $4, $NF }' "$tmp/out" >"$tmp/hooked"
"$bench" --device sim --shapes tiny --modes f32,bf16 --warmup 1 --steps 6 >"$tmp/out" 2>&1 ||
    fail "bench_llama_gpu exited $?"
awk '$1 == "result" { print $4, $NF }' "$tmp/out" >"$tmp/plain"
[ "$(wc -l <"$tmp/plain")" -eq 2 ] || fail "want 2 result lines (f32, bf16)"
cmp -s "$tmp/hooked" "$tmp/plain" ||
    fail "losses with the breakdown's hooks ($(paste -sd' ' "$tmp/hooked")) differ from plain steps' ($(paste -sd' ' "$tmp/plain"))"

# Activation checkpointing: the recompute replays each layer's forward, so the same steps give
# the same losses, bitwise; and the layers' activations are freed between forward and backward,
# so the peak of the device allocator (sim's counts blocks as CUDA's does) is lower, per mode.
mv "$tmp/out" "$tmp/plain_out"
"$bench" --device sim --shapes tiny --modes f32,bf16 --warmup 1 --steps 6 --checkpoint \
    >"$tmp/out" 2>&1 || fail "bench_llama_gpu --checkpoint exited $?"
awk '$1 == "result" { sub(/\+ckpt$/, "", $4); print $4, $NF }' "$tmp/out" >"$tmp/ckpt"
[ "$(wc -l <"$tmp/ckpt")" -eq 2 ] || fail "--checkpoint: want 2 result lines (f32+ckpt, bf16+ckpt)"
cmp -s "$tmp/ckpt" "$tmp/plain" ||
    fail "checkpointed losses ($(paste -sd' ' "$tmp/ckpt")) differ from plain steps' ($(paste -sd' ' "$tmp/plain"))"
awk '$1 == "result" && $11 == "peak_mib" {
        m = $4; c = sub(/\+ckpt$/, "", m); peak[m, c] = $12
    }
    END {
        for (i = split("f32 bf16", md, " "); i > 0; i--) {
            p = peak[md[i], 0]; q = peak[md[i], 1]
            if (p == "" || q == "") { printf "no peak of %s\n", md[i]; exit 1 }
            if (!(q + 0 < p + 0)) { printf "%s: checkpointed %s MiB, plain %s MiB\n", md[i], q, p; exit 1 }
        }
    }' "$tmp/plain_out" "$tmp/out" >"$tmp/why" || fail "checkpointed peak not below plain: $(cat "$tmp/why")"

rc=0
bash "$script" --steps 3 "$build" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--steps 3 exited $rc, want 2 (the median needs 10)"
expect "the median needs at least 10 steps"

if python3 -c 'import torch' 2>/dev/null; then
    rc=0
    python3 "$here/llama_gpu.py" --device cpu --shapes tiny --modes f32 --executions eager \
        --checkpoint --budget-s "$budget" >"$tmp/out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || fail "llama_gpu.py --checkpoint on the CPU exited $rc"
    grep -qE '^result torch-eager tiny f32\+ckpt step_ms [0-9.]+ tokens_per_s [0-9.]+ mfu n/a peak_mib n/a loss [0-9.]+ ' \
        "$tmp/out" || fail "no result line of llama_gpu.py --checkpoint"
    expect "sdpa tiny f32: aten::_scaled_dot_product"
    ckpt_loss=$(awk '$1 == "result" { print $14 }' "$tmp/out")
    # --breakdown: PyTorch eager's parts as libfsdp's, and the two side by side in one table.
    # The modes checked below, f32 and bf16: TF32 (on the CPU PyTorch's f32 path, and skipped
    # by libfsdp on sim) would add only its eager run, unchecked.
    rc=0
    bash "$script" --device sim --shapes tiny --modes bf16,f32 --eager-only --breakdown \
        --budget-s "$budget" "$build" >"$tmp/out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || fail "--device sim --breakdown with torch exited $rc"
    # The same 12 steps (2 warm-up, 10 timed) of a fresh model: checkpointed, the same loss.
    loss=$(awk '$1 == "result" && $2 == "torch-eager" && $4 == "f32" { print $14 }' "$tmp/out")
    if [ -z "$loss" ] || [ "$loss" != "$ckpt_loss" ]; then
        fail "llama_gpu.py f32 loss ${loss:-missing}, with --checkpoint $ckpt_loss"
    fi
    for mode in f32 bf16; do
        check_breakdown torch-eager "$mode"
        expect "== breakdown tiny $mode (fwd + bwd ms per step, synchronised at every hook)"
    done
    grep -qE "^attn_core +$num +$num +[-+]$num\$" "$tmp/out" || fail "no attn_core row in the side-by-side table"
    echo "llama_gpu_dry_run: llama_gpu.py ran the tiny shape on the CPU, checkpointed and with its breakdown"
else
    echo "llama_gpu_dry_run: torch is not importable here: llama_gpu.py not run"
fi
echo "llama_gpu_dry_run: dry run, no-GPU skip, sim figure, checkpoint, breakdown and option check passed"
