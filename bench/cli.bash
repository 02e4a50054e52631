# cli.bash: the command line of the bench/ wrapper scripts (llama.sh, scaling.sh, cuda_mlp.sh),
# sourced by them: [BUILD_DIR] [-- OPTIONS], and -h / --help anywhere before the options.
#
# bench_cli NAME "PROGRAM..." ARGS...: parses ARGS into `build` (default: build) and the array
# `prog_args` (what follows --, for the programs). -h / --help prints the usage (the calling
# script's opening comment) to stdout and exits 0; a bad command line, or a BUILD_DIR without
# one of the PROGRAMs under bench/, prints NAME: the problem and the usage to stderr and exits 2.
bench_usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
bench_bad() {
    echo "$1: $2" >&2
    bench_usage >&2
    exit 2
}
bench_cli() {
    local name=$1 programs=$2 p
    shift 2
    build=build
    case ${1:-} in
    -h | --help) bench_usage && exit 0 ;;
    -- | "") ;;
    -*) bench_bad "$name" "unknown option '$1'" ;;
    *) build=$1 && shift ;;
    esac
    case ${1:-} in
    "") ;;
    --) shift ;;
    -h | --help) bench_usage && exit 0 ;;
    *) bench_bad "$name" "unexpected argument '$1' (options for the programs go after --)" ;;
    esac
    for p in $programs; do
        [ -x "$build/bench/$p" ] ||
            bench_bad "$name" "$build/bench/$p is missing; build first (cmake --build $build)"
    done
    prog_args=("$@")
}
