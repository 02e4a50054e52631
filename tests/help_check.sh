#!/usr/bin/env bash
# help_check.sh: CTest's check that every program and script answers --help and -h with its
# usage and does nothing else, and refuses an unknown option: fsdp-train, fsdp-ckpt and each of
# its commands, every benchmark program the build made (BUILD/bench/bench_*), every bench/*.sh
# and scripts/*.sh, and the Python scripts of bench/ and tools/, which must read their command
# line before they import torch, transformers, h5py or numpy (seconds each).
# Each run happens in a fresh empty folder, with apt-get, sudo, dpkg-query,
# cmake, ctest, make, nvidia-smi, mpirun, python3 and pip replaced by stubs that note the call:
#   --help, -h: exit 0, usage on stdout, nothing created, no stub called;
#   --no-such-option: exit 2, the problem and usage on stderr, nothing on stdout, nothing
#   created, no stub called.
# A run is killed after 60 s and may write at most 10 MiB, so a program that takes --help for
# something else fails here instead of running its benchmark.
# Usage: tests/help_check.sh SOURCE_DIR BUILD_DIR FSDP_TRAIN FSDP_CKPT [--no-python]
# --no-python leaves the Python scripts out: the sanitizer builds' entries pass it, since the
# scripts run the same interpreter whatever the build.
set -uo pipefail
src=$1 build=$2 train=$3 ckpt=$4 python=${5:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/stubs"
for stub in apt-get apt sudo dpkg-query cmake ctest make nvidia-smi mpirun python3 pip pip3; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\nexit 97\n' "$stub" "$tmp/calls" >"$tmp/stubs/$stub"
    chmod +x "$tmp/stubs/$stub"
done

failures=0 runs=0
fail() {
    echo "help_check: $*" >&2
    failures=$((failures + 1))
}

# run ARG CMD...: runs CMD ARG in a fresh folder; its stdout, stderr and exit status in $tmp/out,
# $tmp/err and $rc, what it created and called in $created and $called.
run() {
    local arg=$1 dir
    shift
    dir=$(mktemp -d "$tmp/run.XXXXXX")
    : >"$tmp/calls"
    rc=0
    (
        cd "$dir" || exit 99
        ulimit -f 10240
        PATH="$tmp/stubs:$PATH" exec timeout -k 5 60 "$@" "$arg" </dev/null
    ) >"$tmp/out" 2>"$tmp/err" || rc=$?
    runs=$((runs + 1))
    created=$(ls -A "$dir" | head -5 | tr '\n' ' ')
    called=$(head -3 "$tmp/calls" | tr '\n' ';')
    rm -rf "$dir"
}

# verify WANT_RC NAME: what the last run must have done for --help or -h (WANT_RC 0: usage on
# stdout) or an unknown option (2: the problem on stderr, nothing on stdout).
verify() {
    local want=$1 name=$2
    [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, want $want; stderr: $(head -c 300 "$tmp/err")"
    if [ "$want" -eq 0 ]; then
        [ -s "$tmp/out" ] || fail "$name: printed nothing on stdout"
    else
        [ -s "$tmp/err" ] || fail "$name: printed nothing on stderr"
        [ ! -s "$tmp/out" ] || fail "$name: printed on stdout: $(head -c 200 "$tmp/out")"
    fi
    [ -z "$created" ] || fail "$name: created $created"
    [ -z "$called" ] || fail "$name: called $called"
}

check() {
    local want=$1 arg=$2
    shift 2
    run "$arg" "$@"
    verify "$want" "$* $arg"
}

check_all() {
    check 0 --help "$@"
    check 0 -h "$@"
    check 2 --no-such-option "$@"
}

check_all "$train"
check_all "$ckpt"
# fsdp-ckpt's commands, as its usage lists them
commands=$("$ckpt" --help | awk '/^Commands/ {on = 1; next} on && /^$/ {exit}
    on && /^  [a-z]+ / {print $1}')
[ "$(echo "$commands" | wc -w)" -ge 5 ] || fail "fsdp-ckpt --help lists only: $commands"
for c in $commands; do check_all "$ckpt" "$c"; done

n_bench=0
for exe in "$build"/bench/bench_*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    n_bench=$((n_bench + 1))
    check_all "$exe"
done

n_scripts=0
for script in "$src"/bench/*.sh "$src"/scripts/*.sh; do
    n_scripts=$((n_scripts + 1))
    case $(head -1 "$script") in
    *bash*) check_all bash "$script" ;;
    *) check_all sh "$script" ;;
    esac
done
[ "$n_scripts" -ge 9 ] || fail "only $n_scripts scripts found under $src/bench and $src/scripts"

# The Python scripts of bench/ and tools/ (argparse's --help, -h and exit status 2), with the
# real interpreter and, first on its path, stand-ins for torch, transformers, h5py and numpy whose
# import fails: a script reads its command line before it imports them (3-7 s for torch), so its
# --help needs none of them, here or where they are missing. One that imports another module this
# machine lacks before its command line is named as not checked.
py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || true)
[ "$python" = --no-python ] && py=
for module in torch transformers h5py numpy; do
    mkdir -p "$tmp/pystubs/$module"
    printf 'raise ImportError("help_check: %s imported before the command line was read")\n' \
        "$module" >"$tmp/pystubs/$module/__init__.py"
done
pyrun=(env PYTHONPATH="$tmp/pystubs" PYTHONDONTWRITEBYTECODE=1 "$py")
n_py=0 unchecked=""
for script in "$src"/bench/*.py "$src"/tools/*.py; do
    [ -n "$py" ] || break
    run --help "${pyrun[@]}" "$script"
    if [ "$rc" -ne 0 ] && grep -q "ModuleNotFoundError" "$tmp/err"; then
        unchecked="$unchecked $(basename "$script")"
        continue
    fi
    n_py=$((n_py + 1))
    verify 0 "$script --help"
    run -h "${pyrun[@]}" "$script"
    verify 0 "$script -h"
    run --no-such-option "${pyrun[@]}" "$script"
    verify 2 "$script --no-such-option"
done

echo "help_check: $runs runs: fsdp-train, fsdp-ckpt and its commands ($(echo $commands)), $n_bench" \
    "benchmark programs of this build, $n_scripts scripts, $n_py Python scripts" \
    "(${py:-no python3}; not checked for a missing module:${unchecked:- none}); $failures failed"
[ "$failures" -eq 0 ]
