#!/usr/bin/env bash
# gpu_session_dry_run.sh: CTest's check of scripts/gpu-session.sh --dry-run: it exits 0, and its
# summary.tsv has the header and one line per phase in order, env ok and every other phase
# skipped with a reason, each with its log or none.
# Usage: tests/gpu_session_dry_run.sh SCRIPT OUT_DIR
set -euo pipefail
script=$1 out=$2
rm -rf "$out"
fail() {
    echo "gpu_session_dry_run: $*" >&2
    echo "--- summary.tsv" >&2
    cat "$out/summary.tsv" >&2 || true
    exit 1
}

rc=0
bash "$script" --dry-run "$out" || rc=$?
[ "$rc" -eq 0 ] || fail "the dry run exited $rc, want 0"
summary=$out/summary.tsv
[ -f "$summary" ] || fail "no $summary"
[ "$(head -1 "$summary")" = "$(printf 'phase\tstatus\tseconds\tnote')" ] || fail "bad header"

mapfile -t phases < <(bash "$script" --list-phases)
[ "${#phases[@]}" -ge 10 ] || fail "only ${#phases[@]} phases listed"
mapfile -t lines < <(tail -n +2 "$summary")
[ "${#lines[@]}" -eq "${#phases[@]}" ] ||
    fail "${#lines[@]} lines for ${#phases[@]} phases (${phases[*]})"
for i in "${!phases[@]}"; do
    IFS=$'\t' read -r phase status seconds note extra <<<"${lines[$i]}"
    want=${phases[$i]}
    [ "$phase" = "$want" ] || fail "line $((i + 2)) is phase '$phase', want '$want'"
    [ -z "${extra:-}" ] || fail "$phase: more than 4 columns"
    [[ "$seconds" =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "$phase: seconds '$seconds' is not a number"
    if [ "$phase" = env ]; then
        [ "$status" = ok ] || fail "env: status '$status', want ok"
        [ -s "$out/env.log" ] || fail "env: no env.log"
    else
        [ "$status" = skip ] || fail "$phase: status '$status', want skip"
        [ -n "$note" ] || fail "$phase: skipped without a reason"
    fi
done
grep -q 'dry run' "$summary" || fail "no phase names the dry run as its reason"
echo "gpu_session_dry_run: ${#phases[@]} phases, env ok, the others skipped"
