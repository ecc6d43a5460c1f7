#!/usr/bin/env bash
# Fuzzes every parser of outside input with libFuzzer (the targets of
# tests/fuzz/targets.hpp: safetensors, checkpoint_index, hf_index, config, hf_config,
# adapter_config, npy, tokens, sft_records, launcher_flags, launch_env,
# error_record, store_wire, wire_messages). One harness, tests/fuzz/fuzz_main.cpp, built once with clang 16 (Debian's
# clang-16; clang 14 lacks std::source_location) under AddressSanitizer and
# UndefinedBehaviorSanitizer with leak detection; DTRAIN_FUZZ_TARGET picks the
# target of each run.
#
#   tests/fuzz/run_fuzz.sh [--runs N | --seconds S] [--targets a,b,c] [--json PATH] [--smoke]
#
# Defaults: 10,000,000 executions per target, every target, the run appended
# to the "runs" of bench/results/fuzz.json (the record of every full run,
# each with its date, commit, dirty and machine from bench/machine.py, the
# top level the newest run's; notes added by hand on findings). --smoke: what CI runs
# (CTest fuzz_smoke): an unoptimised (-O0) build, 2 seconds per target, nothing installed
# (exit 77 naming what is missing), the JSON in the work directory. Each
# target starts from a copy of its corpus tests/corpus/<target>/ (new inputs
# go to the copy; the repository's corpus holds seeds and regressions only).
# A crash, hang (-timeout=10 s), leak or out-of-memory (-rss_limit_mb=2048)
# stops the target and the script fails, leaving the input as
# <target>-crash-*, -timeout-*, -leak-* or -oom-* in the work directory it
# prints: add it to tests/corpus/<target>/ (fuzz_corpus_test replays it in
# CI) and fix the parser.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
runs=10000000
seconds=
smoke=
all=safetensors,checkpoint_index,hf_index,config,hf_config,adapter_config,npy,tokens,sft_records,launcher_flags,launch_env,error_record,store_wire,wire_messages
targets=$all
json=$repo/bench/results/fuzz.json
usage="usage: tests/fuzz/run_fuzz.sh [--runs N | --seconds S] [--targets a,b,c] [--json PATH] [--smoke]"
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --targets) targets=$2; shift ;;
    --json) json=$2; shift ;;
    --smoke) smoke=1; seconds=${seconds:-2} ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done

need=()
command -v clang++-16 > /dev/null || need+=(clang-16)
ls /usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a > /dev/null 2>&1 || need+=(libclang-rt-16-dev)
for p in libyaml-cpp-dev librange-v3-dev libgloo-dev libopenblas-dev nlohmann-json3-dev; do
  dpkg -s "$p" > /dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  if [[ -n $smoke ]]; then
    echo "skipped: the fuzzers need ${need[*]} (scripts/setup.sh installs them when DTRAIN_SETUP_FOR=tests)"
    exit 77
  fi
  echo "installing ${need[*]}"
  sudo=$( ((EUID == 0)) || echo sudo)
  $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi

work=$(mktemp -d /tmp/dtrain-fuzz-XXXXXX)
echo "work directory: $work"
[[ -n $smoke ]] && json=$work/fuzz.json
mkdir -p "$(dirname "$json")"
level=$([[ -n $smoke ]] && echo -O0 || echo -O2)
# The code fuzzed is the tree the harness is built from: its commit and dirty
# now, not at the end (a full run takes hours, and commits may land meanwhile).
/usr/bin/python3 -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import machine
print(json.dumps({"commit": machine.commit(), "dirty": machine.dirty()}))' "$repo/bench" > "$work/built.json"
echo "== building the harness ($level)"
clang++-16 -std=c++20 "$level" -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$repo/include" -I"$repo/tests" -I"$repo/examples" -I"$repo/tools" \
  "$repo/tests/fuzz/fuzz_main.cpp" -o "$work/fuzz" -lyaml-cpp -lgloo -lopenblas -lcrypto -pthread
limit=$([[ -n $seconds ]] && echo "-max_total_time=$seconds" || echo "-runs=$runs")
rows=()
status=0
IFS=, read -ra list <<< "$targets"
for t in "${list[@]}"; do
  [[ ,$all, == *,$t,* && -d $repo/tests/corpus/$t ]] || { echo "unknown target '$t' (one of $all)" >&2; exit 2; }
  scratch=$( [[ -d /dev/shm ]] && mktemp -d /dev/shm/dtrain-fuzz-XXXXXX || echo "$work/scratch_$t")
  mkdir -p "$work/corpus_$t" "$scratch"
  cp "$repo/tests/corpus/$t"/* "$work/corpus_$t/"
  echo "== $t: ${limit#-}"
  start=$(date +%s)
  rc=0
  (cd "$work" && DTRAIN_FUZZ_TARGET="$t" DTRAIN_FUZZ_SCRATCH="$scratch" ASAN_OPTIONS=detect_leaks=1 \
    ./fuzz "$limit" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$t-" \
    "corpus_$t" > "$work/$t.log" 2>&1) || rc=$?
  secs=$(($(date +%s) - start))
  rm -rf "$scratch"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$' || echo 0)
  corpus=$(ls "$work/corpus_$t" | wc -l)
  findings=$(ls "$work" | grep -cE "^$t-(crash|timeout|leak|oom|slow-unit)-" || true)
  tail -3 "$work/$t.log"
  rows+=("{\"target\": \"$t\", \"executions\": ${execs:-0}, \"seconds\": $secs, \"corpus\": $corpus, \"exit\": $rc, \"findings\": $findings}")
  if ((rc != 0)); then
    status=1
    echo "$t: libFuzzer exited with $rc; see $work/$t.log and the $t-crash-*/-leak-*/-timeout-* inputs in $work" >&2
  fi
done

{
  echo "{\"limit\": \"${limit#-}\", \"compiler\": \"$(clang++-16 --version | head -1)\", \"targets\": ["
  (IFS=,; echo "${rows[*]}")
  echo "]}"
} > "$work/run.json"
/usr/bin/python3 - "$work/run.json" "$json" "$repo" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[3], "bench"))
from machine import run_record  # noqa: E402  (bench/machine.py: date, commit, dirty, machine)
# Each run records its own provenance (commit and dirty as the harness was built); the
# file's top level is the newest run's.
provenance = {**run_record(os.cpu_count()), **json.load(open(os.path.join(os.path.dirname(sys.argv[1]), "built.json")))}
run = {**provenance, **json.load(open(sys.argv[1]))}
record = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else {"runs": []}
record["runs"].append(run)
record = {**provenance, **{k: v for k, v in record.items() if k not in provenance and k != "provenance_note"}}
with open(sys.argv[2], "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
print("\n| target | executions | seconds | exec/s | corpus | findings |\n|---|---:|---:|---:|---:|---:|")
for t in run["targets"]:
    rate = t["executions"] / t["seconds"] if t["seconds"] else 0
    print(f"| {t['target']} | {t['executions']:,} | {t['seconds']} | {rate:,.0f} | {t['corpus']} | {t['findings']} |")
print(f"\nappended to: {sys.argv[2]}")
PY
((status == 0)) && rm -rf "$work"
exit $status
