#!/usr/bin/env bash
# GPU benchmarks, dtrain against PyTorch on the same GPU in the same run
# (docs/performance.md, "On a GPU"). Needs a CUDA build and a python3 whose
# torch sees the GPU (scripts/gpu_check.sh runs this as its bench stage).
# usage: bench/run_gpu_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]
#
#  (a) bench_gpu_kernels against bench/gpu/torch_kernels_cuda.py: the fused
#      AdamW pass at 10M and 100M fp32 parameters, the fp32 -> bf16 cast, the
#      fp16 unscale with its non-finite check and the gradient norm, each as a
#      share of the copy bandwidth measured in the same process.
#  (b) train_mlp device=cuda (hidden [1024, 1024, 1024], GELU, batch 256,
#      AdamW, bf16 and fp32) against bench/training/torch_ddp_mlp.py --device
#      cuda, both at world size 1 through dtrain-run (NCCL), 300 steps.
#  (c) train_gpt device=cuda (6 layers, d 384, 6 heads, block 256, batch 16,
#      bf16, AdamW) against bench/gpt/torch_ddp_gpt.py --device cuda, 60 steps.
# (b) and (c) alternate the two implementations N times (default 3); each run
# reports rank 0's median step after the warm-up, the tables the median of
# the N runs. bench/gpu/summarize.py prints the tables and writes the JSON
# (default bench/results/gpu.json). --no-setup: use BUILD_DIR as it is.
# --smoke (bench/lib.sh): 1M-element kernels, a few steps of small models,
# one run, the JSON in a temporary folder; without a GPU (or a CUDA build)
# it exits 77, which CTest reports as skipped.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/run_gpu_bench.sh [BUILD_DIR] [--repeat N] [--json PATH] [--no-setup] [--smoke]"
build=build
repeat=3
json=$repo/bench/results/gpu.json
setup=1
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_options "$usage" "$@"
launcher=$build/tools/dtrain-run
python=${DTRAIN_PYTHON:-python3}  # the one whose torch sees the GPU (as the tests name it)
cores=$(nproc)
kernels=()  # the benches' own defaults: 10M and 100M elements
mlp_steps=300
mlp_warmup=20
mlp_hidden=1024,1024,1024
mlp_batch=256
mlp_samples=65536
gpt_steps=60
gpt_warmup=10
gpt_layers=6
gpt_embd=384
gpt_heads=6
gpt_block=256
gpt_batch=16
if ((smoke)); then
  kernels=(--sizes-m 1 --iters 2)
  mlp_steps=5
  mlp_warmup=1
  mlp_hidden=64,64
  mlp_batch=32
  mlp_samples=1024
  gpt_steps=3
  gpt_warmup=1
  gpt_layers=1
  gpt_embd=64
  gpt_heads=2
  gpt_block=32
  gpt_batch=2
fi
gpt=("n_layer=$gpt_layers" "n_embd=$gpt_embd" "n_head=$gpt_heads" "block_size=$gpt_block" "batch_size=$gpt_batch")

# No GPU here (or no torch that sees one): a smoke run is skipped (77) before
# it builds anything, a full run fails.
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  bench_skip "no GPU that $python's torch sees (DTRAIN_PYTHON names the python to use)"
fi
bench_build "" dtrain-run train_mlp train_gpt bench_gpu_kernels
[[ -x $build/bench/gpu/bench_gpu_kernels ]] ||
  bench_skip "no bench_gpu_kernels in $build: configure with CUDA (DTRAIN_CUDA=ON)"
bench_need "$launcher" "$build/examples/train_mlp" "$build/examples/train_gpt"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "(a) kernels: dtrain, then PyTorch..."
logged "$work/kernels_dtrain.log" "$build/bench/gpu/bench_gpu_kernels" "${kernels[@]}" \
  --json "$work/kernels_dtrain.json"
logged "$work/kernels_torch.log" "$python" "$repo/bench/gpu/torch_kernels_cuda.py" "${kernels[@]}" \
  --json "$work/kernels_torch.json"

launch 1 "$work/vocab.log" "$build/examples/train_gpt" "${gpt[@]}" steps=1 num_workers=0 eval_batches=0 device=cuda
vocab=$(sed -n 's/.*vocabulary \([0-9][0-9]*\).*/\1/p' "$work/vocab.log" | head -n 1)
[[ -n $vocab ]] || { cat "$work/vocab.log" >&2; echo "run_gpu_bench.sh: no 'vocabulary V' from train_gpt" >&2; exit 1; }

for ((i = 1; i <= repeat; i++)); do
  echo "run $i/$repeat: (b) train_mlp and PyTorch, bf16 and fp32; (c) train_gpt and PyTorch, bf16..."
  for prec in bf16 fp32; do
    launch 1 "$work/mlp.dtrain.$prec.$i.log" "$build/examples/train_mlp" device=cuda strategy=ddp precision=$prec \
      hidden=$mlp_hidden batch_size=$mlp_batch samples=$mlp_samples optimizer=adamw lr=0.001 weight_decay=0 \
      steps=$mlp_steps num_workers=0 log_every=100 metrics="$work/mlp.dtrain.$prec.$i.jsonl"
    launch 1 "$work/mlp.torch.$prec.$i.log" "$python" "$repo/bench/training/torch_ddp_mlp.py" --device cuda \
      --precision $prec --hidden $mlp_hidden --batch-size $mlp_batch --samples $mlp_samples --steps $mlp_steps \
      --warmup $mlp_warmup --json "$work/mlp.torch.$prec.$i.json"
  done
  launch 1 "$work/gpt.dtrain.bf16.$i.log" "$build/examples/train_gpt" "${gpt[@]}" device=cuda strategy=ddp \
    precision=bf16 optimizer=adamw lr=0.001 weight_decay=0 clip=0 schedule=constant warmup_steps=0 \
    steps=$gpt_steps num_workers=0 eval_batches=0 log_every=20 metrics="$work/gpt.dtrain.bf16.$i.jsonl"
  launch 1 "$work/gpt.torch.bf16.$i.log" "$python" "$repo/bench/gpt/torch_ddp_gpt.py" --device cuda \
    --precision bf16 --vocab "$vocab" --n-layer $gpt_layers --n-embd $gpt_embd --n-head $gpt_heads \
    --block-size $gpt_block --batch-size $gpt_batch --steps $gpt_steps --warmup $gpt_warmup \
    --json "$work/gpt.torch.bf16.$i.json"
done

mkdir -p "$(dirname "$json")"
"$python" "$repo/bench/gpu/summarize.py" "$work" --repeat "$repeat" --mlp-warmup $mlp_warmup \
  --gpt-warmup $gpt_warmup --vocab "$vocab" --json "$json" \
  --mlp-config "hidden $mlp_hidden, GELU, batch $mlp_batch, AdamW, $mlp_steps steps, warm-up $mlp_warmup" \
  --gpt-config "$gpt_layers layers, d $gpt_embd, $gpt_heads heads, block $gpt_block, batch $gpt_batch, AdamW, $gpt_steps steps, warm-up $gpt_warmup"
bench_check_json
