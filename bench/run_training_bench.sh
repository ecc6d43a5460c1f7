#!/usr/bin/env bash
# Training benchmarks, dtrain against PyTorch in the same run: the release
# users install today (PyPI, pinned in bench/lib.sh, in a venv the script
# makes once; CPU) and, for history, Debian's torch 1.13, which is all a
# --smoke run uses. Installs what is missing (python3-torch) and builds its
# targets through scripts/setup.sh first.
# usage: bench/run_training_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
#  (a) AdamW over one flat fp32 buffer of 10M and 100M elements: bench_adamw
#      (AdamWStep<float> through Host::for_each, a pass with its memory traffic
#      and no arithmetic as the reference, and memcpy for information),
#      bench_adamw_no_errno (the same source built with -fno-math-errno) and
#      bench/training/torch_adamw.py (every CPU variant the torch has: fused
#      from 2.4), one process using every core.
#  (b) train_mlp (hidden [256, 256], GELU, batch 64 per rank, AdamW, fp32) at 1
#      and 2 ranks against bench/training/torch_ddp_mlp.py (PyTorch DDP, gloo),
#      both launched by dtrain-run; threads per rank = cores / ranks.
#  (c) bench_ddp_overhead: the Trainer at world size 1 against a hand-written
#      loop without communication, at 1 thread and at every core.
# (a) and (b) run the implementations alternately N times (default 3): each
# run reports medians over its iterations or steps, and the tables show the
# median of the N runs (the JSON keeps every run). Threads: OMP_NUM_THREADS
# and OPENBLAS_NUM_THREADS are set to the same value for both sides.
# bench/training/summarize.py writes bench/results/training.json (or --json
# PATH) and prints the tables. With the default 3 runs: about 1.5 minutes on
# 2 idle cores, 3.5 on busy ones. --no-setup: use BUILD_DIR as it is.
# --smoke (bench/lib.sh): AdamW over 1M elements, 5 MLP steps, a short (c),
# one run, the JSON in a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_training_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/training.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
train_mlp=$build/examples/train_mlp
bench=$build/bench/training
python=/usr/bin/python3  # Debian's torch lives there; another python3 may come first on PATH
cores=$(nproc)
steps=300
warmup=20
adamw=()     # the benches' own defaults: 10M and 100M elements
torch_adamw=(--iters 9)
overhead=()
if ((smoke)); then
  steps=5
  warmup=1
  adamw=(--sizes-m 1 --iters 2)
  torch_adamw=(--sizes-m 1 --iters 2)
  overhead=(--rounds 1 --steps 5 --warmup 1)
fi

# The project's set-up installs what is missing (Debian's python3-torch for
# the PyTorch side among it) and builds what the benchmark runs.
bench_build python3-torch dtrain-run train_mlp bench_adamw bench_adamw_no_errno bench_ddp_overhead
bench_need "$launcher" "$train_mlp" "$bench/bench_adamw" "$bench/bench_adamw_no_errno" "$bench/bench_ddp_overhead"
bench_need_torch "$python"
bench_peer_python

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for ((i = 1; i <= repeat; i++)); do
  echo "run $i/$repeat: (a) AdamW, $cores thread(s): dtrain, dtrain -fno-math-errno, torch..."
  with_threads "$cores" "$bench/bench_adamw" "${adamw[@]}" --json "$work/adamw.$i.json"
  with_threads "$cores" "$bench/bench_adamw_no_errno" "${adamw[@]}" --json "$work/adamw_no_errno.$i.json"
  with_threads "$cores" "$python" "$repo/bench/training/torch_adamw.py" "${torch_adamw[@]}" \
    --json "$work/torch_adamw.$i.json"
  if [[ -n $peer_python ]]; then
    with_threads "$cores" "$peer_python" "$repo/bench/training/torch_adamw.py" "${torch_adamw[@]}" \
      --json "$work/peer_adamw.$i.json"
  fi
  for n in 1 2; do
    t=$((cores / n > 0 ? cores / n : 1))
    echo "run $i/$repeat: (b) MLP at $n rank(s), $t thread(s) each: train_mlp, torch DDP..."
    # num_workers=0: batches are gathered between steps, outside the timed
    # step, as the torch script slices its batches outside its timing.
    logged "$work/mlp.$n.$i.log" with_threads "$t" "$launcher" --nproc-per-node "$n" "$train_mlp" \
      steps=$steps hidden=256,256 activation=gelu batch_size=64 optimizer=adamw lr=0.001 weight_decay=0 \
      precision=fp32 num_workers=0 log_every=$steps metrics="$work/mlp.$n.$i.jsonl"
    logged "$work/torch_mlp.$n.$i.log" with_threads "$t" "$launcher" --nproc-per-node "$n" "$python" \
      "$repo/bench/training/torch_ddp_mlp.py" --steps $steps --warmup $warmup --json "$work/torch_mlp.$n.$i.json"
    if [[ -n $peer_python ]]; then
      logged "$work/peer_mlp.$n.$i.log" with_threads "$t" "$launcher" --nproc-per-node "$n" "$peer_python" \
        "$repo/bench/training/torch_ddp_mlp.py" --steps $steps --warmup $warmup --fused-adamw \
        --json "$work/peer_mlp.$n.$i.json"
    fi
  done
done
# (c) at one thread (what each rank of a job with as many ranks as cores
# gets) and at every core.
for t in $( ((cores > 1)) && echo 1 "$cores" || echo 1); do
  echo "(c) DDP overhead at world size 1, $t thread(s)..."
  with_threads "$t" "$bench/bench_ddp_overhead" "${overhead[@]}" --json "$work/overhead.$t.json"
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/training/summarize.py" "$work" "$repeat" "$cores" "$warmup" "$json"
bench_check_json
