#!/usr/bin/env bash
# Every test CTest knows has a time in tests/ctest_cost_data.txt, the times a
# fresh build starts from (scripts/test.sh). CTest starts the longest first;
# a test without a time counts as the shortest and starts last, so a long
# new one ran alone at the end of a CI run, beside an idle core.
#   usage: cost_data_test.sh <build-dir> <cost-file>
set -euo pipefail
build=$1 costs=$2
missing=()
while IFS= read -r name; do
  grep -q "^${name} " "$costs" || missing+=("$name")
done < <(ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: //p')
if ((${#missing[@]})); then
  echo "cost_data_test: $costs has no time for ${#missing[@]} test(s): ${missing[*]}" >&2
  echo "  fix: add a line 'NAME 1 SECONDS' for each (its time in a fresh-clone .ci/run, from" >&2
  echo "  build/Testing/Temporary/CTestCostData.txt), before the '---' line" >&2
  exit 1
fi
echo "cost_data_test: every test has a time in $costs"
