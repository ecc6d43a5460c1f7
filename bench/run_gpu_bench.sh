#!/usr/bin/env bash
# GPU benchmarks, dtrain against PyTorch on the same GPU in the same run
# (docs/performance.md, "On a GPU"). Needs a CUDA build and a python3 whose
# torch sees the GPU (scripts/gpu_check.sh runs this as its bench stage).
# usage: bench/run_gpu_bench.sh [BUILD_DIR] [--repeat N] [--json PATH]
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
# (default bench/results/gpu.json).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
bench_args gpu.json "$@"
launcher=$build/tools/dtrain-run
python=${DTRAIN_PYTHON:-python3}  # the one whose torch sees the GPU (as the tests name it)
cores=$(nproc)

DTRAIN_BUILD_DIR=$build "$repo/scripts/setup.sh" dtrain-run train_mlp train_gpt bench_gpu_kernels > /dev/null
[[ -x $build/bench/gpu/bench_gpu_kernels ]] ||
  { echo "run_gpu_bench.sh: no bench_gpu_kernels in $build: configure with CUDA (DTRAIN_CUDA=ON)" >&2; exit 1; }
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
  { echo "run_gpu_bench.sh: $python's torch sees no GPU: set DTRAIN_PYTHON to one that does" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "(a) kernels: dtrain, then PyTorch..."
logged "$work/kernels_dtrain.log" "$build/bench/gpu/bench_gpu_kernels" --json "$work/kernels_dtrain.json"
logged "$work/kernels_torch.log" "$python" "$repo/bench/gpu/torch_kernels_cuda.py" --json "$work/kernels_torch.json"

mlp_steps=300
gpt_steps=60
gpt=(n_layer=6 n_embd=384 n_head=6 block_size=256 batch_size=16)
launch 1 "$work/vocab.log" "$build/examples/train_gpt" "${gpt[@]}" steps=1 num_workers=0 eval_batches=0 device=cuda
vocab=$(sed -n 's/.*vocabulary \([0-9][0-9]*\).*/\1/p' "$work/vocab.log" | head -n 1)
[[ -n $vocab ]] || { cat "$work/vocab.log" >&2; echo "run_gpu_bench.sh: no 'vocabulary V' from train_gpt" >&2; exit 1; }

for ((i = 1; i <= repeat; i++)); do
  echo "run $i/$repeat: (b) train_mlp and PyTorch, bf16 and fp32; (c) train_gpt and PyTorch, bf16..."
  for prec in bf16 fp32; do
    launch 1 "$work/mlp.dtrain.$prec.$i.log" "$build/examples/train_mlp" device=cuda strategy=ddp precision=$prec \
      hidden=1024,1024,1024 batch_size=256 samples=65536 optimizer=adamw lr=0.001 weight_decay=0 \
      steps=$mlp_steps num_workers=0 log_every=100 metrics="$work/mlp.dtrain.$prec.$i.jsonl"
    launch 1 "$work/mlp.torch.$prec.$i.log" "$python" "$repo/bench/training/torch_ddp_mlp.py" --device cuda \
      --precision $prec --hidden 1024,1024,1024 --batch-size 256 --samples 65536 --steps $mlp_steps --warmup 20 \
      --json "$work/mlp.torch.$prec.$i.json"
  done
  launch 1 "$work/gpt.dtrain.bf16.$i.log" "$build/examples/train_gpt" "${gpt[@]}" device=cuda strategy=ddp \
    precision=bf16 optimizer=adamw lr=0.001 weight_decay=0 clip=0 schedule=constant warmup_steps=0 \
    steps=$gpt_steps num_workers=0 eval_batches=0 log_every=20 metrics="$work/gpt.dtrain.bf16.$i.jsonl"
  launch 1 "$work/gpt.torch.bf16.$i.log" "$python" "$repo/bench/gpt/torch_ddp_gpt.py" --device cuda \
    --precision bf16 --vocab "$vocab" --n-layer 6 --n-embd 384 --n-head 6 --block-size 256 --batch-size 16 \
    --steps $gpt_steps --warmup 10 --json "$work/gpt.torch.bf16.$i.json"
done

"$python" "$repo/bench/gpu/summarize.py" "$work" --repeat "$repeat" --mlp-warmup 20 --gpt-warmup 10 \
  --vocab "$vocab" --json "$json"
