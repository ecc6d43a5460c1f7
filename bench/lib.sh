# Shell helpers the bench/run_*_bench.sh scripts source. bench_args needs
# `repo`; launch needs `launcher` (dtrain-run's path) and `cores`.

# bench_args JSON_NAME "$@": the arguments every such script takes,
# [BUILD_DIR] [--repeat N] [--json PATH]. Sets build (absolute, default
# build), repeat (default 3) and json (default bench/results/JSON_NAME).
bench_args() {
  local name=$1
  shift
  build=${1:-build}
  shift || true
  repeat=3
  json=$repo/bench/results/$name
  while [[ $# -gt 0 ]]; do
    case $1 in
      --repeat) repeat=$2 ;;
      --json) json=$2 ;;
      *) echo "usage: bench/$(basename "$0") [BUILD_DIR] [--repeat N] [--json PATH]" >&2; exit 2 ;;
    esac
    shift 2
  done
  case $build in /*) ;; *) build=$repo/$build ;; esac
}

# bench_options USAGE "$@": [BUILD_DIR] [--repeat N] [--steps N] [--json PATH]
# [--no-setup], and any flag the script takes itself through its
# bench_extra_option FLAG (return 0 when it took the flag). The caller sets
# the defaults of build, repeat, steps, json and setup first; this makes
# build and json absolute.
bench_options() {
  local usage=$1
  shift
  if [[ $# -gt 0 && $1 != --* ]]; then
    build=$1
    shift
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --repeat) repeat=$2; shift ;;
      --steps) steps=$2; shift ;;
      --json) json=$2; shift ;;
      --no-setup) setup=0 ;;
      *)
        if ! declare -F bench_extra_option > /dev/null || ! bench_extra_option "$1"; then
          echo "$usage" >&2
          exit 2
        fi ;;
    esac
    shift
  done
  case $build in /*) ;; *) build=$repo/$build ;; esac
  case $json in /*) ;; *) json=$PWD/$json ;; esac
}

logged() {  # logged LOG command...: keeps the output out of the tables, shows it on failure
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    cat "$log" >&2
    echo "$(basename "$0"): failed: $*" >&2
    exit 1
  fi
}

with_threads() {  # with_threads T command...: the same thread settings for either side
  local t=$1
  shift
  OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$@"
}

launch() {  # launch RANKS LOG command...: RANKS processes, cores / RANKS threads each
  local n=$1 log=$2
  shift 2
  local t=$((cores / n > 0 ? cores / n : 1))
  logged "$log" with_threads "$t" "$launcher" --nproc-per-node "$n" "$@"
}
