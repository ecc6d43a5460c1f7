# shellcheck shell=bash
# Shell helpers the bench/run_*_bench.sh scripts source. launch needs
# `launcher` (dtrain-run's path) and `cores`; the others need `repo`.

# bench_options USAGE "$@": the options every such script takes,
#   [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
# plus --steps N where the script sets `steps`. The caller sets the defaults
# of build, repeat, json and setup (and steps) first; this sets smoke (0 or 1)
# and makes build and json absolute.
# --smoke: one repeat and a JSON in a fresh temporary folder unless --json
# says where; each script also shrinks its sizes and steps when smoke is 1,
# so that it checks in seconds that the benchmark still runs end to end
# (CTest runs every script so, label bench-smoke: bench/CMakeLists.txt).
bench_options() {
  local usage=$1 json_given=0
  shift
  smoke=0
  if [[ $# -gt 0 && $1 != --* ]]; then
    build=$1
    shift
  fi
  while [[ $# -gt 0 ]]; do
    if [[ $1 == --repeat || $1 == --json || ($1 == --steps && -v steps) ]] && [[ $# -lt 2 ]]; then
      echo "$usage ($1 needs a value)" >&2
      exit 2
    fi
    case $1 in
      --repeat) repeat=$2; shift ;;
      --json) json=$2; json_given=1; shift ;;
      --no-setup) setup=0 ;;
      --smoke) smoke=1 ;;
      --steps)
        [[ -v steps ]] || { echo "$usage" >&2; exit 2; }
        steps=$2
        shift ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac
    shift
  done
  if ! [[ $repeat =~ ^[1-9][0-9]*$ && -n $json ]] || [[ -v steps && ! $steps =~ ^[0-9]+$ ]]; then
    echo "$usage (--repeat N >= 1, --steps N, --json PATH)" >&2
    exit 2
  fi
  if ((smoke)); then
    repeat=1
    ((json_given)) || json=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-bench-smoke.XXXXXX")/$(basename "$json")
  fi
  case $build in /*) ;; *) build=$repo/$build ;; esac
  case $json in /*) ;; *) json=$PWD/$json ;; esac
  if ((smoke)); then
    rm -f -- "$json"  # what bench_check_json reads is this run's
  fi
  return 0
}

# bench_build PACKAGES TARGET...: unless --no-setup, scripts/setup.sh
# installs what is missing (the project's Debian packages and PACKAGES) and
# builds the TARGETs in the build folder.
bench_build() {
  local packages=$1
  shift
  ((setup)) || return 0
  DTRAIN_BUILD_DIR=$build DTRAIN_EXTRA_PACKAGES=$packages "$repo/scripts/setup.sh" "$@" > /dev/null
}

# bench_need FILE...: each an executable, else a failure that names it.
bench_need() {
  local f
  for f in "$@"; do
    [[ -x $f ]] || { echo "$(basename "$0"): $f is missing: build it (or drop --no-setup)" >&2; exit 1; }
  done
}

# bench_skip WHY: what a smoke run cannot do on this machine (no GPU, no
# torch): exit 77, which CTest reports as skipped; a full run fails instead.
bench_skip() {
  if ((smoke)); then
    echo "$(basename "$0"): $1: smoke run skipped (exit 77)"
    exit 77
  fi
  echo "$(basename "$0"): $1" >&2
  exit 1
}

# bench_need_torch PYTHON: PYTHON imports torch, else bench_skip.
bench_need_torch() {
  "$1" -c "import torch" 2> /dev/null ||
    bench_skip "$1 cannot import torch (python3-torch; scripts/setup.sh installs it)"
}

# bench_check_json: the JSON the script wrote parses and is not empty.
bench_check_json() {
  /usr/bin/python3 - "$json" <<'PY' || { echo "$(basename "$0"): no valid JSON in $json" >&2; exit 1; }
import json, sys
with open(sys.argv[1]) as f:
    assert json.load(f), "empty"
PY
  ((smoke)) && echo "smoke run passed; JSON: $json"
  return 0
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

# The PyTorch users install today, from PyPI, pinned with transformers,
# PEFT and every dependency in scripts/python/torch2.txt: the peer every full
# benchmark run measures beside Debian's torch 1.13 (which smoke runs keep,
# so CI stays light). The tests that compare against transformers 5 use the
# same venv. Bump the set when a new release is the one users get, and
# re-measure.
#
# bench_peer_python: sets `peer_python` to the python of the pinned set's
# venv (BUILD_DIR/python/torch2: made once by scripts/python_env.sh, reused
# after; about 5.5 GB, torch's CUDA libraries included, though the
# benchmarks use its CPU side). Without --smoke only: a smoke run sets
# peer_python empty. A venv that cannot be made is a failure naming why.
# bench_peer_python SET: the same for another pinned set (lerobot: LeRobot
# with the torch it pins, the policy benchmark's peer).
bench_peer_python() {
  local set=${1:-torch2}
  peer_python=""
  ((smoke)) && return 0
  peer_python=$("$repo/scripts/python_env.sh" "$set" "$build/python/$set") ||
    { echo "$(basename "$0"): cannot make the PyTorch peer's venv (see above)" >&2; exit 1; }
}
