#!/usr/bin/env bash
# llama_gpu.sh: the GPU Llama training-step benchmark, libfsdp against PyTorch on the same card
# in the same run: bench_llama_gpu (libfsdp), then llama_gpu.py (PyTorch eager with SDPA, and
# torch.compile), on shapes S and M in modes f32, TF32 and bf16, each the median of the timed
# steps after a warm-up, and each run's peak device memory; then one table of ms/step,
# tokens/s, MFU and peak MiB, and the goals.
# bench/README.md, "llama_gpu.sh".
#
#   bench/llama_gpu.sh [--dry-run] [--budget-s SEC] [--steps N] [--shapes S,M] [--libfsdp-only]
#                      [--eager-only] [--libfsdp-shapes S] [--modes bf16,tf32,f32]
#                      [--breakdown | --checkpoint]
#                      [BUILD_DIR]
#   bench/llama_gpu.sh --device sim --shapes tiny [BUILD_DIR]   (the plumbing, on no GPU)
#
# MFU = tokens/s x (6N + 12 L d T) / peak, N the parameters less the input embedding table,
# L layers, d the model width, T the sequence length; the peak is the card's dense figure for
# the mode (libfsdp's table, peaks_of_device below; an unknown card gets no MFU). Without a
# GPU (nvidia-smi fails), or with --dry-run, it prints the plan, says why it skipped and exits 0; without PyTorch with
# CUDA it times libfsdp alone and says so. --device sim runs libfsdp on the simulated GPU and
# PyTorch (when importable) on the CPU: a check of the script and drivers, not a measurement.
# The budget (default 900 s) bounds the whole run: libfsdp gets up to 40% of it, PyTorch the
# rest; a run that would not fit is skipped with the reason. --modes: the modes both time
# (default all three, bf16 first); the table shows '-' for the others. --breakdown:
# bench_llama_gpu and llama_gpu.py (its eager runs) also time each part of the step ('breakdown'
# lines, printed as they come), and a table per shape and mode puts the two side by side.
# --checkpoint: both sides checkpoint every decoder layer (libfsdp's fsdp_checkpoint_wrap,
# PyTorch's non-reentrant torch.utils.checkpoint), the modes written f32+ckpt, tf32+ckpt,
# bf16+ckpt, and the goals are not judged; not with --breakdown (which would time the recompute
# as forward). Peak MiB: the caching allocator's most bytes in use over a run's warm-up and timed
# steps, on both sides (libfsdp's fsdp_device_memory_stats peak_in_use, PyTorch's
# torch.cuda.max_memory_allocated): parameters, gradients, AdamW's state and activations.
#
# Options (defaults in brackets):
#   --dry-run              print the plan and stop
#   --budget-s SEC         the whole run's bound, whole seconds >= 10 [900]
#   --steps N              timed steps per run, >= 10 [10]
#   --shapes LIST          S, M (and tiny, for sim) [S,M]
#   --libfsdp-shapes LIST  libfsdp's shapes, when other than --shapes [--shapes]
#   --modes LIST           f32, tf32, bf16 [bf16,tf32,f32]
#   --device cuda|sim      [cuda]
#   --libfsdp-only         do not run PyTorch
#   --eager-only           PyTorch eager only, no torch.compile ('-' in the table)
#   --breakdown            the per-part breakdown, both sides
#   --checkpoint           every decoder layer checkpointed, both sides
#   BUILD_DIR              the build holding bench/bench_llama_gpu [build]
#   -h, --help             prints this help
# Prints the plan, both programs' lines, the table and the goals. Writes no file (its
# temporary folder is removed).
# Exit status: 0 done or skipped (a failing program is reported in the output, its figures
# kept); 2 bad command line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build budget=900 steps=10 shapes=S,M modes=bf16,tf32,f32 dry=0 device=cuda torch=1 our_shapes=""
executions=eager,compile
breakdown=() checkpoint=()
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
bad() { echo "llama_gpu.sh: $1" >&2 && usage >&2 && exit 2; }
for arg in "$@"; do case $arg in -h | --help) usage && exit 0 ;; esac; done
build_given=0
while [ $# -gt 0 ]; do
    case $1 in
    --budget-s | --steps | --shapes | --modes | --libfsdp-shapes | --device)
        [ $# -ge 2 ] || bad "$1 needs a value" ;;
    esac
    case $1 in
    --dry-run) dry=1 ;;
    --budget-s) budget=$2 && shift ;;
    --steps) steps=$2 && shift ;;
    --shapes) shapes=$2 && shift ;;
    --modes) modes=$2 && shift ;;
    --libfsdp-shapes) our_shapes=$2 && shift ;;
    --device) device=$2 && shift ;;
    --libfsdp-only) torch=0 ;;
    --eager-only) executions=eager ;;
    --breakdown) breakdown=(--breakdown) ;;
    --checkpoint) checkpoint=(--checkpoint) ;;
    -*) bad "unknown option '$1'" ;;
    *) [ "$build_given" = 0 ] || bad "unexpected argument '$1' (BUILD_DIR is '$build')"
       build=$1 build_given=1 ;;
    esac
    shift
done
[[ "$budget" =~ ^[0-9]+$ ]] && [ "$budget" -ge 10 ] ||
    bad "--budget-s $budget: give whole seconds, at least 10"
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 10 ] ||
    bad "--steps $steps: the median needs at least 10 steps"
our_shapes=${our_shapes:-$shapes}
[[ "$modes" =~ ^(f32|tf32|bf16)(,(f32|tf32|bf16))*$ ]] ||
    bad "--modes $modes: a list of f32, tf32, bf16 (for example bf16,tf32)"
case $device in cuda | sim) ;; *) bad "--device $device: cuda or sim" ;; esac
[ ${#breakdown[@]} -eq 0 ] || [ ${#checkpoint[@]} -eq 0 ] ||
    bad "--breakdown with --checkpoint is not supported: the breakdown's hooks would time each layer's recompute, which runs in backward, as forward time"
start=$(date +%s)

# Dense peaks in TFLOP/s of f32, TF32 and bf16: libfsdp's own table of NVIDIA's data-sheet
# figures (fsdp_device_get_properties, src/kernels/gpu_peaks.c), as bench_llama_gpu prints it;
# 0,0,0 for a card outside it, and without the build.
peaks_of_device() {
    local line=""
    if [ -x "$build/bench/bench_llama_gpu" ]; then
        line=$(timeout 60 "$build/bench/bench_llama_gpu" --device "$device" --print-peaks \
            2>/dev/null | sed -n 's/^peaks of .*: \([0-9.e+,]*\)$/\1/p') || line=""
    fi
    echo "${line:-0,0,0}"
}

gpu=""
if [ "$device" = sim ]; then
    gpu="sim (the simulated GPU; PyTorch on the CPU)"
elif [ "$dry" = 0 ]; then
    gpu=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || gpu=""
fi
peaks=0,0,0
if [ -n "$gpu" ]; then peaks=$(peaks_of_device); fi
echo "llama_gpu: plan: shapes $shapes (S: dim 768, 12 layers, 12/4 heads, ffn 2048, vocab 32000,"
echo "  T 1024, B 16; M: dim 2048, 16 layers, 32/8 heads, ffn 8192, vocab 128256, T 2048, B 4),"
if [ "$our_shapes" != "$shapes" ]; then echo "  libfsdp on shapes $our_shapes only (--libfsdp-shapes)"; fi
if [ ${#breakdown[@]} -gt 0 ]; then echo "  libfsdp's and PyTorch eager's steps broken down by part (--breakdown)"; fi
if [ ${#checkpoint[@]} -gt 0 ]; then echo "  every decoder layer checkpointed on both sides (--checkpoint: modes MODE+ckpt)"; fi
if [ "$executions" = eager ]; then echo "  PyTorch eager only, no torch.compile (--eager-only)"; fi
echo "  modes $modes; libfsdp (bench_llama_gpu), PyTorch eager with SDPA and"
echo "  torch.compile (llama_gpu.py); AdamW; median of $steps steps after warm-up; budget $budget s"
echo "  MFU = tokens/s x (6N + 12 L d T) / peak, N = parameters less the input embedding"
echo "  peaks (TFLOP/s, f32,tf32,bf16) for '${gpu:-no GPU}': $peaks"
if [ "$dry" = 1 ]; then
    echo "llama_gpu: skipped: dry run (--dry-run)"
    exit 0
fi
if [ -z "$gpu" ]; then
    echo "llama_gpu: skipped: no NVIDIA GPU visible (nvidia-smi failed)"
    exit 0
fi
if [ "$peaks" = 0,0,0 ]; then echo "llama_gpu: no peak figures for '$gpu': MFU is n/a"; fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
left() { echo $((budget - ($(date +%s) - start))); }

# libfsdp: up to 40% of the budget; its own deadline skips what would not fit, and a timeout
# 30 s past it stops a step that hangs (the lines made so far are kept).
ours_budget=$((budget * 2 / 5))
if [ -x "$build/bench/bench_llama_gpu" ]; then
    timeout -k 5 $((ours_budget + 30)) "$build/bench/bench_llama_gpu" --device "$device" --shapes "$our_shapes" \
        --modes "$modes" --steps "$steps" --budget-s "$ours_budget" --peaks "$peaks" \
        "${breakdown[@]}" "${checkpoint[@]}" |
        tee "$out/ours" ||
        echo "llama_gpu: bench_llama_gpu exit status $? (figures above, if any, stand)"
else
    echo "llama_gpu: no $build/bench/bench_llama_gpu: build the benchmarks (FSDP_BUILD_BENCH=ON)" |
        tee "$out/ours"
fi

theirs_budget=$(($(left) - 25)) # importing torch and CUDA's start-up come first
pydev=cuda probe='import torch; assert torch.cuda.is_available()'
if [ "$device" = sim ]; then pydev=cpu probe='import torch'; fi
if [ "$torch" = 0 ]; then
    echo "llama_gpu: PyTorch not run (--libfsdp-only)" | tee "$out/theirs"
elif ! python3 -c "$probe" 2>/dev/null; then
    echo "llama_gpu: PyTorch (on $pydev) is not importable here: no comparison" | tee "$out/theirs"
elif [ "$theirs_budget" -lt 20 ]; then
    echo "llama_gpu: PyTorch not run: $(left) s of the budget left" | tee "$out/theirs"
else
    timeout -k 5 $((theirs_budget + 40)) python3 "$here/llama_gpu.py" --shapes "$shapes" \
        --modes "$modes" --steps "$steps" --budget-s "$theirs_budget" --peaks "$peaks" --device "$pydev" \
        --executions "$executions" "${breakdown[@]}" "${checkpoint[@]}" |
        tee "$out/theirs" ||
        echo "llama_gpu: llama_gpu.py exit status $? (figures above, if any, stand)"
fi

# ---- the table: one row per shape and mode ----
sfx="" # the modes' suffix in the result lines
if [ ${#checkpoint[@]} -gt 0 ]; then sfx=+ckpt; fi
echo
echo "== llama_gpu on $gpu (ms/step, tokens/s, MFU, peak MiB; eager/libfsdp above 1: libfsdp faster)"
cat "$out/ours" "$out/theirs" | awk -v shapes="$shapes" -v sfx="$sfx" '
    $1 == "result" {
        k = $2 " " $3 " " $4; ms[k] = $6; tps[k] = $8; mfu[k] = $10
        mib[k] = $11 == "peak_mib" ? $12 : "-"
    }
    function cell(k) {
        if (!(k in ms)) return sprintf("%33s", "-")
        return sprintf("%8.1f %9.0f %6s %8s", ms[k], tps[k], mfu[k], mib[k])
    }
    END {
        printf "%-5s %-9s %33s %33s %33s %14s\n", "shape", "mode", "libfsdp", "torch eager",
            "torch compile", "eager/libfsdp"
        n = split(shapes, sh, ",")
        split("f32 tf32 bf16", md, " ")
        for (i = 1; i <= n; i++) {
            for (j = 1; j <= 3; j++) {
                m = md[j] sfx
                o = "libfsdp " sh[i] " " m; e = "torch-eager " sh[i] " " m
                r = "-"
                if ((o in ms) && (e in ms)) r = sprintf("%.3f", ms[e] / ms[o])
                printf "%-5s %-9s %s %s %s %14s\n", sh[i], m, cell(o), cell(e),
                    cell("torch-compile " sh[i] " " m), r
            }
        }
        if (sfx != "") {
            print "goals not judged: the steps are checkpointed (--checkpoint)"
            exit
        }
        # The goals (bench/README.md): bf16 at S faster than eager and MFU >= 0.40; M >= 0.45.
        for (i = 1; i <= n; i++) {
            goal = sh[i] == "M" ? 0.45 : 0.40
            o = "libfsdp " sh[i] " bf16"; e = "torch-eager " sh[i] " bf16"
            if (!(o in ms)) {
                printf "goal %s bf16 (faster than eager SDPA, MFU >= %.2f): not measured, no libfsdp bf16 figure\n", sh[i], goal
                continue
            }
            fast = "no eager figure"
            if (e in ms) fast = ms[o] < ms[e] ? "met" : "missed"
            printf "goal %s bf16: faster than eager SDPA: %s; MFU %s (goal %.2f)\n", sh[i], fast, mfu[o], goal
        }
    }'
grep -h '^skip\|^sdpa' "$out/ours" "$out/theirs" || true

# ---- the breakdowns side by side: per shape and mode, each part's fwd + bwd ms ----
if [ ${#breakdown[@]} -gt 0 ]; then
    cat "$out/ours" "$out/theirs" | awk '
        $1 == "breakdown" && $5 != "total" {
            k = $3 " " $4; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
            if (!($5 in pseen)) { pseen[$5] = 1; parts[++np] = $5 }
            t[$2 " " k " " $5] = $7 + $9
        }
        $1 == "breakdown" && $5 == "total" { step[$2 " " $3 " " $4] = $7 }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; o = "libfsdp " k; e = "torch-eager " k
                if (!((o in step) && (e in step))) continue
                printf "\n== breakdown %s (fwd + bwd ms per step, synchronised at every hook)\n", k
                printf "%-15s %10s %12s %10s\n", "part", "libfsdp", "torch eager", "difference"
                for (j = 1; j <= np; j++) {
                    a = t[o " " parts[j]]; b = t[e " " parts[j]]
                    printf "%-15s %10.3f %12.3f %+10.3f\n", parts[j], a, b, a - b
                }
                printf "%-15s %10.3f %12.3f %+10.3f\n", "step", step[o], step[e], step[o] - step[e]
            }
        }'
fi
