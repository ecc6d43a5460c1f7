#!/usr/bin/env bash
# GPT training benchmark: examples/gpt's train_gpt against the same model in
# PyTorch DDP (CPU, gloo), in the same run: Debian's torch 1.13 with the
# written-out attention and the default AdamW, and the release users install
# from PyPI (the peer, bench_peer_python: torch 2.15) at its fastest eager
# settings, scaled_dot_product_attention and the fused AdamW
# (DTRAIN_BENCH_PEER_COMPILE=1 adds the same with torch.compile, whose
# compilation falls in the warm-up steps). Installs what is missing
# (python3-torch; the peer's venv once) and builds its targets through
# scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_gpt_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Model: n_layer 4, n_embd 128, n_head 4, block_size 128, batch 8 sequences
# per rank, the vocabulary of train_gpt's generated corpus (the torch side
# trains on random token ids of the same vocabulary), AdamW (lr 1e-3, weight
# decay 0), fp32. train_gpt (strategy ddp, num_workers=0: batches are gathered
# between steps, outside the timed step) and bench/gpt/torch_ddp_gpt.py, at 1
# and 2 ranks, each without and with activation checkpointing
# (activation_checkpointing=true; torch.utils.checkpoint around each block),
# both launched by dtrain-run; threads per rank = cores / ranks
# (OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, the same for both sides).
# Where a rank has more than one thread, train_gpt runs a second time with
# DTRAIN_HOST_THREADS=openblas (OpenBLAS's threads instead of dtrain's pool);
# where oneDNN is installed (the default GEMM engine then), once more with
# DTRAIN_HOST_GEMM=openblas.
# The implementations alternate N times (default 3; their order reverses
# every run): each run reports rank 0's median step after the warm-up
# (10 steps of the default 60; --steps N) and rank 0's peak resident set
# (getrusage ru_maxrss); the tables show the median of the N runs, the JSON
# keeps every run, with dtrain's own memory accounting (the `memory` object
# of train_gpt's last metrics record).
# bench/gpt/summarize.py writes bench/results/gpt.json (or --json PATH) and
# prints the tables. With the default 3 runs: about 4 to 6 minutes on 2 cores.
# --smoke (bench/lib.sh): one run of a 1-layer model 32 wide, block 32,
# batch 2, 3 steps; the JSON goes to a temporary folder.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_gpt_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
steps=60
warmup=10
json=$repo/bench/results/gpt.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
n_layer=4
n_embd=128
n_head=4
block=128
batch=8
lr=0.001
if ((smoke)); then
  steps=3
  warmup=1
  n_layer=1
  n_embd=32
  n_head=2
  block=32
  batch=2
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_gpt=$build/examples/train_gpt
python=/usr/bin/python3  # Debian's torch lives there; another python3 may come first on PATH
cores=$(nproc)

# The project's set-up installs what is missing (Debian's python3-torch for
# the PyTorch side among it) and builds what the benchmark runs.
bench_build python3-torch dtrain-run train_gpt
bench_need "$launcher" "$train_gpt"
bench_need_torch "$python"
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv
impls=(dtrain torch)
# dtrain with OpenBLAS's threads instead of its own pool (DTRAIN_HOST_THREADS),
# at the world sizes where a rank has more than one thread
((cores > 1)) && impls+=(dtrain_openblas)
# dtrain with OpenBLAS multiplying instead of oneDNN (DTRAIN_HOST_GEMM), where
# oneDNN is installed and so the default engine
ldconfig -p 2> /dev/null | grep -q 'libdnnl\.so\.2 ' && impls+=(dtrain_gemm_openblas)
[[ -n $peer_python ]] && impls+=(peer)
[[ -n $peer_python && ${DTRAIN_BENCH_PEER_COMPILE:-0} == 1 ]] && impls+=(peer_compile)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The vocabulary of the generated corpus (train_gpt's first line: "vocabulary
# V"), which the torch side needs: one step of a one-layer model.
launch 1 "$work/vocab.log" "$train_gpt" n_layer=1 n_embd=$n_embd n_head=$n_head block_size=$block batch_size=1 \
  steps=1 num_workers=0 eval_batches=0
vocab=$(sed -n 's/.*vocabulary \([0-9][0-9]*\).*/\1/p' "$work/vocab.log" | head -n 1)
if [[ -z $vocab ]]; then
  cat "$work/vocab.log" >&2
  echo "run_gpt_bench.sh: no 'vocabulary V' in train_gpt's output" >&2
  exit 1
fi

# run_one IMPL RANKS AC REPEAT: one implementation (dtrain | torch) at one
# world size, activation checkpointing AC (0 | 1).
run_one() {
  local impl=$1 n=$2 ac=$3 i=$4
  local base=$work/$impl.$n.ac$ac.$i
  [[ $impl == dtrain_openblas ]] && ((cores / n < 2)) && return 0
  if [[ $impl != dtrain* ]]; then
    local ckpt=() py=$python
    ((ac)) && ckpt=(--checkpointing)
    [[ $impl == peer* ]] && py=$peer_python && ckpt+=(--attention sdpa --fused-adamw)
    [[ $impl == peer_compile ]] && ckpt+=(--compile)
    launch "$n" "$base.log" "$py" "$repo/bench/gpt/torch_ddp_gpt.py" --vocab "$vocab" --n-layer $n_layer \
      --n-embd $n_embd --n-head $n_head --block-size $block --batch-size $batch --lr $lr --steps "$steps" \
      --warmup $warmup "${ckpt[@]}" --json "$base.json"
  else
    local flag=false threads=pool gemm=auto
    ((ac)) && flag=true
    [[ $impl == dtrain_openblas ]] && threads=openblas
    [[ $impl == dtrain_gemm_openblas ]] && gemm=openblas
    DTRAIN_HOST_THREADS=$threads DTRAIN_HOST_GEMM=$gemm launch "$n" "$base.log" "$train_gpt" strategy=ddp n_layer=$n_layer n_embd=$n_embd n_head=$n_head \
      block_size=$block batch_size=$batch steps="$steps" optimizer=adamw lr=$lr weight_decay=0 precision=fp32 \
      num_workers=0 log_every="$steps" eval_batches=0 activation_checkpointing=$flag metrics="$base.jsonl"
  fi
}

echo "vocabulary $vocab; $steps steps per run, the first $warmup left out of the medians"
for ((i = 1; i <= repeat; i++)); do
  # Which implementation starts swaps every run: any drift in the machine's
  # load spreads over both.
  order=("${impls[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#impls[@]} - 1; k >= 0; k--)); do order+=("${impls[k]}"); done
  fi
  for n in 1 2; do
    for ac in 0 1; do
      echo "run $i/$repeat: $n rank(s), $((cores / n > 0 ? cores / n : 1)) thread(s) each," \
        "activation checkpointing $( ((ac)) && echo on || echo off): ${order[*]}"
      for impl in "${order[@]}"; do run_one "$impl" "$n" "$ac" "$i"; done
    done
  done
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/gpt/summarize.py" "$work" --repeat "$repeat" --cores "$cores" --steps "$steps" \
  --warmup $warmup --vocab "$vocab" --n-layer $n_layer --n-embd $n_embd --n-head $n_head --block-size $block \
  --batch $batch --json "$json"
bench_check_json
