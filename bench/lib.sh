# Shell helpers the bench/run_*_bench.sh scripts source. They expect
# `launcher` (dtrain-run's path) and `cores` to be set by the script.

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
