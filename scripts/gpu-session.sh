#!/usr/bin/env bash
# gpu-session.sh: what a GPU machine checks, in one command and a bounded time (default 540 s):
# the environment, a build for sm_90, the GPU suites, the attention kernels (tiled against plain,
# timed at the Llama benchmark's shapes), the bf16 GEMM on cuBLASLt against cublasLtMatmul
# called directly (the Llama shapes' GEMMs), FSDP at world 1 against PyTorch FSDP2 and
# prefetch's overlap with two rank threads (bench/fsdp_gpu.sh), fsdp-train on examples/llama-gpu.ini
# for 40 steps, the real NCCL at world size 1 (and two
# ranks on the GPU where NCCL is 2.30 or newer), compute-sanitizer (memcheck, racecheck,
# initcheck) on the CUDA suites, the Llama and MLP GPU benchmarks against PyTorch, and the
# scaling benchmark.
#
#   scripts/gpu-session.sh [--dry-run] OUT_DIR
#   scripts/gpu-session.sh --list-phases
#   scripts/gpu-session.sh --help        (or -h: prints this help)
#
# Each phase runs under its own timeout, writes OUT_DIR/<phase>.log and, as soon as it ends,
# appends a line to OUT_DIR/summary.tsv (after a header line), so a session cut short still
# reports what it did: phase, status (ok, fail, skip or timeout), seconds, and a note (why it
# was skipped, what failed, or its key figure). The exit status is 0 when no phase failed or
# timed out, 1 otherwise, 2 for a usage error.
#
# Without a GPU (`nvidia-smi -L` fails), or with --dry-run, the session records the environment
# and marks every other phase skipped with the reason; the build is skipped too, since CI builds
# compile the CUDA code already. tests/gpu_session_dry_run.sh runs it so in CTest.
#
# Test dependencies missing on the GPU machine (CUnit, inih): if a .debs/ directory exists at the
# repository root, the first phase unpacks every .deb in it over / and runs ldconfig (as root).
# To carry libcunit1, libcunit1-dev, libinih1, libinih-dev, libinireader0 and jansson there (packages of
# the GPU machine's release), in a checkout (in a git worktree, use the file that
# `git rev-parse --git-path info/exclude` names):
#   echo /.debs/ >> .git/info/exclude; mkdir -p .debs
#   (cd .debs && apt-get download libcunit1 libcunit1-dev libinih1 libinih-dev libinireader0 \
#       libjansson4 libjansson-dev)
#
# Environment: GPU_SESSION_BUDGET (seconds for the whole session, default 540), GPU_SESSION_SKIP
# (phases not to run, separated by spaces: e.g. "bench scaling"; the time kept for them goes to
# the others), GPU_SESSION_WERROR (the build's FSDP_WERROR, default OFF),
# GPU_SESSION_BUILD (the build directory, default build-gpu at the repository root),
# GPU_SESSION_LLAMA_MODES (bench-llama's modes, default bf16), GPU_SESSION_ATTENTION and
# GPU_SESSION_GEMM (bench-llama's FSDP_CUDA_ATTENTION and FSDP_CUDA_GEMM, default auto and lt),
# JOBS (build parallelism, default all cores).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self="$repo/scripts/gpu-session.sh"
build=${GPU_SESSION_BUILD:-$repo/build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
budget=${GPU_SESSION_BUDGET:-540}
if [ -d /usr/local/cuda/bin ]; then PATH="/usr/local/cuda/bin:$PATH"; fi

PHASES=(deps env build gpu-tests bench-attention bench-gemm nccl bench-fsdp train-example memcheck-kernels
    memcheck-train memcheck-llama racecheck-kernels initcheck-kernels racecheck-llama
    initcheck-llama bench-llama bench scaling)
# The most seconds each phase may take; the session's budget may leave it less.
declare -A CAP=([deps]=60 [env]=90 [build]=240 [gpu-tests]=120 [bench-attention]=60 [bench-gemm]=45
    [bench-fsdp]=75 [nccl]=90 [train-example]=45
    [memcheck-kernels]=90 [memcheck-train]=45 [memcheck-llama]=60 [racecheck-kernels]=90
    [initcheck-kernels]=90 [racecheck-llama]=60 [initcheck-llama]=60 [bench-llama]=240 [bench]=120 [scaling]=150)
# The suite each sanitizer phase runs.
declare -A SUITE=([kernels]=test_kernels_cuda [train]=test_cuda_train [llama]=test_llama_cuda)
# Seconds a phase leaves to the benchmarks after it, and the least worth starting a phase with.
RESERVE_LLAMA=200
RESERVE_BENCH=120
RESERVE_SCALING=60
MIN_PHASE=15

# The comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$self"; }
# A bad command line: the problem in one line, then the usage, on stderr; exit 2.
bad() {
    echo "gpu-session.sh: $1" >&2
    usage >&2
    exit 2
}

# ---- phases (each runs as `gpu-session.sh --phase NAME`, its output in NAME.log) ----

# The phase's status and note, for the session to record (without it, the exit status decides).
result() { printf '%s\t%s\n' "$1" "$2" >"$GPU_SESSION_OUT/.$GPU_SESSION_PHASE.result"; }

# This phase's log: its standard output and error, which the session writes there.
own_log() { echo "$GPU_SESSION_OUT/$GPU_SESSION_PHASE.log"; }

# Prints the command, then runs it.
run() {
    echo "+ $*"
    "$@"
}

# A section of env.log: the command and its output, whatever its status.
show() {
    printf '\n== %s\n' "$*"
    timeout 30 "$@" 2>&1 || echo "(exit status $?)"
}

phase_deps() {
    shopt -s nullglob
    local debs=("$repo"/.debs/*.deb) f names=()
    if [ ${#debs[@]} -eq 0 ]; then
        result skip "no .deb files in .debs/"
        return 0
    fi
    for f in "${debs[@]}"; do
        run dpkg -x "$f" /
        names+=("$(basename "$f" | cut -d_ -f1)")
    done
    run ldconfig
    result ok "unpacked ${#debs[@]}: ${names[*]}"
}

phase_env() {
    show nvidia-smi
    show nvidia-smi -L
    show nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    show cat /proc/driver/nvidia/version
    show nvcc --version
    show compute-sanitizer --version
    show gcc --version
    show cmake --version
    printf '\n== CUDA toolkit components (version.json)\n'
    grep -A1 -E '"(cuda|cuda_cudart|libcublas|cuda_sanitizer_api)"' \
        /usr/local/cuda/version.json 2>&1 || true
    printf '\n== cuBLAS, cuDNN and NCCL libraries (ldconfig)\n'
    ldconfig -p 2>/dev/null | grep -E 'libcublas|libcudnn|libnccl' || echo "(none registered)"
    printf '\n== NVIDIA and torch Python packages\n'
    timeout 60 python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-)' || echo "(none)"
    # One import of torch (slow on a loaded machine): its first line is the summary's.
    printf '\n== torch: version, CUDA, cuDNN, NCCL\n'
    local torch_info
    torch_info=$(timeout 60 python3 -c 'import torch
print(torch.__version__, "CUDA", torch.version.cuda)
print("cudnn", torch.backends.cudnn.version())
try:
    print("nccl", torch.cuda.nccl.version())
except Exception as e:
    print("nccl unknown:", e)
print("cuda available", torch.cuda.is_available())' 2>&1) || torch_info="(exit status $?) $torch_info"
    echo "$torch_info"
    show nproc
    show lscpu
    local gpu nvcc torch
    gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
        head -1 | sed 's/, / driver /') || true
    nvcc=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1) || true
    torch=none
    if [[ "$torch_info" != "(exit status"* ]]; then torch=$(head -1 <<<"$torch_info"); fi
    result ok "GPU: ${gpu:-none}; nvcc ${nvcc:-none}; torch ${torch:-none}; $(nproc) CPUs"
}

phase_build() {
    # Warnings are not errors here: the GPU machine's compiler (Ubuntu's, with _FORTIFY_SOURCE)
    # warns where CI's does not, and a warning must not cost the session; the note counts them.
    local werror=${GPU_SESSION_WERROR:-OFF} warnings
    run cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSDP_WERROR="$werror" \
        -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
    run cmake --build "$build" -j "$jobs"
    warnings=$(grep -c 'warning:' "$(own_log)") || true
    result ok "$build, FSDP_CUDA=ON, sm_90, -j $jobs, FSDP_WERROR=$werror, ${warnings:-0} warnings"
}

# The CTest entries named in a ctest log that did not pass: "name (Failed), ...".
not_passed() {
    grep -oE '[0-9]+ - [A-Za-z0-9_]+ \([A-Za-z ]+\)' "$1" | sed 's/^[0-9]* - //' | paste -sd, - |
        sed 's/,/, /g'
}

phase_gpu_tests() {
    local log rc=0
    log=$(own_log)
    # test_kernels_cuda alone (it exhausts the GPU's memory on purpose), then the others four at
    # a time: they share the GPU, and their CPU passes (rank threads) use the host's cores.
    echo "+ FSDP_TEST_REQUIRE_DEVICE=cuda ctest --test-dir $build -L gpu -R '^test_kernels_cuda\$'"
    FSDP_TEST_REQUIRE_DEVICE=cuda ctest --test-dir "$build" -L gpu -R '^test_kernels_cuda$' \
        --no-tests=error --output-on-failure || rc=$?
    echo "+ FSDP_TEST_REQUIRE_DEVICE=cuda ctest --test-dir $build -L gpu -E '^test_kernels_cuda\$' -j 4"
    FSDP_TEST_REQUIRE_DEVICE=cuda ctest --test-dir "$build" -L gpu -E '^test_kernels_cuda$' -j 4 \
        --no-tests=error --output-on-failure || rc=$?
    local line bad
    line=$(grep -E 'tests passed' "$log" | paste -sd';' -) || true
    bad=$(not_passed "$log") || true
    if [ "$rc" -ne 0 ]; then
        result fail "${line:-ctest exit status $rc}: ${bad:-see gpu-tests.log}"
    elif grep -q '(Skipped)' "$log"; then
        result fail "skipped on a GPU machine: $bad"
    else
        result ok "$line"
    fi
}

# The nccl backend over the real NCCL on cuda:0 (test_comm_nccl with FSDP_TEST_NCCL_REAL=1): at
# world size 1 every collective against the local backend, a mesh split and an abort; with
# NCCL 2.30 or newer also two ranks on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1), which NCCL
# calls experimental and which may lock: the phase's timeout bounds it.
phase_nccl() {
    local exe="$build/tests/test_comm_nccl" log rc=0
    log=$(own_log)
    if [ ! -x "$exe" ]; then
        result fail "no $exe: the build has no nccl backend (CMake found no NCCL?)"
        return 0
    fi
    echo "+ FSDP_TEST_NCCL_REAL=1 NCCL_MULTI_RANK_GPU_ENABLE=1 FSDP_TEST_REQUIRE_DEVICE=cuda $exe"
    FSDP_TEST_NCCL_REAL=1 NCCL_MULTI_RANK_GPU_ENABLE=1 FSDP_TEST_REQUIRE_DEVICE=cuda \
        timeout -k 5 80 "$exe" || rc=$?
    local summary
    summary=$(grep -E '^ +tests ' "$log" | tail -1 | tr -s ' ') || true
    if [ "$rc" -ne 0 ]; then
        result fail "exit status $rc (124: timed out);${summary:- see nccl.log}"
    else
        result ok "$(grep -m1 -oE 'NCCL [0-9]+\.[0-9]+\.[0-9]+' "$log" || true);$summary"
    fi
}

# The executable of a CTest entry, from the build's test list.
executable_of() {
    local exe
    exe=$(ctest --test-dir "$build" --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    if t["name"] == sys.argv[1]:
        print(t["command"][0])' "$1" 2>/dev/null) || true
    if [ -z "$exe" ]; then exe=$(find "$build" -type f -name "$1" -perm -u+x | head -1); fi
    echo "$exe"
}

# compute-sanitizer TOOL on SUITE. API errors are not reported: test_kernels_cuda provokes a
# failing cudaMalloc on purpose (and this is the invocation docs/cuda.md reports).
sanitize() {
    local tool=$1 suite=$2 san exe rc=0
    san=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null) || true
    if [ -z "$san" ]; then
        result skip "compute-sanitizer not found (PATH, /usr/local/cuda)"
        return 0
    fi
    exe=$(executable_of "$suite")
    if [ -z "$exe" ] || [ ! -x "$exe" ]; then
        result fail "no executable for $suite in $build"
        return 0
    fi
    local log
    log=$(own_log)
    # A device compute-sanitizer refuses (seen on gVisor machines: "Device not supported") is
    # found by the first sanitizer phase; the later ones are skipped at once.
    if [ -f "$GPU_SESSION_OUT/.no-sanitizer" ]; then
        result skip "$(cat "$GPU_SESSION_OUT/.no-sanitizer")"
        return 0
    fi
    cd "$(dirname "$exe")"
    echo "+ FSDP_TEST_REQUIRE_DEVICE=cuda $san --tool $tool --error-exitcode 1 --report-api-errors no $exe"
    FSDP_TEST_REQUIRE_DEVICE=cuda "$san" --tool "$tool" --error-exitcode 1 \
        --report-api-errors no "$exe" || rc=$?
    local summary failed
    summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//') || true
    failed=$(grep -oE 'Test: [A-Za-z0-9_]+ \.\.\.FAILED' "$log" | cut -d' ' -f2 | paste -sd, -) || true
    if [ "$rc" -ne 0 ] && grep -q 'Device not supported' "$log"; then
        echo "compute-sanitizer does not support this device (Device not supported)" \
            >"$GPU_SESSION_OUT/.no-sanitizer"
        result skip "$(cat "$GPU_SESSION_OUT/.no-sanitizer")"
        return 0
    fi
    case $rc in
    0) result ok "$suite: ${summary:-no summary line}" ;;
    77) result fail "$suite: every case skipped, so the GPU was not exercised" ;;
    *) result fail "$suite exit status $rc: ${summary:-no summary line}${failed:+; failed cases: $failed}" ;;
    esac
}

phase_bench() {
    local log rc=0
    log=$(own_log)
    run bash "$repo/bench/cuda_mlp.sh" "$build" || rc=$?
    if [ "$rc" -ne 0 ]; then
        result fail "bench/cuda_mlp.sh exit status $rc"
        return 0
    fi
    local ours ratios
    ours=$(awk '$1 == "libfsdp" && ($2 == "f32" || $2 == "tf32") {printf "%s%s %s ms", s, $2, $3; s = ", "}' "$log")
    ratios=$(awk 'NF == 4 && ($1 == "f32" || $1 == "tf32") && $4 != "n/a" {printf "%s%s %s", s, $1, $4; s = ", "}' "$log")
    if [ -z "$ours" ]; then
        result fail "bench_cuda_mlp timed no step: $(grep -m1 '^bench_cuda_mlp' "$log" || echo 'see bench.log')"
    elif [ -z "$ratios" ]; then
        result ok "libfsdp $ours; no PyTorch comparison (PyTorch with CUDA not importable)"
    else
        result ok "PyTorch ms / libfsdp ms (above 1: libfsdp faster): $ratios; libfsdp $ours"
    fi
}

# bench_cuda_attention: the tiled attention and the GEMM path (f32) against the plain one at
# shapes S and M (norm-wise, within test_kernels_cuda's bound; the GEMM path in TF32 printed),
# cuDNN's within a bf16 bound, each timed (a forward plus a backward).
phase_bench_attention() {
    local log rc=0 exe=$build/bench/bench_cuda_attention
    log=$(own_log)
    [ -x "$exe" ] || { result fail "no $exe (built with FSDP_BUILD_BENCH=ON?)" && return 0; }
    run "$exe" || rc=$?
    local times bad
    times=$(awk '$1 == "result" {printf "%s%s %s %s ms", s, $2, $3, $4; s = ", "}
        $1 == "speedup" {printf "%s%s %s %s", s, $2, $3, $4; s = ", "}' "$log")
    bad=$(awk '$1 == "compare" && $NF != "ok" {printf "%s%s %s %s", s, $2, $3, $4; s = ", "}' "$log")
    if [ "$rc" -ne 0 ]; then
        result fail "bench_cuda_attention exit status $rc${bad:+; out of bound: $bad}${times:+; $times}"
    elif [ -z "$times" ]; then
        result fail "no timing: $(grep -m1 skipped "$log" || echo 'see bench-attention.log')"
    else
        result ok "flash and gemm within bound of plain; $times"
    fi
}

# bench_cuda_gemm bf16 and epilogue: gemm_bf16, and the fused bias (+ GELU) forward, on cuBLASLt
# against cublasLtMatmul called directly (with the same epilogue) at the Llama shapes' GEMMs (and
# on cuBLAS for reference); ok when both smallest ratios are 0.95 or more.
phase_bench_gemm() {
    local log rc=0 exe=$build/bench/bench_cuda_gemm
    log=$(own_log)
    [ -x "$exe" ] || { result fail "no $exe (built with FSDP_BUILD_BENCH=ON?)" && return 0; }
    run "$exe" bf16 || rc=$?
    [ "$rc" -ne 0 ] || run "$exe" epilogue || rc=$?
    local ratio epi
    ratio=$(awk '$1 == "lt_ratio_min" {print $2}' "$log")
    epi=$(awk '$1 == "epilogue_ratio_min" {print $2}' "$log")
    local figs="lt/direct min ${ratio:-n/a}, epilogue lt/direct min ${epi:-n/a}"
    if [ "$rc" -ne 0 ]; then
        result fail "bench_cuda_gemm exit status $rc; $figs"
    elif [ -z "$ratio" ] || [ -z "$epi" ]; then
        result fail "no ratio: $(grep -m1 skipped "$log" || echo 'see bench-gemm.log')"
    elif awk -v r="$ratio" -v e="$epi" 'BEGIN {exit !(r >= 0.95 && e >= 0.95)}'; then
        result ok "bf16 table on cuBLASLt / cublasLtMatmul direct: $figs (goal 0.95)"
    else
        result fail "bf16 table on cuBLASLt / cublasLtMatmul direct: $figs, a ratio under 0.95"
    fi
}

# bench/fsdp_gpu.sh: FSDP at world 1 with bf16 mixed precision against PyTorch FSDP2, and the
# share of all_gather time prefetch hides with two rank threads on the GPU.
phase_bench_fsdp() {
    local log rc=0
    log=$(own_log)
    run bash "$repo/bench/fsdp_gpu.sh" "$build" || rc=$?
    local mp ov ratio
    mp=$(awk '$1 == "result" && $3 == "mp" {printf "%s%s %s ms", s, $2, $5; s = ", "}' "$log")
    ov=$(awk '$1 == "result" && $3 == "overlap" {printf "2 ranks: off %s ms, on %s ms, gathers %s ms, hidden %s", $5, $7, $9, $11}' "$log")
    ratio=$(awk '$1 == "ratio" {print "pytorch/libfsdp " $4}' "$log")
    if [ "$rc" -ne 0 ]; then
        result fail "bench/fsdp_gpu.sh exit status $rc${mp:+; $mp}"
    elif [ -z "$mp" ]; then
        result fail "no figure: $(grep -m1 -E 'skipped|failed' "$log" || echo 'see bench-fsdp.log')"
    else
        result ok "$mp${ratio:+ ($ratio)}${ov:+; $ov}"
    fi
}

# fsdp-train itself on the GPU: examples/llama-gpu.ini (85 M parameters, bf16, one rank) for
# 40 steps, no checkpoint; the note has the last progress line's tokens/s, mfu and memory.
phase_train_example() {
    local log rc=0
    log=$(own_log)
    (cd "$repo" && run "$build/fsdp-train" --config examples/llama-gpu.ini --set train.steps=40 \
        --set train.log_every=10 --set train.eval_every=0 --set optim.warmup_steps=5 \
        --set checkpoint.dir= --set log.metrics= --set log.progress=lines) || rc=$?
    local last
    last=$(grep '^step ' "$log" | tail -1 | grep -oE 'tokens/s [0-9]+.*' || true)
    if [ "$rc" -ne 0 ]; then
        result fail "fsdp-train exit status $rc: $(grep -m1 'fsdp-train:' "$log" || echo 'see train-example.log')"
    elif [ -z "$last" ]; then
        result fail "no progress line: see train-example.log"
    else
        result ok "examples/llama-gpu.ini, 40 steps: $last"
    fi
}

# bench/llama_gpu.sh within this phase's limit (GPU_SESSION_LIMIT), less time to print the table.
# libfsdp runs shapes S and M (building M initialises 1.5 G parameters on the CPU, over up to 16
# threads; what does not fit the budget is skipped with the reason), in the goals' mode, bf16,
# only: the f32 and TF32 figures are on record (bench/README.md), and the phase's minutes go to
# M and the breakdowns (GPU_SESSION_LLAMA_MODES, e.g. bf16,tf32,f32, times more). --breakdown:
# libfsdp's step per part (its 'breakdown' lines are in the log, not the note). Then, only when
# at least LLAMA_CKPT_MIN s of the phase are left, S bf16 again with every decoder layer
# checkpointed (--checkpoint, both sides, within what is left): its step time and peak memory
# against the plain run's (the figures in the note have each run's peak MiB).
LLAMA_CKPT_MIN=90
phase_bench_llama() {
    local log rc=0 limit=${GPU_SESSION_LIMIT:-200} start=$SECONDS
    log=$(own_log)
    # libfsdp on the library's defaults (auto attention: the tiled kernels in f32 and TF32,
    # cuDNN's in bf16; GEMMs on cuBLASLt); GPU_SESSION_ATTENTION / GPU_SESSION_GEMM choose
    # otherwise (e.g. flash, cublas).
    local attention=${GPU_SESSION_ATTENTION:-auto} gemm=${GPU_SESSION_GEMM:-lt}
    local modes=${GPU_SESSION_LLAMA_MODES:-bf16}
    echo "+ FSDP_CUDA_ATTENTION=$attention FSDP_CUDA_GEMM=$gemm"
    FSDP_CUDA_ATTENTION=$attention FSDP_CUDA_GEMM=$gemm run bash "$repo/bench/llama_gpu.sh" \
        --budget-s $((limit - 10)) --libfsdp-shapes S,M --modes "$modes" \
        --breakdown "$build" || rc=$?
    if [ "$rc" -ne 0 ]; then
        result fail "bench/llama_gpu.sh exit status $rc (attention $attention, gemm $gemm)"
        return 0
    fi
    local left=$((limit - (SECONDS - start) - 10)) ckpt
    if [ "$left" -ge "$LLAMA_CKPT_MIN" ]; then
        FSDP_CUDA_ATTENTION=$attention FSDP_CUDA_GEMM=$gemm run bash "$repo/bench/llama_gpu.sh" \
            --budget-s "$left" --shapes S --modes bf16 --checkpoint "$build" || rc=$?
        ckpt="checkpointed S bf16 run (budget $left s)"
        if [ "$rc" -ne 0 ]; then
            result fail "bench/llama_gpu.sh --checkpoint exit status $rc (attention $attention, gemm $gemm)"
            return 0
        fi
    else
        ckpt="S bf16 --checkpoint not run: $left s of the phase left, under $LLAMA_CKPT_MIN"
    fi
    echo "bench-llama: $ckpt"
    # Each figure: who, shape, mode, ms/step, MFU and peak MiB; then the goals' verdicts.
    local figures goals
    figures=$(awk '$1 == "result" {
        printf "%s%s %s %s %s ms mfu %s%s", s, $2, $3, $4, $6, $10, $11 == "peak_mib" ? " " $12 " MiB" : ""
        s = "; "
    }' "$log")
    goals=$(grep '^goal ' "$log" | paste -sd';' -) || true
    if [ -z "$figures" ]; then
        result fail "no figure: $(grep -m1 -E 'skipped|not importable|exit status' "$log" || echo 'see bench-llama.log')"
    else
        result ok "attention $attention, gemm $gemm: $figures${goals:+ | $goals} | $ckpt"
    fi
}

phase_scaling() {
    local log rc=0
    log=$(own_log)
    run bash "$repo/bench/scaling.sh" "$build" || rc=$?
    if [ "$rc" -ne 0 ]; then
        result fail "bench/scaling.sh exit status $rc"
        return 0
    fi
    # The goals section, shortened: speed-ups of 2 ranks, PyTorch, busbw as a fraction of memcpy.
    local goals
    goals=$(sed -n '/^== 4\. goals/,$p' "$log" | awk '
        /^2 ranks >=/ { r = r (r ? ", " : "") $(NF - 1) " " $NF }
        /^one rank with 2 threads/ { sub(/^[^:]*: /, ""); t = $0 }
        /^(all_gather|reduce_scatter) / { b = b (b ? ", " : "") $1 " " $2 / 1048576 " MiB " $NF }
        END {
            if (r) printf "2 ranks / 1 rank (goal 1.7x): %s", r
            if (t) printf "; 1 rank, 2 threads vs PyTorch: %s", t
            if (b) printf "; busbw / memcpy (goal 50%%): %s", b
        }')
    result ok "${goals:-no goals section in scaling.log}"
}

run_phase_body() {
    GPU_SESSION_PHASE=$1
    case $1 in
    deps) phase_deps ;;
    env) phase_env ;;
    build) phase_build ;;
    gpu-tests) phase_gpu_tests ;;
    nccl) phase_nccl ;;
    memcheck-* | racecheck-* | initcheck-*) sanitize "${1%%-*}" "${SUITE[${1#*-}]}" ;;
    bench-attention) phase_bench_attention ;;
    bench-gemm) phase_bench_gemm ;;
    bench-fsdp) phase_bench_fsdp ;;
    train-example) phase_train_example ;;
    bench-llama) phase_bench_llama ;;
    bench) phase_bench ;;
    scaling) phase_scaling ;;
    *) echo "no phase $1" >&2 && exit 2 ;;
    esac
}

# ---- the session ----

now() { date +%s.%N; }

# Appends a line to summary.tsv (tabs and newlines in the note become spaces) and shows it.
record() {
    local note
    note=$(printf '%s' "$4" | tr '\t\n' '  ')
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$note" >>"$out/summary.tsv"
    printf '%-18s %-7s %6ss  %s\n' "$1" "$2" "$3" "$note"
    if [ "$2" = fail ] || [ "$2" = timeout ]; then failed=1; fi
}

# Whether GPU_SESSION_SKIP names the phase.
skipped() { [[ " ${GPU_SESSION_SKIP:-} " == *" $1 "* ]]; }

# The seconds kept for a later phase: its reserve, or 0 where GPU_SESSION_SKIP names it.
keep() { if skipped "$1"; then echo 0; else echo "$2"; fi; }

# Runs a phase under its timeout (its cap, less what the budget leaves after keeping `reserve`
# seconds for later phases), or records it skipped for `reason` when that is not empty.
session_phase() {
    local name=$1 reason=$2 reserve=$3
    if [ -z "$reason" ] && skipped "$name"; then reason="GPU_SESSION_SKIP names it"; fi
    if [ -n "$reason" ]; then
        record "$name" skip 0.0 "$reason"
        return 0
    fi
    local left limit
    left=$((deadline - $(date +%s)))
    limit=$((left - reserve))
    if [ "$limit" -gt "${CAP[$name]}" ]; then limit=${CAP[$name]}; fi
    if [ "$limit" -lt "$MIN_PHASE" ]; then
        local why="not started: $left s of the session's $budget s left"
        if [ "$reserve" -gt 0 ]; then why="$why, $reserve s of them kept for the benchmarks"; fi
        record "$name" skip 0.0 "$why"
        return 0
    fi
    local t0 rc=0 secs status note
    t0=$(now)
    rm -f "$out/.$name.result"
    GPU_SESSION_OUT=$out GPU_SESSION_LIMIT=$limit timeout -k 10 "$limit" bash "$self" --phase "$name" \
        >"$out/$name.log" 2>&1 || rc=$?
    secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status=timeout note="stopped at its limit of $limit s (see $name.log)"
    elif [ -f "$out/.$name.result" ]; then
        IFS=$'\t' read -r status note <"$out/.$name.result"
        if [ "$rc" -ne 0 ] && [ "$status" = ok ]; then status=fail note="exit status $rc; $note"; fi
    elif [ "$rc" -eq 0 ]; then
        status=ok note=""
    else
        status=fail note="exit status $rc: $(grep -m1 -iE 'error|fail' "$out/$name.log" | cut -c1-200)"
    fi
    record "$name" "$status" "$secs" "$note"
    last_status=$status
}

main() {
    local dry=0 out_arg=""
    while [ $# -gt 0 ]; do
        case $1 in
        --dry-run) dry=1 ;;
        --list-phases)
            printf '%s\n' "${PHASES[@]}"
            exit 0
            ;;
        --phase)
            [ $# -eq 2 ] || bad "--phase takes one NAME and nothing after it"
            run_phase_body "$2"
            exit 0
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*) bad "unknown option '$1'" ;;
        *)
            [ -z "$out_arg" ] || bad "unexpected argument '$1' (OUT_DIR is '$out_arg')"
            out_arg=$1
            ;;
        esac
        shift
    done
    [ -n "$out_arg" ] || bad "needs OUT_DIR"
    mkdir -p "$out_arg"
    out=$(cd "$out_arg" && pwd)
    printf 'phase\tstatus\tseconds\tnote\n' >"$out/summary.tsv"
    deadline=$(($(date +%s) + budget))
    failed=0

    local reason=""
    if [ "$dry" = 1 ]; then
        reason="dry run (--dry-run)"
    elif ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
        reason="no NVIDIA GPU visible: nvidia-smi -L failed"
    fi
    echo "gpu-session: $repo -> $out (budget $budget s)${reason:+; $reason}"

    local deps_reason=$reason
    if [ ! -d "$repo/.debs" ]; then
        deps_reason="no .debs/ directory: CUnit and inih come from the system"
    elif [ -n "$reason" ]; then deps_reason="$reason: nothing unpacked"; fi
    session_phase deps "$deps_reason" 0
    session_phase env "" 0
    local build_reason=${reason:+$reason; CI builds already compile the CUDA code}
    local r_llama r_bench r_scaling
    r_llama=$(keep bench-llama "$RESERVE_LLAMA")
    r_bench=$(keep bench "$RESERVE_BENCH")
    r_scaling=$(keep scaling "$RESERVE_SCALING")
    last_status=skip
    session_phase build "$build_reason" $((r_llama + r_bench + r_scaling))
    local after=$reason
    if [ -z "$after" ] && [ "$last_status" != ok ]; then
        after="the build phase did not succeed"
    fi
    local p
    for p in gpu-tests bench-attention bench-gemm nccl bench-fsdp train-example memcheck-kernels \
        memcheck-train memcheck-llama racecheck-kernels initcheck-kernels racecheck-llama \
        initcheck-llama; do
        session_phase "$p" "$after" $((r_llama + r_bench + r_scaling))
    done
    session_phase bench-llama "$after" $((r_bench + r_scaling))
    session_phase bench "$after" "$r_scaling"
    session_phase scaling "$after" 0
    rm -f "$out"/.*.result
    echo "gpu-session: summary in $out/summary.tsv"
    exit "$failed"
}

main "$@"
