#!/usr/bin/env bash
# The embedding's gradient on the host (bench/embedding_grad.cpp): the form a
# GPU runs (an index per table element) against the host's (a table row per
# index), over tables of GPT-2's and the Llama shape's sizes (50,257 and
# 32,000 x 768, 512 token rows), on one thread and on every core; the two
# must give the same bits. Writes bench/results/embedding.json (or
# --json PATH). About 30 s on 2 cores. --smoke (bench/lib.sh): a 1,000-row
# table, 3 calls, the JSON in a temporary folder.
# usage: bench/run_embedding_bench.sh [BUILD_DIR] [--json PATH] [--no-setup] [--smoke]
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_embedding_bench.sh [BUILD_DIR] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
json=$repo/bench/results/embedding.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
args=()
((smoke)) && args=(--vocab 1000 --iters 3)
bench_build "" bench_embedding_grad
bench_need "$build/bench/bench_embedding_grad"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bench/bench_embedding_grad" "${args[@]}" --json "$work/raw.json"
mkdir -p "$(dirname "$json")"
DTRAIN_BENCH_DIR="$repo/bench" /usr/bin/python3 - "$work/raw.json" "$json" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["DTRAIN_BENCH_DIR"])
from machine import run_record  # noqa: E402  (bench/machine.py)
raw = json.load(open(sys.argv[1]))
json.dump({**run_record(os.cpu_count()), **raw}, open(sys.argv[2], "w"), indent=1)
PY
bench_check_json
