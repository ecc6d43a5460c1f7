#!/usr/bin/env bash
# The failure-injection harness at full strength: every scenario of
# tests/reliability/faults_test.cpp (kill -9 of a random rank in forward, in
# backward, inside a collective and during a checkpoint save; then the same
# under dtrain-run --max-restarts 1 with resume=latest) and of
# preempt_test.cpp (preemption notices to one rank or to dtrain-run) RUNS
# times (default 20), then the table docs/reliability.md shows. The JSON
# keeps the soak's summary (run_soak.sh --record) beside the scenarios.
# Installs what is missing and builds its targets through scripts/setup.sh
# first.
#
#   tests/reliability/run_faults.sh [BUILD_DIR] [--runs N] [--seed S] [--json PATH]
#
# Under a minute for 20 runs on 2 cores. The CI pass runs each scenario 3 times.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
shift || true
runs=20
seed=""
json=$repo/bench/results/faults.json
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2 ;;
    --seed) seed=$2 ;;
    --json) json=$2 ;;
    *) echo "usage: tests/reliability/run_faults.sh [BUILD_DIR] [--runs N] [--seed S] [--json PATH]" >&2; exit 2 ;;
  esac
  shift 2
done
case $build in /*) ;; *) build=$repo/$build ;; esac
DTRAIN_BUILD_DIR=$build "$repo/scripts/setup.sh" reliability_faults_test reliability_preempt_test train_mlp dtrain-run \
  > /dev/null
mkdir -p "$(dirname "$json")"
rm -f "$json.jsonl"
status=0
DTRAIN_FAULT_RUNS=$runs DTRAIN_FAULT_SEED=$seed DTRAIN_FAULT_JSON=$json.jsonl \
  "$build/tests/reliability/reliability_faults_test" --log_level=test_suite || status=$?
DTRAIN_FAULT_RUNS=$runs DTRAIN_FAULT_SEED=$seed DTRAIN_FAULT_JSON=$json.jsonl \
  "$build/tests/reliability/reliability_preempt_test" --log_level=test_suite || status=$?
/usr/bin/python3 - "$json.jsonl" "$json" "$repo" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[3], "bench"))
from machine import run_record  # noqa: E402  (bench/machine.py: date, commit, dirty, machine)
rows = [json.loads(line) for line in open(sys.argv[1])]
# The scenarios are this run's, and so is the top level's provenance; the soak
# (run_soak.sh --record) is kept as it was, with the provenance it carries.
out = {**run_record(os.cpu_count()), "scenarios": rows}
if os.path.exists(sys.argv[2]):
    old = json.load(open(sys.argv[2]))
    if "soak" in old:
        out["soak"] = old["soak"]
with open(sys.argv[2], "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print(f"\n| scenario | runs | passed | worst time to exit (s) |\n|---|---:|---:|---:|")
for r in rows:
    worst = f"{r['worst_exit_s']:.2f}" if "worst_exit_s" in r else "-"
    print(f"| {r['scenario']} | {r['runs']} | {r['passed']} | {worst} |")
print(f"\ncollective timeout {rows[0]['timeout_s'] if rows else '?'} s; written: {sys.argv[2]}")
PY
rm -f "$json.jsonl"
exit $status
