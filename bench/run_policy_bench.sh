#!/usr/bin/env bash
# Robot-policy benchmark: train_policy policy=act (LeRobot's ACT at its
# default sizes: ResNet-18 on one 96 x 96 camera, dim_model 512,
# dim_feedforward 3200, 4 encoder layers, 1 decoder layer, 4 VAE encoder
# layers, latent 32, chunk 100, dropout 0.1) against LeRobot + PyTorch DDP
# (gloo, CPU) on the same episodes, in the same run: LeRobot 0.4.x with the
# torch it pins, from PyPI (the pinned lerobot set, bench_peer_python
# lerobot), fused AdamW. Installs what is missing and builds its targets
# through scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_policy_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# Both sides: fp32, DDP, batch 8 samples per rank, AdamW lr 1e-5 weight
# decay 1e-4 on every parameter (LeRobot's preset), gradients clipped at
# norm 10, MEAN_STD normalisation from the episodes' statistics; the
# episodes are the arm simulator's (train_policy export_data=: 4 episodes
# of 120 frames). The layouts, DTRAIN_POLICY_BENCH_RANKS (default "2 1"):
# 2 ranks x 1 thread and 1 rank x 2 threads on 2 cores. Each run reports
# rank 0's median step after the warm-up (2 of the default 6 steps); the
# table shows the median of N runs (default 1; the order of the sides
# reverses every run), rank 0's peak resident set and the ratio of
# samples/s, dtrain over the peer.
# --smoke (bench/lib.sh): 32 px images, a transformer of width 32, chunk 5,
# 3 steps, one run at 2 ranks, no peer, the JSON in a temporary folder.
# Writes bench/results/policy.json (or --json PATH).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_policy_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=6
warmup=2
json=$repo/bench/results/policy.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
size=default
model=(dim_model=512 n_heads=8 dim_feedforward=3200 n_encoder_layers=4 n_decoder_layers=1 n_vae_encoder_layers=4
  latent_dim=32 dropout=0.1 kl_weight=10 horizon=100)
peer_model=()
data=(cameras=1 camera_size=96 episodes=4 episode_length=120)
if ((smoke)); then
  steps=3
  warmup=1
  size=smoke
  model=(dim_model=32 n_heads=4 dim_feedforward=64 n_encoder_layers=1 n_decoder_layers=1 n_vae_encoder_layers=1
    latent_dim=8 dropout=0.1 kl_weight=10 horizon=5)
  data=(cameras=1 camera_size=32 episodes=3 episode_length=12)
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_policy=$build/examples/train_policy
cores=$(nproc)
batch=8
read -r -a rank_list <<< "${DTRAIN_POLICY_BENCH_RANKS:-2 1}"
((smoke)) && rank_list=(2)
for n in "${rank_list[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_policy_bench.sh: DTRAIN_POLICY_BENCH_RANKS takes rank counts, not '$n'" >&2; exit 2; }
done

bench_build "" dtrain-run train_policy
bench_need "$launcher" "$train_policy"
bench_peer_python lerobot  # empty in --smoke: the peer needs the PyPI venv
impls=(dtrain)
[[ -n $peer_python ]] && impls+=(peer)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
logged "$work/data.log" "$train_policy" policy=act "${data[@]}" export_data="$work/episodes.safetensors"

# run_one IMPL RANKS REPEAT: one side in one layout, its files named
# <ranks>x<threads>.<impl>.<repeat> (bench/hf/summarize_policy.py reads them).
run_one() {
  local impl=$1 n=$2 i=$3
  local base=$work/${n}x$((cores / n > 0 ? cores / n : 1)).$impl.$i
  if [[ $impl == peer ]]; then
    launch "$n" "$base.log" "$peer_python" "$repo/bench/hf/torch_ddp_act.py" --data "$work/episodes.safetensors" \
      --batch-size $batch --steps "$steps" --warmup $warmup --json "$base.json" "${peer_model[@]}"
  else
    launch "$n" "$base.log" "$train_policy" policy=act data="$work/episodes.safetensors" "${model[@]}" \
      batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=1e-5 weight_decay=1e-4 \
      no_decay=false clip=10 num_workers=0 log_every="$steps" metrics="$base.jsonl"
  fi
}

echo "$steps steps per run, the first $warmup left out of the medians; ranks ${rank_list[*]}; sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  order=("${impls[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#impls[@]} - 1; k >= 0; k--)); do order+=("${impls[k]}"); done
  fi
  for n in "${rank_list[@]}"; do
    echo "run $i/$repeat: $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s): ${order[*]}"
    for impl in "${order[@]}"; do run_one "$impl" "$n" "$i"; done
  done
done

layouts=()
for n in "${rank_list[@]}"; do layouts+=("${n}x$((cores / n > 0 ? cores / n : 1))"); done
mkdir -p "$(dirname "$json")"
/usr/bin/python3 "$repo/bench/hf/summarize_policy.py" "$work" --layouts "$(IFS=,; echo "${layouts[*]}")" \
  --repeat "$repeat" --warmup $warmup --impls "$(IFS=,; echo "${impls[*]}")" --cores "$cores" --batch $batch \
  --steps "$steps" --size $size --json "$json"
bench_check_json
