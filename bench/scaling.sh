#!/usr/bin/env bash
# scaling.sh: everything about speed on the cores of one machine, in one run:
#   1. bench_scaling --profile: ms/step of the MLP at 1, 2 and 4 ranks (FULL_SHARD,
#      SHARD_GRAD_OP, replicate, 2x2 TP) and in one rank with 2 and 4 threads, against one rank
#      on one thread (speed-up, fraction of linear in the cores used), and the profile of
#      each layout;
#   2. the same step in PyTorch (bench/scaling_torch.py) with 1, 2 and 4 threads, and
#      libfsdp's one rank with the same threads against it (skipped, with a line, when torch
#      is not importable);
#   3. bench_comm at 4 rank threads up to 64 MiB: busbw as a fraction of memcpy;
#   4. the goals of issue 19 against those figures.
#
# Usage: bench/scaling.sh [BUILD_DIR] [-- OPTIONS]
#   BUILD_DIR  the build holding bench/bench_scaling and bench/bench_comm (default: build)
#   OPTIONS    go to bench_scaling (bench_scaling --help lists them), and its --widths,
#              --batch, --steps and --warmup to scaling_torch.py, e.g. --steps 10 --batch 512
#   -h, --help prints this help
# Prints the four parts above, each under a "== N." heading. Writes no file.
# Exit status: 0 done (also without PyTorch); 2 bad command line or BUILD_DIR without the
# programs; otherwise the failing program's status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli.bash"
bench_cli scaling.sh "bench_scaling bench_comm" "$@"
set -- ${prog_args[@]+"${prog_args[@]}"}

echo "== 1. scaling on this machine's cores (libfsdp)"
ours=$("$build/bench/bench_scaling" --profile "$@")
echo "$ours"

echo
echo "== 2. one rank with T threads against PyTorch with T threads"
torch_args=()
while [ $# -gt 0 ]; do # scaling_torch.py takes --widths, --batch, --steps, --warmup
    case "$1" in
    --widths | --batch | --steps | --warmup) torch_args+=("$1" "$2"); shift 2 ;;
    *) shift ;;
    esac
done
if python3 -c 'import torch' 2>/dev/null; then
    theirs=$(python3 "$here/scaling_torch.py" --threads 1,2,4 ${torch_args[@]+"${torch_args[@]}"})
    echo "$theirs"
    echo "threads  libfsdp ms  pytorch ms  pytorch/libfsdp (above 1: libfsdp faster)"
    for t in 1 2 4; do
        a=$(echo "$ours" | awk -v t="$t" '$1 == "one" && $2 == "rank" && $3 == 1 && $4 == t {print $5; exit}')
        b=$(echo "$theirs" | awk -v t="$t" '$1 == "pytorch" && $3 == t {print $5}')
        [ -n "$a" ] && [ -n "$b" ] &&
            awk -v t="$t" -v a="$a" -v b="$b" 'BEGIN {printf "%7d %11.1f %11.1f %16.2f\n", t, a, b, b / a}'
    done
else
    echo "PyTorch is not importable here (pip install torch): no comparison"
fi

echo
echo "== 3. collectives of the local backend, 4 rank threads"
comm=$("$build/bench/bench_comm" --ranks 4 --max-bytes 67108864)
echo "$comm"

echo
echo "== 4. goals (issue 19)"
echo "$ours" | awk '$2 == 2 && $3 == 1 && ($1 == "FULL_SHARD" || $1 == "SHARD_GRAD_OP" || $1 == "replicate") {
    printf "2 ranks >= 1.7x one rank on one core: %-13s %s\n", $1, $5 }'
if [ -n "${theirs:-}" ]; then
    a=$(echo "$ours" | awk '$1 == "one" && $2 == "rank" && $3 == 1 && $4 == 2 {print $5; exit}')
    b=$(echo "$theirs" | awk '$1 == "pytorch" && $3 == 2 {print $5}')
    [ -n "$a" ] && [ -n "$b" ] &&
        awk -v a="$a" -v b="$b" 'BEGIN {printf "one rank with 2 threads no slower than PyTorch with 2: %.1f ms vs %.1f ms (%s)\n", a, b, a <= b ? "met" : "not met"}'
fi
echo "$comm" | awk '($1 == "all_gather" || $1 == "reduce_scatter") && $2 >= 16777216 {
    printf "%-14s %9d bytes >= 50%% of memcpy: %s\n", $1, $2, $7 }'
