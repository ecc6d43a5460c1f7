#!/usr/bin/env bash
# Compile-time benchmark: how long a user's program takes to compile, and
# the compiler's peak memory, in both of dtrain's compilation modes
# (docs/building.md):
#   (a) the README's quick start (docs/snippets/quickstart.cpp), one
#       translation unit, with g++ and with nvcc (as a .cu), header-only
#       (dtrain::dtrain) and separately compiled (dtrain::runtime, whose
#       sources are timed too, dtrain_runtime.cpp and with CUDA its nvcc part
#       dtrain_runtime_cuda.cu: a project compiles them once);
#   (b) each example's largest translation units (its host training loop,
#       train_host.cpp, and with CUDA its train_cuda.cu), with the commands
#       the build runs, in both modes.
# Flags: the quick start as a Release build compiles it (-O3 -DNDEBUG,
# C++20; nvcc: the build's CUDA architectures); the examples' own commands.
# Seconds are wall-clock medians of --repeat runs (default 3 for (a), one
# for (b)), cpu_seconds the medians of the compiler's user + system time
# (steadier than wall-clock on a machine that also runs other work), peak
# memory the compiler's maximum resident set (GNU time).
# --before REF also times (a) at git revision REF (a worktree in a temporary
# folder; separately compiled too where REF has that mode), the "before" the
# JSON records. The runs of (a)
# interleave: each round times every translation unit once, the before's
# right after the current one's (the first in odd rounds, the second in
# even ones), since this kind of machine drifts by tens of percent over
# minutes and a comparison is only fair within one round. --examples none|host|all
# chooses (b)'s translation units (default all). --only COMPILER:MODE times
# one cell of (a) (e.g. g++:header-only) and nothing else.
# usage: bench/run_compile_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--before REF] [--examples W] [--only C:M]
#                                   [--no-setup] [--smoke]
# --smoke: (a) with g++ only, front end only (-fsyntax-only), once per mode, no runtime library and no (b); the JSON in a
# temporary folder (CTest's bench_smoke_compile).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_compile_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--before REF] [--examples none|host|all] [--only g++|nvcc:header-only|separate] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/compile.json
setup=1
before=""
examples=all
only=""
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --before) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; before=$2; shift 2 ;;
    --examples) [[ $# -ge 2 && $2 =~ ^(none|host|all)$ ]] || { echo "$usage" >&2; exit 2; }; examples=$2; shift 2 ;;
    --only) [[ $# -ge 2 && $2 =~ ^(g\+\+|nvcc):(header-only|separate)$ ]] || { echo "$usage" >&2; exit 2; }
            only=$2; examples=none; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "${args[@]}"
((setup)) && bench_build ""
[[ -f $build/CMakeCache.txt ]] || { echo "run_compile_bench: no configured build in $build" >&2; exit 2; }
opt="-O3 -DNDEBUG"
if ((smoke)); then
  opt="-fsyntax-only"
  examples=none
fi

cuda=0
grep -q '^DTRAIN_CUDA_ENABLED:INTERNAL=ON' "$build/CMakeCache.txt" && cuda=1
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
[[ -n $archs ]] || archs=90
defs=()
incs=(-I"$repo/include")
if ((cuda)); then
  defs+=(-DDTRAIN_HAS_CUDA=1)
  cuda_root=$(dirname "$(dirname "${nvcc:-/usr/local/cuda/bin/nvcc}")")
  incs+=(-isystem "$cuda_root/include")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-compile-bench.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
rows=$work/rows.jsonl
: > "$rows"

# measure KIND NAME COMPILER MODE RUNS command...: appends one JSON row.
measure() {
  local kind=$1 name=$2 compiler=$3 mode=$4 runs=$5
  shift 5
  local secs=() mems=() cpus=() i s m u k
  for ((i = 0; i < runs; i++)); do
    if ! /usr/bin/time -f '%e %M %U %S' -o "$work/time" "$@" > "$work/log" 2>&1; then
      echo "run_compile_bench: $name ($compiler, $mode) failed to compile:" >&2
      tail -30 "$work/log" >&2
      exit 1
    fi
    read -r s m u k < "$work/time"
    secs+=("$s")
    mems+=("$m")
    cpus+=("$(python3 -c "print(round($u + $k, 2))")")
  done
  python3 - "$kind" "$name" "$compiler" "$mode" "${secs[*]}" "${mems[*]}" "${cpus[*]}" >> "$rows" <<'EOF'
import json, statistics, sys
kind, name, compiler, mode, secs, mems, cpus = sys.argv[1:]
secs = [float(s) for s in secs.split()]
mems = [int(m) for m in mems.split()]
cpus = [float(c) for c in cpus.split()]
print(json.dumps({"kind": kind, "name": name, "compiler": compiler, "mode": mode,
                  "seconds": round(statistics.median(secs), 2), "runs": secs,
                  "cpu_seconds": round(statistics.median(cpus), 2), "cpu_runs": cpus,
                  "peak_mib": round(max(mems) / 1024)}))
EOF
  printf '  %-34s %-5s %-12s %7.1f s  %6d MiB\n' "$name" "$compiler" "$mode" \
    "$(tail -1 "$rows" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')" \
    "$(tail -1 "$rows" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_mib"])')"
}

# quickstart_one ROOT KIND COMPILER MODE: one run of (a) for the sources at ROOT.
quickstart_one() {
  local root=$1 kind=$2 compiler=$3 mode=$4 sep=()
  local src=$root/docs/snippets/quickstart.cpp
  [[ $mode == separate ]] && sep=(-DDTRAIN_SEPARATE_COMPILATION=1)
  if [[ $compiler == g++ ]]; then
    measure "$kind" quickstart g++ "$mode" 1 \
      "$cxx" -std=c++20 $opt "${defs[@]}" "${sep[@]}" -I"$root/include" "${incs[@]:1}" -c "$src" -o "$work/q.o"
  else
    # nvcc against dtrain::runtime also takes the Cuda templates from its CUDA part.
    [[ $mode == separate ]] && sep+=(-DDTRAIN_RUNTIME_CUDA=1)
    measure "$kind" quickstart nvcc "$mode" 1 \
      "$nvcc" -std=c++20 $opt -arch="sm_${archs%%;*}" --expt-relaxed-constexpr "${defs[@]}" "${sep[@]}" \
      -I"$root/include" "${incs[@]:1}" -x cu -c "$src" -o "$work/q.o"
  fi
}

# runtime ROOT KIND: the runtime library's sources, once each.
runtime() {
  local root=$1 kind=$2
  measure "$kind" runtime_library g++ separate 1 \
    "$cxx" -std=c++20 $opt -fno-math-errno -fno-trapping-math "${defs[@]}" -DDTRAIN_SEPARATE_COMPILATION=1 \
    -I"$root/include" "${incs[@]:1}" -c "$root/cmake/dtrain_runtime.cpp" -o "$work/r.o"
  if [[ -f $root/cmake/dtrain_runtime_kernels.cpp ]]; then
    measure "$kind" runtime_library_kernels g++ separate 1 \
      "$cxx" -std=c++20 $opt -fno-math-errno -fno-trapping-math "${defs[@]}" -DDTRAIN_SEPARATE_COMPILATION=1 \
      -I"$root/include" "${incs[@]:1}" -c "$root/cmake/dtrain_runtime_kernels.cpp" -o "$work/rk.o"
  fi
  if ((cuda && !smoke)) && [[ -f $root/cmake/dtrain_runtime_cuda.cu ]]; then
    measure "$kind" runtime_library_cuda nvcc separate 1 \
      "$nvcc" -std=c++20 $opt -arch="sm_${archs%%;*}" --expt-relaxed-constexpr \
      -Xcompiler=-fno-math-errno,-fno-trapping-math "${defs[@]}" -DDTRAIN_SEPARATE_COMPILATION=1 \
      -I"$root/include" "${incs[@]:1}" -x cu -c "$root/cmake/dtrain_runtime_cuda.cu" -o "$work/rc.o"
  fi
}

echo "(a) the quick start, one translation unit ($opt; $(nproc) cores)${before:+; before: $before}"
[[ -n $before ]] && git -C "$repo" worktree add --detach "$work/before" "$before" > /dev/null 2>&1
compilers=(g++)
((cuda && !smoke)) && compilers+=(nvcc)
for ((round = 1; round <= repeat; round++)); do
  for compiler in "${compilers[@]}"; do
    for mode in header-only separate; do
      [[ -n $only && $only != "$compiler:$mode" ]] && continue
      # The before's separate mode only where it had one (cmake/dtrain_runtime.cpp).
      if [[ -n $before && ($mode == header-only || -f $work/before/cmake/dtrain_runtime.cpp) ]]; then
        if ((round % 2)); then
          quickstart_one "$repo" after "$compiler" "$mode"
          quickstart_one "$work/before" before "$compiler" "$mode"
        else
          quickstart_one "$work/before" before "$compiler" "$mode"
          quickstart_one "$repo" after "$compiler" "$mode"
        fi
      else
        quickstart_one "$repo" after "$compiler" "$mode"
      fi
    done
  done
done
[[ -n $before ]] && git -C "$repo" worktree remove --force "$work/before"
# The runtime library is built anyway; the smoke only checks the rest of the script.
((smoke)) || [[ -n $only ]] || runtime "$repo" after

if [[ $examples != none ]]; then
  command -v ninja > /dev/null || { echo "run_compile_bench: (b) reads the build's commands from ninja" >&2; exit 2; }
  echo "(b) each example's largest translation units, as the build compiles them"
  for ex in mlp gpt policy lm; do
    for tu in train_host.cpp train_cuda.cu; do
      [[ $tu == train_cuda.cu && ($cuda == 0 || $examples == host) ]] && continue
      cmd=$(ninja -C "$build" -t commands "train_$ex" | grep -F "examples/$ex/$tu" | head -1 |
            sed -e 's/^ccache //' -e 's/ -MD -MT [^ ]* -MF [^ ]*//' -e 's/ -M[DT]\{1,2\} [^ ]*//g' \
                -e 's/ -Xcompiler=-MD[^ ]*//' -e "s| -o [^ ]*| -o $work/e.o|")
      [[ -n $cmd ]] || { echo "run_compile_bench: no command for examples/$ex/$tu in $build" >&2; exit 1; }
      compiler=g++
      [[ $tu == *.cu ]] && compiler=nvcc
      for mode in separate header-only; do
        c=$cmd
        [[ $mode == header-only ]] && c=${c//-DDTRAIN_SEPARATE_COMPILATION=1/}
        [[ $mode == separate && $c != *-DDTRAIN_SEPARATE_COMPILATION=1* ]] && continue
        (cd "$build" && eval "measure example train_$ex/$tu $compiler $mode 1 $c")
      done
    done
  done
fi

mkdir -p "$(dirname "$json")"
python3 - "$rows" "$json" "$repo" "$before" "$opt" "$smoke" "$only" "$repeat" <<'EOF'
import json, os, statistics, sys
rows_path, out, repo, before, opt, smoke, only, repeat = sys.argv[1:]
sys.path.insert(0, os.path.join(repo, "bench"))
from machine import run_record  # noqa: E402  (bench/machine.py: date, commit, dirty, machine)
# One row per translation unit: the rounds of (a) each wrote one run.
rows = []
for line in open(rows_path):
    r = json.loads(line)
    same = next((x for x in rows if all(x[k] == r[k] for k in ("kind", "name", "compiler", "mode"))), None)
    if same is None:
        rows.append(r)
    else:
        same["runs"] += r["runs"]
        same["seconds"] = round(statistics.median(same["runs"]), 2)
        same["peak_mib"] = max(same["peak_mib"], r["peak_mib"])
        same["cpu_runs"] += r["cpu_runs"]
        same["cpu_seconds"] = round(statistics.median(same["cpu_runs"]), 2)
def pick(kind, compiler, mode):
    return next((r["seconds"] for r in rows if r["kind"] == kind and r["name"] == "quickstart"
                 and r["compiler"] == compiler and r["mode"] == mode), None)
goals = {"quickstart g++ separate": 15, "quickstart nvcc separate": 30,
         "quickstart g++ header-only": 20, "quickstart nvcc header-only": 35}
met = {}
for k, limit in ({} if smoke == "1" else goals).items():
    _, compiler, mode = k.split()
    s = pick("after", compiler, mode)
    if s is not None:
        met[k] = {"seconds": s, "goal": limit, "met": s <= limit}
doc = {"benchmark": "compile", **run_record(os.cpu_count()), "before": before or None,
       "flags": opt, "smoke": smoke == "1", "only": only or None, "repeat": int(repeat), "rows": rows, "goals": met}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print("goals:", ", ".join(f"{k} {v['seconds']} s (<= {v['goal']}: {'met' if v['met'] else 'NOT met'})"
                           for k, v in met.items()))
print("wrote", out)
EOF
bench_check_json
