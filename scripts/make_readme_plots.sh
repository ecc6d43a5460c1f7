#!/usr/bin/env bash
# Regenerates the pictures in docs/images (README.md, docs/metrics.md):
#
#   scripts/make_readme_plots.sh [BUILD_DIR]
#
# BUILD_DIR (default: $DTRAIN_BUILD_DIR, else build) must already hold
# tools/dtrain-run and examples/train_mlp; this script builds nothing. It
# trains train_mlp on 2 CPU ranks four times (DDP in fp32 and bf16, FSDP
# FullShard and ZeRO-1 in bf16; the ddp_host preset with two hidden layers of
# 512, whose steps of a few milliseconds are long enough for a stable
# throughput; 300 steps each, under a minute in all), plots their metrics files
# into docs/images/loss.png and throughput.png (medians over 25 steps), and
# plots the strategy benchmark's committed results
# (bench/results/strategies.json) into docs/images/scaling.png. The losses
# repeat from run to run; the throughput depends on the machine and its load.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${DTRAIN_BUILD_DIR:-$root/build}}"
for exe in tools/dtrain-run examples/train_mlp; do
  if [[ ! -x "$build/$exe" ]]; then
    echo "make_readme_plots.sh: error: $build/$exe is missing: build it first" \
         "(cmake --build $build --target train_mlp dtrain-run) or pass the build folder" >&2
    exit 2
  fi
done
images="$root/docs/images"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

runs=(ddp:fp32 ddp:bf16 fsdp-full:bf16 zero1:bf16)
files=() labels=()
for run in "${runs[@]}"; do
  strategy="${run%%:*}" precision="${run##*:}"
  echo "train_mlp strategy=$strategy precision=$precision"
  "$build/tools/dtrain-run" --nproc-per-node 2 "$build/examples/train_mlp" \
    --config "$root/examples/configs/ddp_host.yaml" strategy="$strategy" precision="$precision" \
    hidden=512,512 log_every=100 metrics="$work/$strategy-$precision.jsonl"
  files+=("$work/$strategy-$precision.jsonl")
  labels+=("$strategy $precision")
done

mkdir -p "$images"
plot=(/usr/bin/python3 "$root/scripts/plot_metrics.py")
"${plot[@]}" "${files[@]}" --labels "$(IFS=,; echo "${labels[*]}")" --smooth 25 --out "$images"
"${plot[@]}" --scaling "$root/bench/results/strategies.json" --out "$images"
