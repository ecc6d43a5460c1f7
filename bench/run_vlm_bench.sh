#!/usr/bin/env bash
# Vision-language benchmark: train_vlm on a small LLaVA (a CLIP ViT-B/16
# tower at 224 px and a ~100M-parameter Llama, random weights from a
# config) in the three training modes (projector; projector,vision; all)
# against transformers + PyTorch DDP (gloo, CPU) on the same model and
# records, in the same run: the release users install from PyPI (the peer,
# bench_peer_python: the pinned torch2 set) at its fastest eager settings,
# SDPA attention and the fused AdamW. Installs what is missing and builds its
# targets through scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_vlm_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Both sides: fp32, AdamW lr 1e-3 weight decay 0, DDP, batch 2 records per
# rank (196 image features + 64 text positions each; the loss over the
# text), launched by dtrain-run with cores / ranks threads per rank; the
# frozen parts train nothing (no gradient, no optimizer state). The grid,
# each a space-separated list in the environment:
#   DTRAIN_VLM_BENCH_MODES  projector projector,vision all
#   DTRAIN_VLM_BENCH_RANKS  2 1     (2 x 1 thread and 1 x 2 threads on 2 cores)
# Each run reports rank 0's median step after the warm-up (2 steps of the
# default 6); the table shows the median of N runs (default 1; the order of
# the sides reverses every run), rank 0's peak resident set and the ratio
# of samples/s, dtrain over the peer.
# --smoke (bench/lib.sh): a 32 px tower and a Llama of width 32, 3 steps,
# one run at 2 ranks, no peer, the JSON in a temporary folder.
# Writes bench/results/vlm.json (or --json PATH). The default grid takes
# about 15 minutes on 2 cores once the peer's venv exists.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_vlm_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=6
warmup=2
json=$repo/bench/results/vlm.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
size=small
records=32
if ((smoke)); then
  steps=3
  warmup=1
  size=smoke
  records=8
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_vlm=$build/examples/train_vlm
cores=$(nproc)
batch=2
read -r -a modes <<< "${DTRAIN_VLM_BENCH_MODES:-projector projector,vision all}"
read -r -a rank_list <<< "${DTRAIN_VLM_BENCH_RANKS:-2 1}"
((smoke)) && rank_list=(2)
for m in "${modes[@]}"; do
  [[ $m == projector || $m == projector,vision || $m == all ]] ||
    { echo "run_vlm_bench.sh: unknown mode '$m' in DTRAIN_VLM_BENCH_MODES (projector, projector,vision, all)" >&2; exit 2; }
done
for n in "${rank_list[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_vlm_bench.sh: DTRAIN_VLM_BENCH_RANKS takes rank counts, not '$n'" >&2; exit 2; }; done

bench_build "" dtrain-run train_vlm
bench_need "$launcher" "$train_vlm"
bench_peer_python  # empty in --smoke: the peer needs the PyPI venv
impls=(dtrain)
[[ -n $peer_python ]] && impls+=(peer)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The config and the records (numpy only: Debian's python3-numpy).
/usr/bin/python3 "$repo/bench/hf/make_vlm_data.py" "$work/model" --size $size --records $records --text 64

# run_one MODE IMPL RANKS REPEAT: one side in one setting, its files named
# <mode>.<ranks>x.<impl>.<repeat> (the mode's comma as a plus).
run_one() {
  local mode=$1 impl=$2 n=$3 i=$4
  local base=$work/${mode/,/+}.${n}x.$impl.$i
  if [[ $impl == peer ]]; then
    launch "$n" "$base.log" "$peer_python" "$repo/bench/hf/torch_ddp_llava.py" --model-dir "$work/model" \
      --data "$work/model/data.safetensors" --train "$mode" --batch-size $batch --steps "$steps" --warmup $warmup \
      --json "$base.json"
  else
    launch "$n" "$base.log" "$train_vlm" config="$work/model/config.json" data="$work/model/data.safetensors" \
      train="$mode" batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=0.001 \
      weight_decay=0 num_workers=0 log_every="$steps" eval_batches=0 metrics="$base.jsonl"
  fi
}

echo "$steps steps per run, the first $warmup left out of the medians; ranks ${rank_list[*]}; modes ${modes[*]};" \
  "sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  order=("${impls[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#impls[@]} - 1; k >= 0; k--)); do order+=("${impls[k]}"); done
  fi
  for mode in "${modes[@]}"; do
    for n in "${rank_list[@]}"; do
      echo "run $i/$repeat: train=$mode, $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s): ${order[*]}"
      for impl in "${order[@]}"; do run_one "$mode" "$impl" "$n" "$i"; done
    done
  done
done

mkdir -p "$(dirname "$json")"
/usr/bin/python3 "$repo/bench/hf/summarize_vlm.py" "$work" --modes "$(IFS=';'; echo "${modes[*]}")" \
  --repeat "$repeat" --warmup $warmup --ranks "$(IFS=,; echo "${rank_list[*]}")" \
  --impls "$(IFS=,; echo "${impls[*]}")" --cores "$cores" --batch $batch --steps "$steps" --size $size \
  --json "$json"
bench_check_json
