#!/usr/bin/env bash
# LibTorch benchmark: train_libtorch's two models (examples/libtorch/models.hpp,
# written with torch::nn) trained by dtrain (DDP and FSDP full shard), beside
# the same models in Python (examples/libtorch/models.py) trained by PyTorch
# itself under DistributedDataParallel and FSDP2 (fully_shard) on gloo, in the
# same run. Both sides use the LibTorch of the pinned torch2 set (PyTorch 2.x
# from PyPI): dtrain's train_libtorch is built against the wheel's LibTorch in
# BUILD_DIR/bench-libtorch (once; CPU ranks only), so the two sides run the
# same kernels. Installs what is missing and builds its targets through
# scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_libtorch_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Both sides: fp32, AdamW lr 3e-3 weight decay 0.1, random batches of the
# model's shapes; the layouts 2 ranks x 1 thread and 1 rank x 2 threads on 2
# cores (DTRAIN_LIBTORCH_BENCH_RANKS, default "2 1"). Each run reports rank
# 0's median step after the warm-up (2 of the default 8 steps) and its peak
# resident set; dtrain's FSDP runs also the model state each rank holds
# (parameters, gradients, AdamW's moments), against the sharded size
# 16 bytes x parameters / ranks.
# --smoke (bench/lib.sh): tiny models, 3 steps, 2 ranks, dtrain only (this
# build's train_libtorch, whatever LibTorch it has), the JSON in a temporary
# folder; skipped (77) where train_libtorch is not built (no LibTorch).
# Writes bench/results/libtorch.json (or --json PATH).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_libtorch_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=8
warmup=2
json=$repo/bench/results/libtorch.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
size=default
lm=(vocab=2048 block_size=128 dim=256 heads=8 layers=4)
resnet=(image=32 channels=32 depth=2 classes=10)
lm_batch=8
resnet_batch=16
if ((smoke)); then
  steps=3
  warmup=1
  size=smoke
  lm=(vocab=64 block_size=16 dim=32 heads=4 layers=2)
  resnet=(image=8 channels=8 depth=1 classes=4)
  lm_batch=4
  resnet_batch=4
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
cores=$(nproc)
read -r -a rank_list <<< "${DTRAIN_LIBTORCH_BENCH_RANKS:-2 1}"
((smoke)) && rank_list=(2)
for n in "${rank_list[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_libtorch_bench.sh: DTRAIN_LIBTORCH_BENCH_RANKS takes rank counts, not '$n'" >&2; exit 2; }
done

bench_build "libtorch-dev" dtrain-run train_libtorch
bench_need "$launcher"
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv
if [[ -n $peer_python ]]; then
  # train_libtorch against the wheel's LibTorch: the peer's kernels.
  torch_dir=$("$peer_python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  lt_build=$build/bench-libtorch
  if ((setup)) || [[ ! -x $lt_build/examples/train_libtorch ]]; then
    logged "$build/bench-libtorch.configure.log" cmake -S "$repo" -B "$lt_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDTRAIN_CUDA=OFF -DDTRAIN_TORCH=ON -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCH=OFF \
      -DCMAKE_PREFIX_PATH="$torch_dir"
    logged "$build/bench-libtorch.build.log" cmake --build "$lt_build" --target train_libtorch -j "$cores"
  fi
  train_libtorch=$lt_build/examples/train_libtorch
else
  train_libtorch=$build/examples/train_libtorch
  [[ -x $train_libtorch ]] || bench_skip "$train_libtorch is not built (no LibTorch: scripts/setup.sh installs libtorch-dev)"
fi
bench_need "$train_libtorch"
sides=(dtrain-ddp dtrain-fsdp)
[[ -n $peer_python ]] && sides+=(torch-ddp torch-fsdp2)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_one MODEL SIDE RANKS REPEAT: files <model>.<ranks>x<threads>.<side>.<repeat>.*
run_one() {
  local model=$1 side=$2 n=$3 i=$4
  local base=$work/$model.${n}x$((cores / n > 0 ? cores / n : 1)).$side.$i
  local -a keys
  local batch
  if [[ $model == lm ]]; then keys=("${lm[@]}") batch=$lm_batch; else keys=("${resnet[@]}") batch=$resnet_batch; fi
  case $side in
    dtrain-*)
      local strategy=ddp
      [[ $side == dtrain-fsdp ]] && strategy=fsdp-full
      launch "$n" "$base.log" "$train_libtorch" model="$model" "${keys[@]}" batch_size="$batch" steps="$steps" \
        strategy=$strategy precision=fp32 optimizer=adamw lr=3e-3 weight_decay=0.1 num_workers=0 eval_batches=0 \
        log_every="$steps" metrics="$base.jsonl" ;;
    torch-*)
      local mode=ddp
      [[ $side == torch-fsdp2 ]] && mode=fsdp2
      launch "$n" "$base.log" "$peer_python" "$repo/bench/libtorch/peer.py" "$model" $mode --batch-size "$batch" \
        --steps "$steps" --warmup $warmup --json "$base.json" "${keys[@]}" ;;
  esac
}

echo "$steps steps per run, the first $warmup left out of the medians; ranks ${rank_list[*]}; sides ${sides[*]}"
for ((i = 1; i <= repeat; i++)); do
  order=("${sides[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#sides[@]} - 1; k >= 0; k--)); do order+=("${sides[k]}"); done
  fi
  for model in lm resnet; do
    for n in "${rank_list[@]}"; do
      echo "run $i/$repeat: $model, $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s): ${order[*]}"
      for side in "${order[@]}"; do run_one "$model" "$side" "$n" "$i"; done
    done
  done
done

layouts=()
for n in "${rank_list[@]}"; do layouts+=("${n}x$((cores / n > 0 ? cores / n : 1))"); done
mkdir -p "$(dirname "$json")"
/usr/bin/python3 "$repo/bench/libtorch/summarize.py" "$work" --layouts "$(IFS=,; echo "${layouts[*]}")" \
  --sides "$(IFS=,; echo "${sides[*]}")" --repeat "$repeat" --warmup $warmup --cores "$cores" \
  --lm-batch $lm_batch --resnet-batch $resnet_batch --steps "$steps" --size $size \
  --lm "${lm[*]}" --resnet "${resnet[*]}" --json "$json"
bench_check_json
