#!/usr/bin/env bash
# Diffusion fine-tuning benchmark: train_diffusion against diffusers + peft +
# PyTorch DDP (gloo, CPU) on the same UNet and records, in the same run: the
# pinned torch2 set (bench_peer_python: torch, diffusers, peft from PyPI),
# fused AdamW. Installs what is missing and builds its targets through
# scripts/setup.sh first (--no-setup: use BUILD_DIR as it is).
# usage: bench/run_diffusion_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]
#
# The model (bench/diffusion/make_unet.py, made by diffusers with random
# weights and save_pretrained): a UNet2DConditionModel of Stable Diffusion
# 1.5's structure (CrossAttnDownBlock2D x 3 + DownBlock2D, UpBlock2D +
# CrossAttnUpBlock2D x 3, layers_per_block 2, attention_head_dim 8,
# cross_attention_dim 768, norm_num_groups 32) at reduced width,
# block_out_channels (64, 128, 256, 256), so that both sides fit a 2-core
# VM; latents 4 x 32 x 32 (256 px images) and text 77 x 768, 32 random
# records (no VAE or text encoder: the records are what they cache).
# Two modes: LoRA r=16 alpha 16 on to_q,to_k,to_v,to_out.0 (the UNet
# frozen; peft's unet.add_adapter on the PyTorch side) and full fine-tuning.
# Both sides: fp32, DDP, batch 2 per rank, AdamW lr 1e-4 weight decay 1e-2
# on every trainable parameter, epsilon objective with Stable Diffusion's
# scaled-linear schedule (0.00085 to 0.012, 1000 steps), uniform timesteps,
# no clipping, no evaluation. The layouts, DTRAIN_DIFFUSION_BENCH_RANKS
# (default "2 1"): 2 ranks x 1 thread and 1 rank x 2 threads on 2 cores; the
# modes, DTRAIN_DIFFUSION_BENCH_MODES (default "lora full"). Each run reports
# rank 0's median step after the warm-up (2 of the default 6 steps); the
# table shows the median of N runs (default 1; the order of the sides
# reverses every run), rank 0's peak resident set and the ratio of
# samples/s, dtrain over the peer.
# --smoke (bench/lib.sh): a UNet of 2 blocks (block_out_channels 32, 64),
# text 8 x 32, latents 4 x 16 x 16, 3 steps, one run at 2 ranks, no peer, the
# JSON in a temporary folder. The model is still made by diffusers: the
# smoke run uses BUILD_DIR/python/torch2 where it exists (the tests' venv)
# and is skipped (77) where it does not.
# Writes bench/results/diffusion.json (or --json PATH).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_diffusion_bench.sh [BUILD_DIR] [--repeat N] [--steps N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=1
steps=6
warmup=2
json=$repo/bench/results/diffusion.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
size=default
records=32
if ((smoke)); then
  steps=3
  warmup=1
  size=smoke
fi
if ((steps <= warmup)); then
  echo "$usage (--steps > $warmup)" >&2
  exit 2
fi
launcher=$build/tools/dtrain-run
train_diffusion=$build/examples/train_diffusion
cores=$(nproc)
batch=2
lora_r=16
lora_alpha=16
lora_targets=to_q,to_k,to_v,to_out.0
read -r -a rank_list <<< "${DTRAIN_DIFFUSION_BENCH_RANKS:-2 1}"
read -r -a modes <<< "${DTRAIN_DIFFUSION_BENCH_MODES:-lora full}"
((smoke)) && rank_list=(2)
for n in "${rank_list[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_diffusion_bench.sh: DTRAIN_DIFFUSION_BENCH_RANKS takes rank counts, not '$n'" >&2; exit 2; }
done
for m in "${modes[@]}"; do
  [[ $m == lora || $m == full ]] || { echo "run_diffusion_bench.sh: DTRAIN_DIFFUSION_BENCH_MODES takes lora and full, not '$m'" >&2; exit 2; }
done

bench_build "" dtrain-run train_diffusion
bench_need "$launcher" "$train_diffusion"
bench_peer_python torch2  # empty in --smoke: the peer needs the PyPI venv
impls=(dtrain)
[[ -n $peer_python ]] && impls+=(peer)
# The UNet and the records are made by diffusers: the peer's python, or in
# a smoke run the tests' venv of the same set where it exists.
python=$peer_python
if [[ -z $python ]]; then
  python=$build/python/torch2/bin/python
  if ! [[ -x $python ]] || ! "$python" -c "import diffusers, safetensors" 2> /dev/null; then
    bench_skip "no venv with diffusers in $build/python/torch2 (the pinned torch2 set: scripts/python_env.sh)"
  fi
fi

load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)  # before this script's own processes: the others'
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
logged "$work/model.log" "$python" "$repo/bench/diffusion/make_unet.py" "$work" --size $size --records $records

# run_one MODE IMPL RANKS REPEAT: one side in one mode and layout, its files
# named <mode>.<ranks>x<threads>.<impl>.<repeat> (bench/diffusion/summarize_diffusion.py reads them).
run_one() {
  local mode=$1 impl=$2 n=$3 i=$4
  local base=$work/$mode.${n}x$((cores / n > 0 ? cores / n : 1)).$impl.$i
  local lora=()
  if [[ $impl == peer ]]; then
    [[ $mode == lora ]] && lora=(--lora-r "$lora_r" --lora-alpha "$lora_alpha" --lora-targets "$lora_targets")
    launch "$n" "$base.log" "$peer_python" "$repo/bench/diffusion/torch_ddp_diffusion.py" --model "$work/unet" \
      --data "$work/records.safetensors" --batch-size $batch --steps "$steps" --warmup $warmup --lr 1e-4 \
      --weight-decay 1e-2 --json "$base.json" "${lora[@]}"
  else
    [[ $mode == lora ]] && lora=("lora_r=$lora_r" "lora_alpha=$lora_alpha" "lora_targets=$lora_targets")
    launch "$n" "$base.log" "$train_diffusion" model="$work/unet" data="$work/records.safetensors" "${lora[@]}" \
      batch_size=$batch steps="$steps" strategy=ddp precision=fp32 optimizer=adamw lr=1e-4 weight_decay=1e-2 \
      no_decay=false clip=0 objective=eps timestep_sampling=uniform snr_gamma=0 noise_offset=0 drop_text=0 \
      eval_batches=0 num_workers=0 log_every="$steps" metrics="$base.jsonl"
  fi
}

echo "$steps steps per run, the first $warmup left out of the medians; modes ${modes[*]}; ranks ${rank_list[*]}; sides ${impls[*]}"
for ((i = 1; i <= repeat; i++)); do
  order=("${impls[@]}")
  if ((i % 2 == 0)); then
    order=()
    for ((k = ${#impls[@]} - 1; k >= 0; k--)); do order+=("${impls[k]}"); done
  fi
  for mode in "${modes[@]}"; do
    for n in "${rank_list[@]}"; do
      echo "run $i/$repeat: $mode, $n rank(s) x $((cores / n > 0 ? cores / n : 1)) thread(s): ${order[*]}"
      for impl in "${order[@]}"; do run_one "$mode" "$impl" "$n" "$i"; done
    done
  done
done

layouts=()
for n in "${rank_list[@]}"; do layouts+=("${n}x$((cores / n > 0 ? cores / n : 1))"); done
mkdir -p "$(dirname "$json")"
/usr/bin/python3 "$repo/bench/diffusion/summarize_diffusion.py" "$work" --modes "$(IFS=,; echo "${modes[*]}")" \
  --layouts "$(IFS=,; echo "${layouts[*]}")" --repeat "$repeat" --warmup $warmup \
  --impls "$(IFS=,; echo "${impls[*]}")" --cores "$cores" --batch $batch --steps "$steps" --lora-r $lora_r \
  --lora-alpha $lora_alpha --lora-targets $lora_targets --load-at-start "$load_at_start" --json "$json"
bench_check_json
