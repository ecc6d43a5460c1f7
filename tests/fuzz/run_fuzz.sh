#!/usr/bin/env bash
# Fuzzes dtrain's parsers with libFuzzer: the safetensors reader, the
# checkpoint index reader and the examples' config parser (YAML and
# key=value), each built from tests/fuzz/fuzz_main.cpp with clang 16 (Debian's
# clang-16; clang 14 lacks std::source_location) under AddressSanitizer and
# UndefinedBehaviorSanitizer, with leak detection. Installs what is missing.
#
#   tests/fuzz/run_fuzz.sh [--runs N] [--targets a,b,c] [--json PATH]
#
# Defaults: 10,000,000 executions per target, every target, results in
# bench/results/fuzz.json. The targets run one after another, each on its
# corpus tests/corpus/<target>/ (new inputs go to a scratch copy; the
# repository's corpus holds seeds and regressions only). A crash, hang
# (-timeout=10 s), leak or out-of-memory (-rss_limit_mb=2048) stops the
# target and the script fails, leaving the input as <target>-crash-*,
# -timeout-*, -leak-* or -oom-* in the work directory it prints: add it to tests/corpus/<target>/
# (fuzz_corpus_test replays it in CI) and fix the parser.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
runs=10000000
targets=safetensors,checkpoint_index,config
json=$repo/bench/results/fuzz.json
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2 ;;
    --targets) targets=$2 ;;
    --json) json=$2 ;;
    *) echo "usage: tests/fuzz/run_fuzz.sh [--runs N] [--targets a,b,c] [--json PATH]" >&2; exit 2 ;;
  esac
  shift 2
done

need=()
command -v clang++-16 > /dev/null || need+=(clang-16)
[[ -d /usr/lib/llvm-16/lib/clang/16/lib/linux ]] && ls /usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a > /dev/null 2>&1 || need+=(libclang-rt-16-dev)
for p in libyaml-cpp-dev librange-v3-dev libgloo-dev libopenblas-dev nlohmann-json3-dev; do
  dpkg -s "$p" > /dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  sudo=$( ((EUID == 0)) || echo sudo)
  $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi

work=$(mktemp -d /tmp/dtrain-fuzz-XXXXXX)
echo "work directory: $work"
mkdir -p "$(dirname "$json")"
rows=()
status=0
IFS=, read -ra list <<< "$targets"
for t in "${list[@]}"; do
  [[ -d $repo/tests/corpus/$t ]] || { echo "unknown target '$t' (no tests/corpus/$t)" >&2; exit 2; }
  echo "== $t: building"
  clang++-16 -std=c++20 -O2 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -DDTRAIN_FUZZ_TARGET="$t" -I"$repo/include" -I"$repo/tests" -I"$repo/examples" \
    "$repo/tests/fuzz/fuzz_main.cpp" -o "$work/fuzz_$t" -lyaml-cpp -lgloo -lopenblas -pthread
  scratch=$( [[ -d /dev/shm ]] && mktemp -d /dev/shm/dtrain-fuzz-XXXXXX || echo "$work/scratch_$t")
  mkdir -p "$work/corpus_$t" "$scratch"
  cp "$repo/tests/corpus/$t"/* "$work/corpus_$t/"
  echo "== $t: $runs executions"
  start=$(date +%s)
  rc=0
  (cd "$work" && DTRAIN_FUZZ_SCRATCH="$scratch" ASAN_OPTIONS=detect_leaks=1 \
    "./fuzz_$t" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$t-" \
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
  echo "{\"date\": \"$(date +%F)\", \"runs_per_target\": $runs, \"compiler\": \"$(clang++-16 --version | head -1)\", \"targets\": ["
  (IFS=,; echo "${rows[*]}")
  echo "]}"
} > "$json"
/usr/bin/python3 - "$json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("\n| target | executions | seconds | exec/s | corpus | findings |\n|---|---:|---:|---:|---:|---:|")
for t in d["targets"]:
    rate = t["executions"] / t["seconds"] if t["seconds"] else 0
    print(f"| {t['target']} | {t['executions']:,} | {t['seconds']} | {rate:,.0f} | {t['corpus']} | {t['findings']} |")
print(f"\nwritten: {sys.argv[1]}")
PY
((status == 0)) && rm -rf "$work"
exit $status
